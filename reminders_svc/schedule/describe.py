"""Human descriptions of schedules: "Every Monday at 09:00, America/New_York"."""

from __future__ import annotations

from datetime import datetime

from reminders_svc.schedule.expand import aligned_hours, make_plan
from reminders_svc.schedule.model import OneOff, Repeat, Schedule
from reminders_svc.schedule.rule import MOST_IN_A_MONTH, ByDay, Freq, Rule, parse_rule_text
from reminders_svc.schedule.zones import load_zone, rings_at, to_local

_DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTH_NAMES = (
    "January", "February", "March", "April", "May", "June", "July",
    "August", "September", "October", "November", "December",
)  # fmt: skip
_UNITS = {
    Freq.YEARLY: "year",
    Freq.MONTHLY: "month",
    Freq.WEEKLY: "week",
    Freq.DAILY: "day",
    Freq.HOURLY: "hour",
}
# The days every year's month has (February has a 29th in leap years only).
_DAYS_IN = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_LEAP_DAY = 29  # February's, in leap years only
_WORKWEEK = tuple(ByDay(day) for day in range(5))
_WEEKEND = (ByDay(5), ByDay(6))
_PLURALS = {"weekday": "weekdays", "weekend day": "weekend days"}


def ordinal(number: int) -> str:
    """1st, 2nd, 23rd, 11th; last, 2nd to last (an RRULE's negative positions)."""
    if number == -1:
        return "last"
    if number < 0:
        return f"{ordinal(-number)} to last"
    teen = 10 <= number % 100 <= 20
    suffix = "th" if teen else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _days(by_day: tuple[ByDay, ...]) -> str:
    if by_day == _WORKWEEK:
        return "weekday"
    if by_day == _WEEKEND:
        return "weekend day"
    names = [
        _DAY_NAMES[entry.weekday]
        if entry.ordinal is None
        else f"{ordinal(entry.ordinal)} {_DAY_NAMES[entry.weekday]}"
        for entry in by_day
    ]
    return _listing(names)


def _plain_and_nth(rule: Rule, every: str, months: list[str]) -> str:
    """A BYDAY list of plain days and ordinals, a union (RFC 5545): each plain day rings
    every week of the period, each ordinal once in it ("Every Monday and the last Friday
    of the month"; said the other way round, "on the last Friday and Monday", it read as
    the month's last Friday and last Monday)."""
    plain = _days(tuple(entry for entry in rule.by_day if entry.ordinal is None))
    nth = _days(tuple(entry for entry in rule.by_day if entry.ordinal is not None))
    text = f"Every {plain} and the {nth}"
    if rule.interval > 1:
        return f"{text} of {every.lower()}"
    if months:
        return text  # "in March" follows
    return f"{text} of the {_UNITS[rule.freq]}"


def _every(rule: Rule, start: datetime) -> str:
    """What RFC 5545 makes of the rule's day parts, in words: a plain weekday rings every
    such day in the period (FREQ=MONTHLY;BYDAY=MO is every Monday), a yearly rule's month
    days without months fall in every month, and a rule without day parts takes its day
    (and a yearly one its month) from the start."""
    unit = _UNITS[rule.freq]
    every = f"Every {rule.interval} {unit}s" if rule.interval > 1 else f"Every {unit}"
    month_days, month_numbers = _month_days(rule, start)
    months = [MONTH_NAMES[month - 1] for month in month_numbers]
    if rule.by_day or rule.freq is Freq.WEEKLY:
        # A weekly rule without days rings on the start's weekday.
        days = _days(rule.by_day) if rule.by_day else _DAY_NAMES[start.weekday()]
        plain = all(entry.ordinal is None for entry in rule.by_day)
        nth = all(entry.ordinal is not None for entry in rule.by_day)
        # Hours, or days but not each one: the unit rings on those days, not once a day.
        within_days = rule.freq is Freq.HOURLY or (rule.freq is Freq.DAILY and rule.interval > 1)
        if rule.freq is Freq.WEEKLY or within_days:
            once_a_day = rule.freq is Freq.WEEKLY and rule.interval == 1
            # "on weekday" read as one day: the rule rings on each of them.
            each = _PLURALS.get(days, days)
            every = f"Every {days}" if once_a_day else f"{every} on {each}"
        elif plain:
            every = f"Every {days}" if rule.interval == 1 else f"Every {days} of {every.lower()}"
        elif not nth:
            every = _plain_and_nth(rule, every, months)
        elif rule.freq is Freq.YEARLY and not months:
            every += f" on the {days} of the year"
        else:
            every += f" on the {days}"
    if len(months) == 1 and len(month_days) == 1 and month_days[0] > 0:
        return f"{every} on {months[0]} {month_days[0]}"
    if month_days:
        if rule.freq is Freq.YEARLY and not months and not rule.by_day:
            # The days of every month of the year.
            every = "Every month" if rule.interval == 1 else f"Every month of {every.lower()}"
        every += f" on the {_listing([ordinal(day) for day in month_days])} day"
    if months:
        every += " in " + _listing(months)
    return every


