"""The one error type of the time engine."""

from __future__ import annotations


class ScheduleError(ValueError):
    """Bad schedule input. ``field`` names the input at fault (e.g. "zone", "rrule")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
