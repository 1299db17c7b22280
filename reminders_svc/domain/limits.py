"""What one user's request may ask for: text length, active reminders, page and snooze
sizes. Pure values and checks; the API reads the configurable ones at startup."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from reminders_svc.domain.errors import InvalidArgument, QuotaExceeded

# The most rows of a user's partition one List call reads (rows the filter skips and
# deleted ones, kept 30 days, included), so a call's cost is bounded whatever the
# partition holds. It exceeds the largest page (500) with its look-ahead row.
LIST_SCAN_ROWS = 2000


@dataclass(frozen=True)
class Limits:
    max_text_chars: int = 500
    max_active_per_user: int = 5000
    max_page_size: int = 500
    default_page_size: int = 50
    # The shortest snooze (the contract's minute); end-to-end tests lower it so a snooze
    # rings within seconds instead of a minute.
    min_snooze: timedelta = timedelta(minutes=1)
    max_snooze: timedelta = timedelta(days=7)
    max_message_bytes: int = 64 * 1024
    list_scan_rows: int = LIST_SCAN_ROWS
    # A List page is cut short (with a token) past this many bytes: half a client's default
    # 4 MiB receive limit, which 500 reminders of the longest texts and rules come within
    # 7% of.
    max_page_bytes: int = 2 * 1024 * 1024

    @property
    def snooze_range(self) -> str:
        """The snoozes allowed, as a refusal says them: "1 minute to 7 days"."""
        return f"{_spoken(self.min_snooze)} to {_spoken(self.max_snooze)}"

    def check_snooze(self, span: timedelta, field: str, *, retried: bool = False) -> None:
        """A snooze `span` from now, else InvalidArgument on `field`. `retried`: a snooze
        to an instant, which may be the retry of one that landed (its span shrinks as time
        goes by): only one already reached, or too far, is refused."""
        long_enough = span > timedelta(0) if retried else span >= self.min_snooze
        if not (long_enough and span <= self.max_snooze):
            raise InvalidArgument(field, f"must be {self.snooze_range} from now")

    def check_text(self, text: str, field: str = "reminder.text") -> str:
        """A reminder's text, else InvalidArgument on `field`."""
        if not text.strip():
            raise InvalidArgument(field, "must not be empty")
        if len(text) > self.max_text_chars:
            raise InvalidArgument(field, f"at most {self.max_text_chars} characters")
        return text


def span_to(until: datetime, now: datetime) -> timedelta:
    """How far ahead `until`, a time a caller snoozes to (an instant or a local time, both
    whole seconds), is at `now`: counted from the whole second `now` is in. A client builds
    "in a minute" as its clock's current second plus 60 s; counted from `now` itself, the
    milliseconds past that second (and the trip here) made it short of the minimum. Never
    early either way: the ring is at `until`, not at `now` plus the span."""
    return until - now.replace(microsecond=0)


def _spoken(span: timedelta) -> str:
    seconds = span.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}" if count == 1 else f"{count} {unit}s"
    return f"{seconds:g} seconds"


def over_the_cap(max_active: int) -> QuotaExceeded:
    """The refusal of a create past the per-user cap of active reminders."""
    return QuotaExceeded(f"at most {max_active} active reminders per user", subject="user")
