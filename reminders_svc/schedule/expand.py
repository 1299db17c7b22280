"""Expanding schedules into UTC rings.

Repeats are expanded in naive local wall time (periods, BYxxx parts, BYSETPOS, INTERVAL
counted from the start), then each local time is mapped to UTC by zones.to_utc_in; the
rings are those instants in increasing order, two local times mapping to one instant
ringing once.

Bounds: a search looks at most HORIZON_YEARS ahead, and spends at most STEP_BUDGET
steps per ring found; exceeding the budget is a ScheduleError, never an endless loop. A
caller expanding many rings at once (a preview) also caps the steps of the whole call.
"""

from __future__ import annotations

import calendar
import functools
import heapq
import itertools
import math
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import MAXYEAR, UTC, date, datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from reminders_svc.schedule.errors import ScheduleError
from reminders_svc.schedule.model import OneOff, Repeat, Schedule
from reminders_svc.schedule.rule import Freq, Rule, parse_rule_text
from reminders_svc.schedule.zones import (
    MAX_YEAR,
    load_zone,
    to_local,
    to_utc_in,
    to_utc_marking_gaps,
)

HORIZON_YEARS = 400
STEP_BUDGET = 20_000
# The longest gap in the tz database is a whole day (Pacific/Apia, 2011-12-30): local
# times that far before a point can still map after it, so resuming starts this early.
_RESUME_MARGIN = timedelta(days=3)
_CALENDAR_END = date(MAXYEAR, 12, 31)
# The latest instant a search may start from (see zones.MAX_YEAR).
_LAST_SEARCHED = datetime(MAX_YEAR, 12, 31, tzinfo=UTC)


class _OverCallBudget(Exception):
    """The steps or the work a whole call may spend ran out (see `occurrences`' `max_steps`
    and `check_cost`)."""


class _Budget:
    """Counts expansion steps; pathological rules fail fast instead of spinning.

    `steps` counts since the last ring found (reset by the walk); `total` the whole call's,
    capped by `total_limit` when one is set; `work` the CPU time the call spends, in units
    of about a microsecond (`_Plan.day_work`, `_Plan.candidate_work`, `_RING_WORK`), capped
    by `work_limit` when one is set."""

    def __init__(self, total_limit: int | None = None, work_limit: int | None = None) -> None:
        self.steps = 0
        self.total = 0
        self.work = 0
        self.total_limit = total_limit
        self.work_limit = work_limit

    def spend(self, work: int) -> None:
        """One expansion step (a day or a candidate time of a day) costing `work`."""
        self.steps += 1
        self.total += 1
        if self.steps > STEP_BUDGET:
            raise ScheduleError(
                "rrule", f"too sparse: no occurrence found within {STEP_BUDGET} steps"
            )
        if self.total_limit is not None and self.total > self.total_limit:
            raise _OverCallBudget
        self.charge(work)

    def charge(self, work: int) -> None:
        """Work besides the expansion steps (a local time mapped to UTC)."""
        self.work += work
        if self.work_limit is not None and self.work > self.work_limit:
            raise _OverCallBudget


