"""The time engine: one-off and repeating schedules in the user's zone (pure, no I/O).

See docs/time.md for the rules (DST gaps and folds), the canonical form and the grammar.
"""

from reminders_svc.schedule.build import (
    one_off_instant,
    one_off_local,
    parse_local_datetime,
    parse_rrule,
)
from reminders_svc.schedule.describe import describe
from reminders_svc.schedule.errors import ScheduleError
from reminders_svc.schedule.expand import (
    HORIZON_YEARS,
    latest_at_or_before,
    named_at,
    next_after,
    occurrences,
    validate_new,
)
from reminders_svc.schedule.grammar import parse_repeat
from reminders_svc.schedule.model import OneOff, Repeat, Schedule
from reminders_svc.schedule.zones import check_year, load_zone, to_utc, tzdata_version

__all__ = [
    "HORIZON_YEARS",
    "OneOff",
    "Repeat",
    "Schedule",
    "ScheduleError",
    "check_year",
    "describe",
    "latest_at_or_before",
    "load_zone",
    "named_at",
    "next_after",
    "occurrences",
    "one_off_instant",
    "one_off_local",
    "parse_local_datetime",
    "parse_repeat",
    "parse_rrule",
    "to_utc",
    "tzdata_version",
    "validate_new",
]
