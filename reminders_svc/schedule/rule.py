"""RFC 5545 RRULE text <-> Rule, the parsed and checked form of a recurrence.

Canonical text: parts in a fixed order (FREQ, INTERVAL, COUNT, UNTIL, BYMONTH,
BYMONTHDAY, BYDAY, BYHOUR, BYMINUTE, BYSETPOS, WKST), values sorted and unique,
defaults (INTERVAL=1, WKST=MO, BYSECOND=0) left out, UNTIL as a UTC 'Z' value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo

from reminders_svc.schedule.errors import ScheduleError
from reminders_svc.schedule.zones import MAX_YEAR, MIN_YEAR, check_year, to_local, to_utc_in

WEEKDAY_CODES = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
MAX_INTERVAL = 10_000
# COUNT is honoured by counting from the start; the cap keeps that walk short.
MAX_COUNT = 1_000


class Freq(StrEnum):
    YEARLY = "YEARLY"
    MONTHLY = "MONTHLY"
    WEEKLY = "WEEKLY"
    DAILY = "DAILY"
    HOURLY = "HOURLY"


@dataclass(frozen=True, order=True)
class ByDay:
    """A BYDAY entry: a weekday (0 = Monday), optionally the nth (-1 = last) in the period."""

    weekday: int
    ordinal: int | None = None

    def text(self) -> str:
        prefix = "" if self.ordinal is None else str(self.ordinal)
        return prefix + WEEKDAY_CODES[self.weekday]


@dataclass(frozen=True)
class Rule:
    freq: Freq
    interval: int = 1
    count: int | None = None
    until: datetime | None = None  # aware UTC, inclusive
    by_month: tuple[int, ...] = ()
    by_month_day: tuple[int, ...] = ()
    by_day: tuple[ByDay, ...] = ()
    by_hour: tuple[int, ...] = ()
    by_minute: tuple[int, ...] = ()
    by_set_pos: tuple[int, ...] = ()
    week_start: int = 0

    def text(self) -> str:
        """The canonical RRULE text (without DTSTART)."""
        parts = [f"FREQ={self.freq.value}"]
        if self.interval != 1:
            parts.append(f"INTERVAL={self.interval}")
        if self.count is not None:
            parts.append(f"COUNT={self.count}")
        if self.until is not None:
            parts.append(f"UNTIL={self.until.strftime('%Y%m%dT%H%M%SZ')}")
        numbered = (
            ("BYMONTH", self.by_month),
            ("BYMONTHDAY", self.by_month_day),
        )
        parts.extend(f"{name}={_join(values)}" for name, values in numbered if values)
        if self.by_day:
            parts.append("BYDAY=" + ",".join(entry.text() for entry in self.by_day))
        timed = (("BYHOUR", self.by_hour), ("BYMINUTE", self.by_minute))
        parts.extend(f"{name}={_join(values)}" for name, values in timed if values)
        if self.by_set_pos:
            parts.append(f"BYSETPOS={_join(self.by_set_pos)}")
        if self.week_start != 0:
            parts.append(f"WKST={WEEKDAY_CODES[self.week_start]}")
        return ";".join(parts)


def _join(values: tuple[int, ...]) -> str:
    return ",".join(str(value) for value in values)


_BYDAY_ENTRY = re.compile(r"([+-]?\d{1,2})?(MO|TU|WE|TH|FR|SA|SU)", re.ASCII)
_INTEGER = re.compile(r"[+-]?\d{1,9}", re.ASCII)
_UNTIL = re.compile(r"(\d{4})(\d{2})(\d{2})(?:T(\d{2})(\d{2})(\d{2})(Z?))?", re.ASCII)
_ONE_SECOND = timedelta(seconds=1)
_SUPPORTED = (
    "FREQ", "INTERVAL", "COUNT", "UNTIL", "BYMONTH", "BYMONTHDAY", "BYDAY",
    "BYHOUR", "BYMINUTE", "BYSECOND", "BYSETPOS", "WKST",
)  # fmt: skip
_REFUSED = {
    "BYYEARDAY": "BYYEARDAY is not supported",
    "BYWEEKNO": "BYWEEKNO is not supported",
    "RSCALE": "RSCALE (non-Gregorian calendars) is not supported",
    "SKIP": "SKIP is not supported",
}
# (lowest, highest, zero allowed) for each numeric list part
_RANGES = {
    "BYMONTH": (1, 12, False),
    "BYMONTHDAY": (-31, 31, False),
    "BYHOUR": (0, 23, True),
    "BYMINUTE": (0, 59, True),
    "BYSECOND": (0, 60, True),  # 60: a leap second, as RFC 5545 allows (refused: not 0)
    "BYSETPOS": (-366, 366, False),
}


def parse_rule_text(text: str, zone: ZoneInfo, *, stored: bool = False) -> Rule:
    """Parse RRULE text (with or without "RRULE:"); a local UNTIL is read in ``zone``, and a
    ``stored`` rule's is taken as stored (see `parse_until`)."""
    # RFC 5545's text is ASCII: str.upper() turns U+0131 (dotless i) into "I", and \d takes
    # other scripts' digits.
    if not text.isascii():
        position, character = next((n, c) for n, c in enumerate(text, 1) if not c.isascii())
        raise ScheduleError(
            "rrule", f"at character {position} ({character!r}): RRULE text is ASCII only"
        )
    body = _rrule_line(text)
    if body.upper().startswith("RRULE:"):
        body = body[len("RRULE:") :]
    if not body:
        raise ScheduleError("rrule", "empty RRULE")
    parts: dict[str, str] = {}
    for position, raw in enumerate(body.split(";"), start=1):
        name, equals, value = raw.strip().partition("=")
        name = name.upper()
        where = f"part {position} {raw.strip()!r}"
        if not equals or not value:
            raise ScheduleError("rrule", f"{where}: expected NAME=VALUE")
        if name in _REFUSED:
            raise ScheduleError("rrule", f"{where}: {_REFUSED[name]}")
        if name not in _SUPPORTED:
            raise ScheduleError("rrule", f"{where}: unknown RRULE part {name}")
        if name in parts:
            raise ScheduleError("rrule", f"{where}: {name} given twice")
        parts[name] = value.strip().upper()
    return _rule_from_parts(parts, zone, stored=stored)


