"""Schedule values: what a reminder stores about when it rings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class OneOff:
    """Rings once: at a local wall time in ``zone`` or at an absolute UTC ``instant``.

    Exactly one of ``local`` and ``instant`` is set; with an instant, ``zone`` is still
    the user's zone, used for display.
    """

    zone: str
    local: datetime | None  # naive wall time, whole seconds
    instant: datetime | None  # aware UTC, whole seconds


@dataclass(frozen=True)
class Repeat:
    """The canonical stored form of a repeating schedule.

    ``rrule`` is canonical RRULE text without DTSTART (COUNT/UNTIL inside, UNTIL in UTC);
    ``start`` is the naive local DTSTART in ``zone``, whole minutes; COUNT, UNTIL and
    INTERVAL count from it.
    """

    rrule: str
    zone: str
    start: datetime


Schedule = OneOff | Repeat