@dataclass(frozen=True)
class _Plan:
    """A rule with the defaults RFC 5545 takes from DTSTART filled in."""

    rule: Rule
    start: datetime
    months: frozenset[int]  # empty: every month
    month_days: frozenset[int]  # empty: every day; negative counts from the month's end
    weekdays: frozenset[int]  # plain BYDAY weekdays
    nth_weekdays: frozenset[tuple[int, int]]  # (weekday, ordinal) from BYDAY
    ordinals_in_year: bool  # YEARLY without BYMONTH: "20MO" is the year's 20th Monday
    hours: tuple[int, ...]
    minute: int
    # What the walk spends on a day looked at and on a candidate time (see MAX_COUNT_WORK).
    day_work: int
    candidate_work: int
    # The kept days of a month, by (month, leap year, weekday of January 1), and by the
    # shape they depend on (fewer: counting a period's candidates looks at all of them).
    _days_cache: dict[tuple[int, bool, int], tuple[int, ...]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    _shape_cache: dict[_MonthShape, tuple[int, ...]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    @property
    def filters_by_day(self) -> bool:
        return bool(self.weekdays or self.nth_weekdays)

    def days_in_month(self, year: int, month: int) -> tuple[int, ...]:
        """The month's days passing BYMONTHDAY and BYDAY, cached by calendar shape."""
        key = (month, calendar.isleap(year), date(year, 1, 1).weekday())
        days = self._days_cache.get(key)
        if days is None:
            first_weekday, length = calendar.monthrange(year, month)
            if self.ordinals_in_year and self.nth_weekdays:
                days_before = date(year, month, 1).toordinal() - date(year, 1, 1).toordinal()
                shape = _MonthShape(first_weekday, length, days_before, 365 + calendar.isleap(year))
            else:  # the rest counts in the month alone
                shape = _MonthShape(first_weekday, length)
            days = self._shape_cache.get(shape)
            if days is None:
                days = tuple(day for day in range(1, length + 1) if self._keeps(shape, day))
                self._shape_cache[shape] = days
            self._days_cache[key] = days
        return days

    def _keeps(self, shape: _MonthShape, day: int) -> bool:
        if self.month_days and not self.month_days & {day, day - shape.length - 1}:
            return False
        if not self.filters_by_day:
            return True
        weekday = (shape.first_weekday + day - 1) % 7
        if weekday in self.weekdays:
            return True
        if self.ordinals_in_year:
            position, period_length = shape.days_before + day, shape.year_length
        else:
            position, period_length = day, shape.length
        from_start = (position - 1) // 7 + 1
        from_end = -((period_length - position) // 7 + 1)
        return bool(self.nth_weekdays & {(weekday, from_start), (weekday, from_end)})


class _MonthShape(NamedTuple):
    """What a month's kept days depend on: its first weekday and length, and where BYDAY
    ordinals count in the year, the days of the year before it and the year's length."""

    first_weekday: int
    length: int
    days_before: int = 0
    year_length: int = 0


def make_plan(rule: Rule, start: datetime) -> _Plan:
    months, month_days = set(rule.by_month), set(rule.by_month_day)
    weekdays = {entry.weekday for entry in rule.by_day if entry.ordinal is None}
    if rule.freq is Freq.YEARLY and not (rule.by_month_day or rule.by_day):
        months = months or {start.month}
        month_days = {start.day}
    elif rule.freq is Freq.MONTHLY and not (rule.by_month_day or rule.by_day):
        month_days = {start.day}
    elif rule.freq is Freq.WEEKLY and not rule.by_day:
        weekdays = {start.weekday()}
    every_hour = tuple(range(24)) if rule.freq is Freq.HOURLY else (start.hour,)
    hours = rule.by_hour or every_hour
    return _Plan(
        rule=rule,
        start=start,
        months=frozenset(months),
        month_days=frozenset(month_days),
        weekdays=frozenset(weekdays),
        nth_weekdays=frozenset(
            (entry.weekday, entry.ordinal) for entry in rule.by_day if entry.ordinal is not None
        ),
        ordinals_in_year=rule.freq is Freq.YEARLY and not rule.by_month,
        hours=hours,
        minute=rule.by_minute[0] if rule.by_minute else start.minute,
        day_work=(
            _HOURLY_DAY_WORK + len(hours) // 12
            if rule.freq is Freq.HOURLY and rule.interval > 1
            else _DAY_WORK
        ),
        candidate_work=_SET_CANDIDATE_WORK if rule.by_set_pos else _CANDIDATE_WORK,
    )


# BYSETPOS picks from every candidate time of a period, each built before the pick: a
# period may hold at most this many (a year of days at one time), so that finding one ring
# costs a few milliseconds.
MAX_SET_CANDIDATES = 366

# A COUNT series is walked from its start at every search (a create walks it up to three
# times: the check, the first ring, the next; a page shows each paused one's next ring), so
# a new one may cost at most this much work to walk to its count, in units of about a
# microsecond of CPU, each kind weighted by what it cost. Measured on a 2-core VM,
# 2026-12-07, Python 3.11: walks at the limit took 4.0-5.3 ms (to ~7 ms while the machine
# was busy), `FREQ=DAILY;COUNT=1000` 4.2 ms (1,000 rings cost ~2.3 ms alone), each with
#   python -m timeit -s "from datetime import datetime, UTC; from reminders_svc.schedule
#   import Repeat, next_after; r = Repeat('FREQ=DAILY;INTERVAL=2;COUNT=855;BYDAY=TU,WE,TH',
#   'America/New_York', datetime(1950, 1, 1, 9)); t = datetime(8000, 1, 1, tzinfo=UTC)"
#   "next_after(r, t)"
# Until 2026-12-07 steps were counted alone (a day or a candidate time, to 10,000), and no
# UTC mapping: HOURLY;INTERVAL=47;BYHOUR=1;COUNT=400 from 1976, ~3 us a day, took 29-44 ms.
MAX_COUNT_WORK = 5_500
_DAY_WORK = 2  # a day looked at: aligned to INTERVAL, its month's kept days looked up
# A day of HOURLY with INTERVAL above 1: its aligned hours worked out, 1 more a 12 hours.
_HOURLY_DAY_WORK = 4
_CANDIDATE_WORK = 1  # a candidate time of a day
_SET_CANDIDATE_WORK = 3  # one sorted into its period for BYSETPOS to pick from
_RING_WORK = 2  # a local time mapped to UTC (`to_utc_marking_gaps`)


# Years of every calendar shape (leap or not, beginning on each weekday): a Gregorian
# cycle of 28 between century years.
_EVERY_YEAR_SHAPE = range(2001, 2029)
_PERIOD_NAMES = {
    Freq.YEARLY: "a year",
    Freq.MONTHLY: "a month",
    Freq.WEEKLY: "a week",
    Freq.DAILY: "a day",
    Freq.HOURLY: "an hour",
}


def most_times_in_period(plan: _Plan) -> int:
    """The most candidate times a period of the rule holds (those BYSETPOS picks among),
    counted: its kept days (BYMONTH, BYMONTHDAY, BYDAY) in the period of each calendar
    shape, times its hours. Estimated from the period's length alone, BYSETPOS=2 of a
    weekly BYDAY=FR looked possible and was walked for 400 years."""
    freq = plan.rule.freq
    if freq is Freq.HOURLY:
        return 1
    if freq is Freq.DAILY:
        return len(plan.hours)
    if freq is Freq.WEEKLY:
        return len(plan.weekdays) * len(plan.hours)  # every month holds a whole week
    months = sorted(plan.months) or range(1, 13)
    counts = [
        [len(plan.days_in_month(year, month)) for month in months] for year in _EVERY_YEAR_SHAPE
    ]
    days = max(map(max if freq is Freq.MONTHLY else sum, counts))
    return days * len(plan.hours)


def check_cost(rule: Rule, zone: str, start: datetime) -> None:
    """Refuse, at once, a new rule whose expansion would cost too much: BYSETPOS over more
    candidate times per period than `MAX_SET_CANDIDATES`, positions past the most a period
    can hold (which never pick anything), or a COUNT series whose walk from its start
    (made at every search) takes over `MAX_COUNT_WORK`: estimated at once for BYSETPOS,
    then walked for every COUNT rule (a sparse rule started long ago, such as
    HOURLY;INTERVAL=47;BYHOUR=1;COUNT=400 from 1976, cost ~30 ms at every claim, re-arm and
    read of a paused one). Checked when a rule is made, never on a stored one."""
    if not rule.by_set_pos and rule.count is None:
        return  # nothing to estimate or walk: no plan to make
    plan = make_plan(rule, start)
    if rule.by_set_pos:
        _check_set_positions(plan)
    if rule.count is not None:
        _walk_count(Repeat(rrule=rule.text(), zone=zone, start=start), rule.count)


def _check_set_positions(plan: _Plan) -> None:
    rule = plan.rule
    per_period = most_times_in_period(plan)
    if per_period > MAX_SET_CANDIDATES:
        raise ScheduleError(
            "rrule",
            f"BYSETPOS picks from at most {MAX_SET_CANDIDATES} times a period, not up to"
            f" {per_period}: use fewer BYHOUR values, a BYMONTH, or a shorter FREQ",
        )
    if all(abs(position) > per_period for position in rule.by_set_pos):
        positions = ",".join(str(position) for position in rule.by_set_pos)
        raise ScheduleError(
            "rrule",
            f"never occurs: BYSETPOS={positions} but {_PERIOD_NAMES[rule.freq]} holds at most"
            f" {per_period} time{'s' * (per_period != 1)}",
        )
    # A ring a period, each of its candidate times built and the days holding them looked
    # at: a guard at once; the walk in check_cost decides.
    days = math.ceil(per_period / len(plan.hours))
    per_ring = per_period * plan.candidate_work + days * plan.day_work
    if rule.count is not None and rule.count * per_ring > MAX_COUNT_WORK:
        most = max(1, MAX_COUNT_WORK // per_ring)
        raise ScheduleError(
            "rrule",
            f"COUNT with BYSETPOS picking from up to {per_period} times a period: at most"
            f" {most}, or UNTIL",
        )


def _walk_count(repeat: Repeat, count: int) -> None:
    """Walk a COUNT series once, as every search does, within `MAX_COUNT_WORK` (for
    BYSETPOS, the estimate above takes one ring a period, and positions some periods lack,
    a leap year's 366th day, stretch the walk past it, several times over)."""
    found = 0
    try:
        # To the count, however far: a search from a far date (a preview) walks that far.
        budget = _Budget(work_limit=MAX_COUNT_WORK)
        for _ in _repeat_rings(repeat, _LAST_SEARCHED, budget):
            found += 1
    except _OverCallBudget:
        # The walk to the rings found fits: that COUNT from this start is accepted.
        allows = f"COUNT={found} at most" if found else "not one ring"
        raise ScheduleError(
            "rrule",
            f"COUNT={count} costs too much to walk from the start, as every search does:"
            f" from this start the limit allows {allows} (use a smaller COUNT, a later start,"
            " or UNTIL)",
        ) from None


def interval_can_reach(plan: _Plan) -> bool:
    """False when INTERVAL keeps every aligned period off the BYDAY/BYHOUR values.

    Daily steps revisit weekdays with period gcd(INTERVAL, 7); hourly steps revisit
    hours of the week with period gcd(INTERVAL, 168). Catching this up front saves
    walking 400 years of misses.
    """
    step, start = plan.rule.interval, plan.start
    weekdays = (plan.weekdays or set(range(7))) if plan.filters_by_day else set(range(7))
    if plan.rule.freq is Freq.DAILY:
        period = math.gcd(step, 7)
        return any((weekday - start.weekday()) % period == 0 for weekday in weekdays)
    if plan.rule.freq is Freq.HOURLY:
        period = math.gcd(step, 7 * 24)
        start_hour = start.weekday() * 24 + start.hour
        return any(
            (weekday * 24 + hour - start_hour) % period == 0
            for weekday in weekdays
            for hour in plan.hours
        )
    return True


def _week_start(plan: _Plan, day: date) -> int:
    """Ordinal of the first day (per WKST) of the week holding ``day``."""
    return day.toordinal() - (day.weekday() - plan.rule.week_start) % 7


def _next_aligned_day(plan: _Plan, day: date) -> date | None:
    """The first day at or after ``day`` inside a period that INTERVAL selects."""
    step, start = plan.rule.interval, plan.start
    if step == 1:
        return day
    freq = plan.rule.freq
    if freq is Freq.YEARLY:
        year = day.year + (start.year - day.year) % step
        return day if year == day.year else _day_or_none(year, 1, 1)
    if freq is Freq.MONTHLY:
        index = day.year * 12 + day.month - 1
        index += (start.year * 12 + start.month - 1 - index) % step
        year, month_index = divmod(index, 12)
        aligned = (year, month_index + 1)
        return day if aligned == (day.year, day.month) else _day_or_none(year, month_index + 1, 1)
    if freq is Freq.WEEKLY:
        first_week = _week_start(plan, start.date())
        week = (day.toordinal() - first_week) // 7
        skip = -week % step
        ordinal = day.toordinal() if skip == 0 else first_week + 7 * (week + skip)
    elif freq is Freq.DAILY:
        ordinal = day.toordinal() + (start.toordinal() - day.toordinal()) % step
    else:
        hour = (day.toordinal() - start.toordinal()) * 24 - start.hour
        hour += -hour % step
        ordinal = start.toordinal() + (hour + start.hour) // 24
    return date.fromordinal(ordinal) if ordinal <= _CALENDAR_END.toordinal() else None


def _day_or_none(year: int, month: int, day: int) -> date | None:
    return date(year, month, day) if year <= MAXYEAR else None


def aligned_hours(plan: _Plan, day: date) -> list[int]:
    """The day's hours that INTERVAL selects (all of plan.hours above HOURLY)."""
    if plan.rule.freq is not Freq.HOURLY:
        return list(plan.hours)
    base = (day.toordinal() - plan.start.toordinal()) * 24 - plan.start.hour
    return [hour for hour in plan.hours if (base + hour) % plan.rule.interval == 0]


def _raw_local(plan: _Plan, first: date, last: date, budget: _Budget) -> Iterator[datetime]:
    """Local datetimes on days first..last passing INTERVAL and the day/time parts."""
    cursor: date | None = first
    while cursor is not None and cursor <= last:
        budget.spend(plan.day_work)
        cursor = _next_aligned_day(plan, cursor)
        if cursor is None or cursor > last:
            return
        year, month = cursor.year, cursor.month
        if not plan.months or month in plan.months:
            days = plan.days_in_month(year, month)
            index = bisect_left(days, cursor.day)
            if index < len(days) and days[index] == cursor.day:
                on = date(year, month, days[index])
                for hour in aligned_hours(plan, on):
                    budget.spend(plan.candidate_work)  # per candidate: a day may hold 24
                    yield datetime(year, month, on.day, hour, plan.minute)
                cursor = on + timedelta(days=1) if on < _CALENDAR_END else None
                continue
            if index < len(days):
                # Leap to the next kept day; the loop re-aligns it to INTERVAL.
                cursor = date(year, month, days[index])
                continue
        cursor = _day_or_none(year + month // 12, month % 12 + 1, 1)


def _period_key(plan: _Plan, local: datetime) -> tuple[int, ...]:
    freq = plan.rule.freq
    if freq is Freq.YEARLY:
        return (local.year,)
    if freq is Freq.MONTHLY:
        return (local.year, local.month)
    if freq is Freq.WEEKLY:
        return (_week_start(plan, local.date()),)
    if freq is Freq.DAILY:
        return (local.toordinal(),)
    return (local.toordinal(), local.hour)


def _period_first_day(plan: _Plan, day: date) -> date:
    freq = plan.rule.freq
    if freq is Freq.YEARLY:
        return date(day.year, 1, 1)
    if freq is Freq.MONTHLY:
        return date(day.year, day.month, 1)
    if freq is Freq.WEEKLY:
        return date.fromordinal(max(1, _week_start(plan, day)))
    return day


def _select_positions(period: list[datetime], positions: tuple[int, ...]) -> list[datetime]:
    chosen = set()
    for position in positions:
        index = position - 1 if position > 0 else len(period) + position
        if 0 <= index < len(period):
            chosen.add(period[index])
    return sorted(chosen)


def local_occurrences(
    plan: _Plan, lower: datetime, last: date, budget: _Budget
) -> Iterator[datetime]:
    """The rule's local datetimes at or after max(lower, start), on days up to ``last``."""
    lower = max(lower, plan.start)
    if not interval_can_reach(plan):
        return
    positions = plan.rule.by_set_pos
    if not positions:
        raw = _raw_local(plan, lower.date(), last, budget)
        yield from (local for local in raw if local >= lower)
        return
    # BYSETPOS picks from a whole period, so start at its first day and finish it.
    whole_last_period = min(last + timedelta(days=366), _CALENDAR_END)
    raw = _raw_local(plan, _period_first_day(plan, lower.date()), whole_last_period, budget)
    for _, period in itertools.groupby(raw, key=functools.partial(_period_key, plan)):
        for local in _select_positions(list(period), positions):
            if lower <= local and local.date() <= last:
                yield local


@functools.lru_cache(maxsize=4096)
def _compile(repeat: Repeat) -> tuple[ZoneInfo, Rule, _Plan]:
    zone = load_zone(repeat.zone)
    rule = parse_rule_text(repeat.rrule, zone, stored=True)
    return zone, rule, make_plan(rule, repeat.start)


def _horizon(local: datetime) -> date:
    return date(min(local.year + HORIZON_YEARS, MAXYEAR), 12, 31)


def _repeat_rings(
    repeat: Repeat, near: datetime, budget: _Budget | None = None
) -> Iterator[datetime]:
    """The repeat's rings in increasing UTC order, from a little before ``near`` on.

    Callers filter to the exact bound. With COUNT the walk starts at the start, since
    COUNT counts rings from there.
    """
    zone, rule, plan = _compile(repeat)
    near_local = max(to_local(near, zone), repeat.start)
    last = _horizon(near_local)
    if rule.until is not None:
        last = min(last, to_local(rule.until, zone).date() + _RESUME_MARGIN)
    lower = repeat.start if rule.count is not None else near_local - _RESUME_MARGIN
    budget = budget or _Budget()
    previous: datetime | None = None
    rung = 0
    for instant in _in_utc_order(local_occurrences(plan, lower, last, budget), zone, budget):
        if instant == previous:
            continue  # two local times mapping to one instant (a gap-shifted one) ring once
        previous = instant
        if rule.until is not None and instant > rule.until:
            return  # in order: nothing later ends before it
        budget.steps = 0
        yield instant
        rung += 1
        if rung == rule.count:
            return


def _in_utc_order(walk: Iterator[datetime], zone: ZoneInfo, budget: _Budget) -> Iterator[datetime]:
    """The instants of the increasing wall times of `walk`, in increasing order. They keep
    the walk's order except where a time in a gap, shifted forward by it, passes a later
    wall time's instant: a gap longer than the rings' spacing (Antarctica/Troll skips
    two hours; rings at 02:30 and 03:30 map to 04:30 and 03:30). Such an instant is held
    until a wall time that exists maps at or after it, since none after that maps
    earlier."""
    held: list[datetime] = []  # shifted instants, a heap (empty but around a gap)
    for local in walk:
        budget.charge(_RING_WORK)
        instant, shifted = to_utc_marking_gaps(local, zone)
        if shifted:
            heapq.heappush(held, instant)
            continue
        while held and held[0] <= instant:
            yield heapq.heappop(held)
        yield instant
    while held:
        yield heapq.heappop(held)


def _one_off_ring(one_off: OneOff) -> datetime:
    if one_off.instant is not None:
        return one_off.instant
    assert one_off.local is not None
    return to_utc_in(one_off.local, load_zone(one_off.zone))


def _check_instant(instant: datetime, name: str) -> None:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ScheduleError(name, f"{instant.isoformat()} must be an aware instant")


def occurrences(
    schedule: Schedule, after: datetime, limit: int, max_steps: int | None = None
) -> list[datetime]:
    """Up to ``limit`` rings at or after ``after`` (aware), in increasing order.

    ``max_steps`` caps the expansion steps of the whole call (the per-ring budget alone
    lets a dense BYSETPOS rule cost ~1,000 steps a ring): past it, ScheduleError on
    "count", naming how many rings the call found, so the caller can ask for that many.
    """
    _check_instant(after, "from")
    if limit < 0:
        raise ScheduleError("count", f"limit {limit} must not be negative")
    if isinstance(schedule, OneOff):
        ring = _one_off_ring(schedule)
        return [ring] if ring >= after and limit > 0 else []
    found: list[datetime] = []
    if limit == 0:
        return found
    try:
        for ring in _repeat_rings(schedule, after, _Budget(max_steps)):
            if ring >= after:
                found.append(ring)
                if len(found) == limit:
                    break
    except _OverCallBudget:
        if not found:  # with COUNT the walk starts at the start, however far before `after`
            raise ScheduleError(
                "count", "this schedule costs too much to expand this far past its start"
            ) from None
        raise ScheduleError(
            "count",
            f"{limit} rings of this schedule cost too much to expand at once:"
            f" ask for at most {len(found)}",
        ) from None
    return found


def next_after(schedule: Schedule, instant: datetime) -> datetime | None:
    """The first ring strictly after ``instant``; None when the schedule has ended."""
    # Rings fall on whole seconds: the first one after `instant` is at or after the next
    # whole second (`instant` + 1 s would skip a ring less than a second away).
    found = occurrences(schedule, instant.replace(microsecond=0) + timedelta(seconds=1), 1)
    return found[0] if found else None


def latest_at_or_before(schedule: Schedule, since: datetime, instant: datetime) -> datetime | None:
    """The last ring in [``since``, ``instant``] (both aware, inclusive), or None.

    The misfire policy's question: which of the rings missed since ``since`` is the latest?
    It walks forward from ``since``; repeats ring at most hourly, so an outage of N hours
    costs at most N rings.
    """
    _check_instant(since, "from")
    _check_instant(instant, "to")
    if isinstance(schedule, OneOff):
        ring = _one_off_ring(schedule)
        return ring if since <= ring <= instant else None
    latest = None
    for ring in _repeat_rings(schedule, since):
        if ring > instant:
            break
        if ring >= since:
            latest = ring
    return latest


# How far ahead of now the first ring, and of each other the first rings of a repeat, may
# be: a ring's bucket entry lives until its due plus a retention, and Cassandra refuses a
# TTL over 20 years.
MAX_AHEAD = timedelta(days=3653)  # 10 years, whatever their leap days
_SPACING_RINGS = 12


def named_at(schedule: Schedule, now: datetime) -> Schedule:
    """The schedule as meant by a caller naming it at ``now``: itself, but a one-off given as
    a local time of a repeated hour, named after its first instance passed while the second
    is to come, is that second instance, as a snooze to the time is (at 01:10 EST on the
    fall-back night, 01:30 is 20 minutes ahead, not 40 minutes ago: it was refused as
    past). As the instant, every later reading (a replan, the reminder's preview) finds the
    ring it was made for."""
    if not isinstance(schedule, OneOff) or schedule.local is None:
        return schedule
    _check_instant(now, "from")
    zone = load_zone(schedule.zone)
    second = to_utc_in(schedule.local, zone, fold=1)
    if to_utc_in(schedule.local, zone) < now <= second:
        return OneOff(zone=schedule.zone, local=None, instant=second)
    return schedule


def validate_new(schedule: Schedule, now: datetime) -> datetime:
    """The first ring at or after ``now`` of the schedule named at ``now`` (`named_at`), or
    ScheduleError if there is none, if it is more than ``MAX_AHEAD`` away, or if a repeat's
    rings are spaced further apart than that."""
    # The first ring, and a repeat's spacing over its first rings: a sparse rule's gaps
    # need not show in the first two (INTERVAL=25 months in BYMONTH=1,2,3: 2, 2, 21 years).
    found = occurrences(named_at(schedule, now), now, _SPACING_RINGS)
    if found:
        if found[0] - now > MAX_AHEAD:
            field = "at" if isinstance(schedule, OneOff) else "start"
            raise ScheduleError(field, "the first ring must be within 10 years from now")
        # Fewer rings than asked of a series that never ends: the next is past the search's
        # 400 years (FREQ=YEARLY;INTERVAL=401).
        if any(later - ring > MAX_AHEAD for ring, later in itertools.pairwise(found)) or (
            len(found) < _SPACING_RINGS and _never_ends(schedule)
        ):
            raise ScheduleError("rule", "rings must be at most 10 years apart")
        return found[0]
    if isinstance(schedule, OneOff):
        ring = f"{_one_off_ring(schedule):%Y-%m-%dT%H:%M:%SZ}"
        if schedule.local is not None:  # named as the caller wrote it, then in UTC
            ring = f"{schedule.local:%Y-%m-%dT%H:%M:%S} in {schedule.zone} ({ring})"
        raise ScheduleError("at", f"{ring} is in the past")
    raise ScheduleError(
        "repeat", f"no occurrence at or after {now.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    )


def _never_ends(schedule: Schedule) -> bool:
    """A repeat with neither COUNT nor UNTIL: once it rings, it rings again."""
    if isinstance(schedule, OneOff):
        return False
    _, rule, _ = _compile(schedule)
    return rule.count is None and rule.until is None


def first_ring(repeat: Repeat) -> datetime | None:
    """The repeat's first ring from its start, or None if it never rings."""
    zone = load_zone(repeat.zone)
    return next(_repeat_rings(repeat, to_utc_in(repeat.start, zone)), None)