# iCalendar properties a recurrence may come with, each on a line of its own.
_OTHER_PROPERTY = re.compile(r"(DTSTART|RDATE|EXDATE|EXRULE)\s*[;:]", re.ASCII | re.IGNORECASE)


def _rrule_line(text: str) -> str:
    """The one RRULE line of ``text``: the start is the repeat's own (start_local_time),
    and other iCalendar lines (DTSTART, RDATE, EXDATE) are refused as such, not read as
    RRULE parts with line breaks in them."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    others = sorted({found[1].upper() for line in lines if (found := _OTHER_PROPERTY.match(line))})
    if others:
        raise ScheduleError(
            "rrule",
            f"{' and '.join(others)} not accepted: the RRULE alone (the start is the repeat's"
            " start_local_time; RDATE, EXDATE and EXRULE are not supported)",
        )
    if len(lines) > 1:
        raise ScheduleError("rrule", f"{len(lines)} lines: one RRULE line only")
    return lines[0] if lines else ""


def _rule_from_parts(parts: dict[str, str], zone: ZoneInfo, *, stored: bool) -> Rule:
    if "FREQ" not in parts:
        raise ScheduleError("rrule", "FREQ is required")
    freq = _freq(parts["FREQ"])
    if "COUNT" in parts and "UNTIL" in parts:
        raise ScheduleError("rrule", "COUNT and UNTIL cannot both be given")
    if _numbers("BYSECOND", parts) not in ((), (0,)):
        raise ScheduleError("rrule", "BYSECOND must be 0 (reminders ring on whole minutes)")
    by_day = _by_day(parts.get("BYDAY"), freq)
    by_month_day = _numbers("BYMONTHDAY", parts)
    if by_month_day and freq is Freq.WEEKLY:
        raise ScheduleError("rrule", "BYMONTHDAY cannot be used with FREQ=WEEKLY")
    by_minute = _numbers("BYMINUTE", parts)
    if len(by_minute) > 1:
        raise ScheduleError("rrule", "BYMINUTE takes one value: at most one ring an hour")
    by_set_pos = _numbers("BYSETPOS", parts)
    others = ("BYMONTH", "BYMONTHDAY", "BYDAY", "BYHOUR", "BYMINUTE")
    if by_set_pos and not any(name in parts for name in others):
        raise ScheduleError("rrule", "BYSETPOS needs another BYxxx part to select from")
    count = parts.get("COUNT")
    return Rule(
        freq=freq,
        interval=_bounded_int("INTERVAL", parts.get("INTERVAL", "1"), "rrule", MAX_INTERVAL),
        count=None if count is None else _bounded_int("COUNT", count, "count", MAX_COUNT),
        until=parse_until(parts["UNTIL"], zone, stored=stored) if "UNTIL" in parts else None,
        by_month=_numbers("BYMONTH", parts),
        by_month_day=by_month_day,
        by_day=by_day,
        by_hour=_numbers("BYHOUR", parts),
        by_minute=by_minute,
        by_set_pos=by_set_pos,
        week_start=_weekday("WKST", parts.get("WKST", "MO")),
    )


def _freq(value: str) -> Freq:
    if value in ("MINUTELY", "SECONDLY"):
        raise ScheduleError("rrule", f"FREQ={value} is too frequent (HOURLY at most)")
    try:
        return Freq(value)
    except ValueError:
        raise ScheduleError("rrule", f"FREQ={value} is not a frequency") from None


def _bounded_int(name: str, value: str, field: str, highest: int) -> int:
    if not _INTEGER.fullmatch(value):
        raise ScheduleError(field, f"{name}={value} is not a whole number")
    return check_bounded(name, int(value), field, highest)


def check_bounded(name: str, number: int, field: str, highest: int) -> int:
    """``number`` if it is within 1..highest, else ScheduleError(field)."""
    if not 1 <= number <= highest:
        raise ScheduleError(field, f"{name}={number} must be between 1 and {highest}")
    return number


def _numbers(name: str, parts: dict[str, str]) -> tuple[int, ...]:
    if name not in parts:
        return ()
    lowest, highest, zero_allowed = _RANGES[name]
    numbers: set[int] = set()
    for item in parts[name].split(","):
        if not _INTEGER.fullmatch(item):
            raise ScheduleError("rrule", f"{name}: {item!r} is not a whole number")
        number = int(item)
        if not lowest <= number <= highest or (number == 0 and not zero_allowed):
            raise ScheduleError("rrule", f"{name}: {number} is out of range")
        numbers.add(number)
    return tuple(sorted(numbers))


def _weekday(name: str, code: str) -> int:
    if code not in WEEKDAY_CODES:
        raise ScheduleError("rrule", f"{name}: {code!r} is not a weekday (MO..SU)")
    return WEEKDAY_CODES.index(code)


def _by_day(value: str | None, freq: Freq) -> tuple[ByDay, ...]:
    if value is None:
        return ()
    entries: set[ByDay] = set()
    for item in value.split(","):
        match = _BYDAY_ENTRY.fullmatch(item)
        if match is None:
            raise ScheduleError("rrule", f"BYDAY: {item!r} is not a weekday like MO, 1FR, -1SU")
        ordinal = int(match.group(1)) if match.group(1) else None
        if ordinal is not None:
            if freq not in (Freq.MONTHLY, Freq.YEARLY):
                raise ScheduleError(
                    "rrule", f"BYDAY: {item} has an ordinal, allowed only with MONTHLY or YEARLY"
                )
            if ordinal == 0 or abs(ordinal) > 53:
                raise ScheduleError("rrule", f"BYDAY: ordinal in {item} must be 1..53 or -53..-1")
        entries.add(ByDay(WEEKDAY_CODES.index(match.group(2)), ordinal))
    return tuple(sorted(entries, key=lambda entry: (entry.ordinal or 0, entry.weekday)))


# A month holds at most 5 of a weekday: an ordinal counted within one goes no further.
MOST_IN_A_MONTH = 5


def check_ordinals(rule: Rule, field: str) -> None:
    """Refuse a BYDAY ordinal past what its period holds: counted within a month (FREQ=
    MONTHLY, or YEARLY with BYMONTH, as RFC 5545 counts it), 6FR never matches; a yearly
    one without BYMONTH counts within the year, up to 53. Checked when a rule is made: a
    rule stored before this check keeps working (its other BYDAY entries ring)."""
    if rule.freq is Freq.MONTHLY:
        within = "FREQ=MONTHLY"
    elif rule.freq is Freq.YEARLY and rule.by_month:
        within = "FREQ=YEARLY and BYMONTH"
    else:
        return
    for entry in rule.by_day:
        if entry.ordinal is not None and abs(entry.ordinal) > MOST_IN_A_MONTH:
            raise ScheduleError(
                field,
                f"BYDAY: ordinal in {entry.text()} must be 1..{MOST_IN_A_MONTH} or"
                f" -{MOST_IN_A_MONTH}..-1 with {within} (a month holds at most"
                f" {MOST_IN_A_MONTH} of a weekday)",
            )


# The most periods of each FREQ in 10 years (120 months; 10 Gregorian years of 3,652.4
# days in weeks, days or hours): a new rule's periods come at most that far apart, as its
# rings must (a bucket entry's TTL: expand.MAX_AHEAD).
_MOST_INTERVAL = {
    Freq.YEARLY: 10,
    Freq.MONTHLY: 120,
    Freq.WEEKLY: 521,
    Freq.DAILY: 3652,
    Freq.HOURLY: 87_658,
}
_UNIT_NAMES = {
    Freq.YEARLY: "years",
    Freq.MONTHLY: "months",
    Freq.WEEKLY: "weeks",
    Freq.DAILY: "days",
    Freq.HOURLY: "hours",
}


def check_interval(rule: Rule, field: str) -> None:
    """Refuse an INTERVAL whose periods are over 10 years apart: the rings of the first
    periods alone were checked for it, so "every 30 years" at every hour of a day passed
    (24 rings, the 25th 30 years on), and past the 400 years a search looks ahead, a series
    silently ended with its first period. Checked when a rule is made: a rule stored
    before this check keeps working."""
    most = _MOST_INTERVAL[rule.freq]
    if rule.interval <= most:
        return
    if field == "repeat":
        unit = _UNIT_NAMES[rule.freq]
        written, fits = f"every {rule.interval} {unit}", f"every {most} {unit}"
    else:
        written, fits = f"INTERVAL={rule.interval} with FREQ={rule.freq}", f"INTERVAL={most}"
    raise ScheduleError(field, f"{written} puts rings over 10 years apart: at most {fits}")


def parse_until(value: str, zone: ZoneInfo, *, stored: bool = False) -> datetime:
    """UNTIL as a UTC instant: 'Z' values are UTC, others are local; a date means its end.

    Its year is checked in ``zone``, where the schedule's dates are (`check_year`): a local
    value as written, a UTC one at its local time, a ``stored`` one not at all. Stored in
    UTC, an end in range may fall outside (8999-12-31 ends in 9000 west of UTC,
    1900-01-01T05:00 in Tokyo in 1899): read back for the first ring, it refused the rule."""
    match = _UNTIL.fullmatch(value)
    if match is None:
        raise ScheduleError("until", f"UNTIL={value} is not YYYYMMDD or YYYYMMDDTHHMMSS[Z]")
    year, month, day, hour, minute, second, utc_marker = match.groups()
    try:
        on = date(int(year), int(month), int(day))
        at = time(int(hour), int(minute), int(second)) if hour is not None else None
    except ValueError as error:
        raise ScheduleError("until", f"UNTIL={value}: {error}") from None
    if not utc_marker:
        check_year(on, "until")
        if at is None:
            return end_of_day(on, zone)
        return to_utc_in(datetime.combine(on, at), zone)
    assert at is not None  # "Z" ends a time
    instant = datetime.combine(on, at).replace(tzinfo=UTC)
    if not stored:
        _check_local_year(instant, zone, value)
    return instant


def _check_local_year(instant: datetime, zone: ZoneInfo, value: str) -> None:
    """ScheduleError unless UNTIL=``value``, the UTC ``instant``, is in range in ``zone``,
    where the schedule's dates are."""
    if MIN_YEAR - 1 <= instant.year <= MAX_YEAR + 1:  # a zone's offset moves it a day at most
        local = to_local(instant, zone)
        if MIN_YEAR <= local.year <= MAX_YEAR:
            return
        raise ScheduleError(
            "until",
            f"UNTIL={value} is {local:%Y-%m-%dT%H:%M:%S} in {zone.key}: the year must be"
            f" {MIN_YEAR} to {MAX_YEAR}",
        )
    check_year(instant, "until")  # far out: the plain refusal


def end_of_day(on: date, zone: ZoneInfo) -> datetime:
    """The UTC instant ending local day ``on``: "until <date>" includes that day.

    A second before the next day's midnight, not the day's 23:59:59: where clocks spring
    forward at 23:00 (America/Nuuk), 23:59:59 lies in the gap, and the gap rule pushed it
    into the next day, whose 00:30 ring then went out too. And where midnight itself is in
    a gap (America/Toronto, 1919-03-31: 23:30 to 00:30), the next day begins at the clock
    change, before the instant midnight maps to: found by bisection, to the second.
    """
    midnight = to_utc_in(datetime.combine(on + timedelta(days=1), time(0)), zone)
    if to_local(midnight - _ONE_SECOND, zone).date() <= on:
        return midnight - _ONE_SECOND
    before, after = midnight - timedelta(days=1), midnight  # on `on`, on the next day
    while after - before > _ONE_SECOND:
        middle = before + (after - before) / 2
        middle = middle.replace(microsecond=0)
        if to_local(middle, zone).date() <= on:
            before = middle
        else:
            after = middle
    return before
