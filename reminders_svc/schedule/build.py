"""Building checked schedules from user input."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from datetime import UTC, datetime

from reminders_svc.schedule.errors import ScheduleError
from reminders_svc.schedule.expand import HORIZON_YEARS, check_cost, first_ring
from reminders_svc.schedule.model import OneOff, Repeat
from reminders_svc.schedule.rule import Rule, check_interval, check_ordinals, parse_rule_text
from reminders_svc.schedule.zones import (
    check_year,
    load_place,
    load_zone,
    rings_at,
    round_up,
    to_local,
    to_utc_in,
)


def quoted(text: str, longest: int = 60) -> str:
    """`text` quoted for an error message, shortened: an error must stay small, whatever
    the input it quotes."""
    shown = repr(text)
    return shown if len(shown) <= longest else shown[: longest - 4] + "..." + shown[0]


def _naive(value: datetime, field: str) -> datetime:
    if value.tzinfo is not None:
        raise ScheduleError(field, f"{value.isoformat()} must be a local time without offset")
    check_year(value, field)
    return value


def one_off_local(local: datetime, zone: str) -> OneOff:
    """Rings once at ``local`` wall time (naive) in ``zone``."""
    load_place(zone)
    return OneOff(zone=zone, local=_naive(local, "at").replace(microsecond=0), instant=None)


def one_off_instant(instant: datetime, zone: str = "UTC") -> OneOff:
    """Rings once at an aware ``instant``; ``zone`` is the user's, for display."""
    load_place(zone)
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ScheduleError("at", f"{instant.isoformat()} must be an aware instant")
    check_year(instant, "at")
    return OneOff(zone=zone, local=None, instant=instant.astimezone(UTC).replace(microsecond=0))


def parse_rrule(text: str, zone: str, start: datetime, *, start_given: bool = True) -> Repeat:
    """A repeat from RFC 5545 RRULE text, DTSTART = ``start`` (naive local) in ``zone``
    (see `repeat_from_rule` for a start not given)."""
    rule = parse_rule_text(text, load_place(zone))
    return repeat_from_rule(rule, zone, start, "rrule", start_given=start_given)


def repeat_from_rule(
    rule: Rule, zone: str, start: datetime, field: str, *, start_given: bool = True
) -> Repeat:
    """The canonical Repeat for a parsed rule; ``field`` names the input it came from.

    Without ``start_given`` (``start`` is now's), a rule with an INTERVAL above 1 starts
    at its first match from now instead, so its periods count from the first one that
    rings: "every 2 weeks on Monday", made on a Sunday, rings the next day, where counting
    from now's week skipped it; "every 3 months on the 1st", made on December 8, rings on
    January 1, not March 1. Calendars count from the first occurrence alike."""
    check_ordinals(rule, field)
    check_interval(rule, field)
    if not start_given and rule.interval > 1:
        anchored = _from_first_match(rule, zone, start, field)
        if anchored is not None:
            return anchored
    repeat, _ = _repeat_from(rule, zone, start, field)
    return repeat


def _from_first_match(rule: Rule, zone: str, start: datetime, field: str) -> Repeat | None:
    """The rule started at its first match from `start` (the same rule with INTERVAL=1
    finds it), or None where that cannot be: a match whose wall time does not name it
    (moved by a clock change: in a gap, or a repeated hour's second pass), or none found
    within the search's steps, which keep the count from `start`. Where INTERVAL=1 never
    rings, the rule (some of its periods) never does: refused at once, not searched
    again counted from `start`."""
    zone_info = load_zone(zone)
    begin = round_up(_naive(start, "start"), "minute")
    if rings_at(begin, zone_info) != begin:
        # The start's own wall time is skipped by a clock change: the time of day it
        # lends the rule would move with the anchor (02:00 made 03:00 for good).
        return None
    # Without COUNT, which no more than bounds the series after its first ring.
    every_period = _checked(dataclasses.replace(rule, interval=1, count=None), zone, begin)
    try:
        first = first_ring(every_period)
    except ScheduleError:  # too sparse for the steps: the rule's own walk skips periods
        return None
    if first is None:
        raise _never_occurs(rule, field)
    local = to_local(first, zone_info).replace(fold=0)
    try:
        anchored, anchored_first = _repeat_from(rule, zone, local, field)
    except ScheduleError:  # its COUNT's walk from there: counted from `start` it may pass
        return None
    return anchored if anchored_first == first else None


def _checked(rule: Rule, zone: str, start: datetime) -> Repeat:
    """The Repeat, if its end is not before its start and its expansion costs little
    (`check_cost`); it may still never ring."""
    zone_info = load_zone(zone)
    # Reminders ring on whole minutes; a start within a minute begins at its end, so no
    # ring is before the start given (rounded down, 12:00:30 lost a 12:00 COUNT=1 ring).
    start = round_up(_naive(start, "start"), "minute")
    if rule.until is not None and rule.until < to_utc_in(start, zone_info):
        # Both in local time, as the caller wrote them (an end date means its day's end).
        until = to_local(rule.until, zone_info)
        raise ScheduleError(
            "until",
            f"end {until:%Y-%m-%dT%H:%M:%S} ({rule.until:%Y-%m-%dT%H:%M:%SZ}) is before the"
            f" start {start.isoformat()}, {zone}",
        )
    check_cost(rule, zone, start)
    return Repeat(rrule=rule.text(), zone=zone, start=start)


def _repeat_from(rule: Rule, zone: str, start: datetime, field: str) -> tuple[Repeat, datetime]:
    """The Repeat and its first ring; ScheduleError if it never rings."""
    repeat = _checked(rule, zone, start)
    first = first_ring(repeat)
    if first is None:
        raise _never_occurs(rule, field)
    return repeat, first


def _never_occurs(rule: Rule, field: str) -> ScheduleError:
    if rule.until is not None or rule.count is not None:
        return ScheduleError(field, "never occurs between the start and its end")
    return ScheduleError(
        field, f"never occurs: no occurrence within {HORIZON_YEARS} years of the start"
    )


# A wall time as RFC 3339 writes one, without its offset: date, "T", time to the minute or
# second. Python's parser takes more (a date alone, a fraction, week dates, other digits),
# each of which would be read silently: a date picker that lost its time rang at midnight.
_LOCAL_DATETIME = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?(?P<offset>Z|[+-].+)?", re.ASCII
)


def parse_local_datetime(text: str, field: str) -> datetime:
    """A local wall time without an offset: `2026-11-01T01:30` or `2026-11-01T01:30:00`."""
    form = _LOCAL_DATETIME.fullmatch(text)
    if form is not None and form["offset"]:
        raise ScheduleError(field, f"{quoted(text)} must be a local time without offset")
    value = None
    if form is not None:
        with contextlib.suppress(ValueError):  # a date that does not exist (Feb 30)
            value = datetime.fromisoformat(text)
    if value is None:
        raise ScheduleError(field, f"{quoted(text)} is not a local date-time YYYY-MM-DDTHH:MM[:SS]")
    check_year(value, field)
    return value