def _month_days(rule: Rule, start: datetime) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The month days and months the rule rings on: a monthly or yearly rule without day
    parts takes its day (and a yearly one its month) from the start."""
    month_days, month_numbers = rule.by_month_day, rule.by_month
    if not rule.by_day and not month_days and rule.freq in (Freq.MONTHLY, Freq.YEARLY):
        month_days = (start.day,)
        if rule.freq is Freq.YEARLY and not month_numbers:
            month_numbers = (start.month,)
    return month_days, month_numbers


def _gaps(rule: Rule, start: datetime) -> str:
    """The days the rule names that some of its months lack, which RFC 5545 skips: said,
    so that a monthly 31st ringing seven times a year (every 2 months: as few as two) is
    no surprise."""
    if rule.by_set_pos:
        return ""  # picks from what the period holds: nothing named is skipped
    month_days, month_numbers = _month_days(rule, start)
    months = month_numbers or tuple(range(1, 13))
    periods = "months"
    if month_days:
        listed = len(month_days)
        lacking = [ordinal(d) for d in month_days if any(abs(d) > _DAYS_IN[m - 1] for m in months)]
    elif rule.freq in (Freq.MONTHLY, Freq.YEARLY) and rule.by_day:
        listed = len(rule.by_day)
        # Every month holds 4 of each weekday, some a 5th; every year 52, some a 53rd (a
        # yearly rule without BYMONTH counts in the year).
        in_year = rule.freq is Freq.YEARLY and not month_numbers
        most, periods = (53, "years") if in_year else (MOST_IN_A_MONTH, "months")
        lacking = [
            f"{ordinal(e.ordinal)} {_DAY_NAMES[e.weekday]}"
            for e in rule.by_day
            if e.ordinal is not None and abs(e.ordinal) >= most
        ]
    else:
        return ""
    if not lacking:
        return ""
    if month_numbers == (2,) and month_days:
        # Only the 29th waits for a leap year (the 28th of "28,29" is yearly); no February
        # holds a 30th or 31st (named beside a day that rings, the rule is accepted).
        leap = [ordinal(d) for d in month_days if abs(d) == _LEAP_DAY]
        never = [ordinal(d) for d in month_days if abs(d) > _LEAP_DAY]
        if len(leap) == listed:
            return ", only in leap years"
        said = ""
        if leap:
            said += f", the {_listing(leap)} only in leap years"
        if never:
            said += f", the {_listing(never)} never"
        return said
    if listed == 1:
        return f", skipped in {periods} without one"
    them = "one" if len(lacking) == 1 else "them"
    return f", the {_listing(lacking)} skipped in {periods} without {them}"


def _times(rule: Rule, repeat: Repeat) -> str:
    minute = rule.by_minute[0] if rule.by_minute else repeat.start.minute
    if rule.freq is Freq.HOURLY and not rule.by_hour:
        return f"at :{minute:02d}"
    if rule.freq is Freq.HOURLY:
        return _hours_reached(rule, repeat.start, minute)
    hours = rule.by_hour or (repeat.start.hour,)
    return "at " + _listing([f"{hour:02d}:{minute:02d}" for hour in hours])


def _hours_reached(rule: Rule, start: datetime, minute: int) -> str:
    """An hourly rule's BYHOUR as the INTERVAL's steps from the start reach it: where the
    steps fit a day (24 % INTERVAL == 0) only the hours they land on (INTERVAL=2 from 09:30
    with BYHOUR=9,10 rings at 09:30 alone); otherwise they land on other hours each day."""
    if 24 % rule.interval:
        listed = _listing([f"{hour:02d}:{minute:02d}" for hour in rule.by_hour])
        return f"in the hours {listed} that {rule.interval}-hour steps from the start reach"
    hours = aligned_hours(make_plan(rule, start), start.date())  # the same on every day
    listed = _listing([f"{hour:02d}:{minute:02d}" for hour in hours])
    return f"in the hour {listed}" if len(hours) == 1 else f"in the hours {listed}"


def _clock(local: datetime) -> str:
    return f"{local:%H:%M:%S}" if local.second else f"{local:%H:%M}"


def _one_off_time(one_off: OneOff) -> str:
    """Its date and wall time, and when that time does not exist (a clock change skips it)
    the one it rings at instead."""
    zone = load_zone(one_off.zone)
    if one_off.instant is not None:
        rings = to_local(one_off.instant, zone)
        return f"{rings:%Y-%m-%d} at {_clock(rings)}"
    local = one_off.local
    assert local is not None
    written = f"{local:%Y-%m-%d} at {_clock(local)}"
    rings = rings_at(local, zone)
    if rings == local:
        return written
    # A whole skipped day (Pacific/Apia, 2011-12-30) moves the ring to the next date.
    at = _clock(rings) if rings.date() == local.date() else f"{rings:%Y-%m-%d} {_clock(rings)}"
    return f"{written} (rings at {at}: the clock change skips {_clock(local)})"


def describe(schedule: Schedule) -> str:
    """One line for people, e.g. "Every Monday at 09:00, America/New_York"."""
    if isinstance(schedule, OneOff):
        return f"Once on {_one_off_time(schedule)}, {schedule.zone}"
    rule = parse_rule_text(schedule.rrule, load_zone(schedule.zone), stored=True)
    text = f"{_every(rule, schedule.start)} {_times(rule, schedule)}"
    text += _gaps(rule, schedule.start)
    if rule.by_set_pos:
        picked = _listing([ordinal(position) for position in rule.by_set_pos])
        text += f", keeping the {picked} of each {_UNITS[rule.freq]}"
    text += f", from {schedule.start:%Y-%m-%d}"
    if rule.count is not None:
        text += f", {rule.count} time{'s' * (rule.count != 1)}"
    if rule.until is not None:
        until = to_local(rule.until, load_zone(schedule.zone))
        text += f", until {until:%Y-%m-%d %H:%M}"
    return f"{text}, {schedule.zone}"
