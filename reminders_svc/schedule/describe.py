"""Human descriptions of schedules: "Every Monday at 09:00, America/New_York"."""

from __future__ import annotations

from reminders_svc.schedule.model import OneOff, Repeat, Schedule
from reminders_svc.schedule.rule import ByDay, Freq, Rule, parse_rule_text
from reminders_svc.schedule.zones import load_zone, to_local

_DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTH_NAMES = (
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
_WORKWEEK = tuple(ByDay(day) for day in range(5))
_WEEKEND = (ByDay(5), ByDay(6))


def _ordinal(number: int) -> str:
    if number == -1:
        return "last"
    if number < 0:
        return f"{_ordinal(-number)} to last"
    teen = 10 <= number % 100 <= 20
    suffix = "th" if teen else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _days(rule: Rule) -> str:
    if rule.by_day == _WORKWEEK:
        return "weekday"
    if rule.by_day == _WEEKEND:
        return "weekend day"
    names = [
        _DAY_NAMES[entry.weekday]
        if entry.ordinal is None
        else f"{_ordinal(entry.ordinal)} {_DAY_NAMES[entry.weekday]}"
        for entry in rule.by_day
    ]
    return _listing(names)


def _every(rule: Rule) -> str:
    unit = _UNITS[rule.freq]
    every = f"Every {rule.interval} {unit}s" if rule.interval > 1 else f"Every {unit}"
    plain_weekly = rule.freq is Freq.WEEKLY and rule.by_day and rule.interval == 1
    if plain_weekly:
        every = f"Every {_days(rule)}"
    elif rule.by_day:
        every += f" on the {_days(rule)}" if rule.freq is not Freq.WEEKLY else f" on {_days(rule)}"
    months = [_MONTH_NAMES[month - 1] for month in rule.by_month]
    if len(months) == 1 and len(rule.by_month_day) == 1 and rule.by_month_day[0] > 0:
        return f"{every} on {months[0]} {rule.by_month_day[0]}"
    on_days = [_ordinal(day) for day in rule.by_month_day]
    if on_days:
        every += f" on the {_listing(on_days)} day"
    if months:
        every += " in " + _listing(months)
    return every


def _times(rule: Rule, repeat: Repeat) -> str:
    minute = rule.by_minute[0] if rule.by_minute else repeat.start.minute
    if rule.freq is Freq.HOURLY and not rule.by_hour:
        return f"at :{minute:02d}"
    hours = rule.by_hour or (repeat.start.hour,)
    return "at " + _listing([f"{hour:02d}:{minute:02d}" for hour in hours])


def describe(schedule: Schedule) -> str:
    """One line for people, e.g. "Every Monday at 09:00, America/New_York"."""
    if isinstance(schedule, OneOff):
        local = schedule.local
        if schedule.instant is not None:
            local = to_local(schedule.instant, load_zone(schedule.zone))
        return f"Once on {local:%Y-%m-%d} at {local:%H:%M}, {schedule.zone}"
    rule = parse_rule_text(schedule.rrule, load_zone(schedule.zone))
    text = f"{_every(rule)} {_times(rule, schedule)}"
    if rule.by_set_pos:
        picked = _listing([_ordinal(position) for position in rule.by_set_pos])
        text += f", keeping the {picked} of each {_UNITS[rule.freq]}"
    text += f", from {schedule.start:%Y-%m-%d}"
    if rule.count is not None:
        text += f", {rule.count} times"
    if rule.until is not None:
        until = to_local(rule.until, load_zone(schedule.zone))
        text += f", until {until:%Y-%m-%d %H:%M}"
    return f"{text}, {schedule.zone}"
