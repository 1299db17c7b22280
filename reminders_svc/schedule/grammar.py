"""The natural repeat grammar, compiled to a Rule.

    every [N] (hour|hours)
    every [N] (day|days) TIME
    every (weekday|weekend) TIME
    every DAYS TIME                                  DAYS: Monday | Mondays | Mon,Wed,Fri
    every [N] (week|weeks) [on DAYS] TIME
    every [N] (month|months) on [the] (1st | last day | 2nd Tue | last Fri) TIME
    every NTH WEEKDAY TIME                           every 2nd Tue: monthly, as above
    every [N] (year|years) on MONTH DAY TIME         MONTH DAY: Oct 26 (Feb 29, not 30)
    ... followed by an optional end: until YYYY-MM-DD | for N times (one of them)

TIME is [at] HH:MM (24-hour), or times at one minute, HH:MM,HH:MM (a rule rings at one
minute of an hour). Words are case-insensitive; numbers have at most 9 digits.
"""

from __future__ import annotations

import calendar
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime

from reminders_svc.schedule.build import quoted, repeat_from_rule
from reminders_svc.schedule.describe import MONTH_NAMES, ordinal
from reminders_svc.schedule.errors import ScheduleError
from reminders_svc.schedule.model import Repeat
from reminders_svc.schedule.rule import (
    MAX_COUNT,
    MAX_INTERVAL,
    MOST_IN_A_MONTH,
    ByDay,
    Freq,
    Rule,
    check_bounded,
    end_of_day,
)
from reminders_svc.schedule.zones import check_year, load_place, load_zone

# ASCII digits only ("\d" takes every script's, which int() reads as well).
_TOKEN = re.compile(
    r"\s*(?:([0-9]{4}-[0-9]{2}-[0-9]{2})|([0-9]{1,2}:[0-9]{2})|([0-9]+)(st|nd|rd|th)?|([a-z]+)|(,))"
)
_WEEKDAYS = {
    name: index
    for index, names in enumerate(
        (("mon", "monday"), ("tue", "tues", "tuesday"), ("wed", "wednesday"),
         ("thu", "thur", "thurs", "thursday"), ("fri", "friday"), ("sat", "saturday"),
         ("sun", "sunday"))
    )
    for name in (*names, names[-1] + "s")  # "every Mondays", as "every days" reads
}  # fmt: skip
_MONTHS = {
    name: index
    for index, names in enumerate(
        (("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"),
         ("may",), ("jun", "june"), ("jul", "july"), ("aug", "august"),
         ("sep", "sept", "september"), ("oct", "october"), ("nov", "november"),
         ("dec", "december")),
        start=1,
    )
    for name in names
}  # fmt: skip
_ORDINAL_WORDS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "last": -1}


# More than any number the grammar takes (an interval, a count, a day of the month).
_MOST_DIGITS = 9


@dataclass(frozen=True)
class _Token:
    kind: str  # "date", "time", "number", "word", "comma"
    text: str
    position: int  # 0-based character offset in the expression
    number: int = 0
    suffixed: bool = False  # "1st", "2nd": an ordinal


# The grammar's words are ASCII. str.lower() may lengthen a string ("İ" becomes two
# characters), which would shift every position reported after it.
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _tokenize(expression: str) -> list[_Token]:
    tokens: list[_Token] = []
    lowered, offset = expression.translate(_ASCII_LOWER), 0
    while lowered[offset:].strip():
        match = _TOKEN.match(lowered, offset)
        if match is None:
            bad = len(lowered) - len(lowered[offset:].lstrip())
            raise ScheduleError("repeat", f"at character {bad + 1}: unexpected {expression[bad]!r}")
        start = match.start() + len(match.group(0)) - len(match.group(0).lstrip())
        on_date, at_time, digits, suffix, word, _comma = match.groups()
        if on_date:
            tokens.append(_Token("date", on_date, start))
        elif at_time:
            tokens.append(_Token("time", at_time, start))
        elif digits:
            text = match.group(0).strip()
            if len(digits) > _MOST_DIGITS:  # int() refuses past 4,300 digits: a ValueError
                raise ScheduleError(
                    "repeat",
                    f"at character {start + 1} ({quoted(text, 20)}): expected a number of at"
                    f" most {_MOST_DIGITS} digits",
                )
            tokens.append(_Token("number", text, start, int(digits), bool(suffix)))
        elif word:
            tokens.append(_Token("word", word, start))
        else:
            tokens.append(_Token("comma", ",", start))
        offset = match.end()
    return tokens


_TWELVE_HOUR = re.compile(r"(\d{1,2}(:\d\d)?)?(am|pm|noon|midnight)")


def _hint(before: _Token | None, refused: _Token | None, after: _Token | None) -> str:
    """What a refusal of a common way of writing adds, from the token refused and those
    around it: 12-hour times ("9am" is 9 then am), days joined by 'and' or by spaces, a
    day of the month in words, 'every other'."""
    previous, text, following = (
        "" if t is None else t.text.lower() for t in (before, refused, after)
    )
    if _TWELVE_HOUR.fullmatch(text) or _TWELVE_HOUR.fullmatch(following):
        return " (times are 24-hour: 21:30, not 9:30 pm)"
    times = [t.text for t in (before, after) if t is not None and t.kind == "time"]
    if text == "and" and times:
        one_minute = len(times) == 2 and len({time[-2:] for time in times}) == 1
        listed = ",".join(times) if one_minute else "08:00,20:00"
        return f" (times are listed with commas, at one minute: {listed})"
    if text == "and" or (text in _WEEKDAYS and previous in _WEEKDAYS):
        return " (days are listed with commas: Mon,Fri)"
    if previous in _ORDINAL_WORDS and previous != "last":
        return f" (a day of the month is a number: {ordinal(_ORDINAL_WORDS[previous])})"
    if text == "day" and before is not None and before.suffixed:
        return f" (write {before.text} alone)"
    if text == "other":
        return " (every other day is every 2 days)"
    return ""


class _Parser:
    def __init__(self, expression: str) -> None:
        self.tokens = _tokenize(expression)
        self.index = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def fail(self, expected: str) -> ScheduleError:
        token = self.peek()
        where = (
            "at end of input"
            if token is None
            else (f"at character {token.position + 1} ({token.text!r})")
        )
        before = self.tokens[self.index - 1] if self.index > 0 else None
        after = self.tokens[self.index + 1] if self.index + 1 < len(self.tokens) else None
        hint = _hint(before, token, after)
        return ScheduleError("repeat", f"{where}: expected {expected}{hint}")

    def take(self, kind: str, expected: str) -> _Token:
        token = self.peek()
        if token is None or token.kind != kind:
            raise self.fail(expected)
        self.index += 1
        return token

    def accept(self, *words: str) -> str | None:
        token = self.peek()
        if token is not None and token.kind == "word" and token.text in words:
            self.index += 1
            return token.text
        return None

    def weekday(self) -> int:
        token = self.take("word", "a weekday (Mon..Sun)")
        if token.text not in _WEEKDAYS:
            self.index -= 1
            raise self.fail("a weekday (Mon..Sun)")
        return _WEEKDAYS[token.text]

    def weekdays(self) -> tuple[ByDay, ...]:
        days = [self.weekday()]
        while (token := self.peek()) is not None and token.kind == "comma":
            self.index += 1
            days.append(self.weekday())
        return tuple(ByDay(day) for day in sorted(set(days)))

    def time_of_day(self) -> tuple[int, int]:
        token = self.take("time", "a time HH:MM")
        hour, minute = (int(part) for part in token.text.split(":"))
        if hour > 23 or minute > 59:
            self.index -= 1
            raise self.fail("a time HH:MM between 00:00 and 23:59")
        return hour, minute


def _clock(rule_args: dict[str, object], parser: _Parser) -> None:
    """TIME, or times at one minute past different hours ("08:00,20:00"): a rule rings at
    one minute of each hour it rings in (BYMINUTE takes one value)."""
    parser.accept("at")
    hour, minute = parser.time_of_day()
    hours = {hour}
    while (token := parser.peek()) is not None and token.kind == "comma":
        parser.index += 1
        hour, other_minute = parser.time_of_day()
        if other_minute != minute:
            parser.index -= 1
            raise parser.fail(
                f"a time at :{minute:02d} as the first (the times of a repeat share their"
                " minutes: other minutes take another reminder)"
            )
        hours.add(hour)
    rule_args["by_hour"], rule_args["by_minute"] = tuple(sorted(hours)), (minute,)


def _nth_weekday_ahead(parser: _Parser) -> bool:
    """Whether the next words are an nth weekday ("2nd Tue", "first Monday", "last Fri"),
    which ring once a month."""
    ahead = parser.tokens[parser.index : parser.index + 2]
    if len(ahead) < 2 or ahead[1].text not in _WEEKDAYS:
        return False
    return ahead[0].suffixed or (ahead[0].kind == "word" and ahead[0].text in _ORDINAL_WORDS)


def _monthly_day(parser: _Parser, rule_args: dict[str, object]) -> None:
    """'the 1st', 'the 15', 'last day', 'last Fri', '2nd Tue', 'second Tue'."""
    parser.accept("the")
    token = parser.peek()
    if token is not None and token.kind == "number":
        if not _nth_weekday_ahead(parser):
            if not 1 <= token.number <= 31:
                raise parser.fail("a day of the month 1..31")
            parser.index += 1
            rule_args["by_month_day"] = (token.number,)
            return
        if not 1 <= token.number <= MOST_IN_A_MONTH:
            raise parser.fail(f"an ordinal 1st..{ordinal(MOST_IN_A_MONTH)} before a weekday")
        parser.index += 1
        nth = token.number
    else:
        word = parser.accept(*_ORDINAL_WORDS)
        if word is None:
            raise parser.fail("a day like 1st, last day, last Fri or 2nd Tue")
        nth = _ORDINAL_WORDS[word]
        if nth == -1 and parser.accept("day"):
            rule_args["by_month_day"] = (-1,)
            return
    rule_args["by_day"] = (ByDay(parser.weekday(), nth),)


def _yearly_day(parser: _Parser, rule_args: dict[str, object]) -> None:
    token = parser.take("word", "a month name (Jan..Dec)")
    if token.text not in _MONTHS:
        parser.index -= 1
        raise parser.fail("a month name (Jan..Dec)")
    month = _MONTHS[token.text]
    longest = calendar.monthrange(2000, month)[1]  # a leap year: February 29 rings in them
    day = parser.take("number", "a day of the month")
    if not 1 <= day.number <= longest:
        parser.index -= 1
        length = f"{longest} days" + " in leap years" * (month == 2)
        raise parser.fail(f"a day 1..{longest} ({MONTH_NAMES[month - 1]} has {length})")
    rule_args["by_month"], rule_args["by_month_day"] = (month,), (day.number,)


_DayOfPeriod = Callable[[_Parser, dict[str, object]], None]
_ON_A_DAY: dict[str, tuple[Freq, _DayOfPeriod, str]] = {
    "month": (Freq.MONTHLY, _monthly_day, "every month on the 1st 09:00"),
    "year": (Freq.YEARLY, _yearly_day, "every year on Oct 26 09:00"),
}


def _body(parser: _Parser, rule_args: dict[str, object]) -> None:
    if _nth_weekday_ahead(parser):  # "every 2nd Tue", "every last Fri": once a month
        rule_args["freq"] = Freq.MONTHLY
        _monthly_day(parser, rule_args)
        _clock(rule_args, parser)
        return
    interval_token = parser.peek()
    if interval_token is not None and interval_token.kind == "number":
        parser.index += 1
        rule_args["interval"] = check_bounded(
            "interval", interval_token.number, "repeat", MAX_INTERVAL
        )
    counted = "interval" in rule_args
    unit = parser.peek()
    if unit is None or unit.kind != "word":
        raise parser.fail("a unit (hours, day, week, month, year) or a weekday")
    parser.index += 1
    word = unit.text.removesuffix("s") if unit.text not in _WEEKDAYS else unit.text
    if word == "hour":
        rule_args["freq"] = Freq.HOURLY
    elif word == "day":
        rule_args["freq"] = Freq.DAILY
        _clock(rule_args, parser)
    elif word in ("week", "weekday", "weekend") or unit.text in _WEEKDAYS:
        rule_args["freq"] = Freq.WEEKLY
        if word == "week":
            if parser.accept("on"):
                rule_args["by_day"] = parser.weekdays()
        elif counted:
            parser.index -= 1
            raise parser.fail("'weeks' after a number (e.g. every 2 weeks on Mon)")
        elif word == "weekday":
            rule_args["by_day"] = tuple(ByDay(day) for day in range(5))
        elif word == "weekend":
            rule_args["by_day"] = (ByDay(5), ByDay(6))
        else:
            parser.index -= 1
            rule_args["by_day"] = parser.weekdays()
        _clock(rule_args, parser)
    elif word in _ON_A_DAY:
        rule_args["freq"], day_of_period, example = _ON_A_DAY[word]
        if parser.accept("on") is None:
            raise parser.fail(f"'on' (e.g. {example})")
        day_of_period(parser, rule_args)
        _clock(rule_args, parser)
    else:
        parser.index -= 1
        raise parser.fail("a unit (hours, day, week, month, year) or a weekday")


def _end(parser: _Parser, rule_args: dict[str, object], zone: str) -> None:
    if parser.accept("until"):
        token = parser.take("date", "a date YYYY-MM-DD")
        try:
            on = date.fromisoformat(token.text)
        except ValueError:
            parser.index -= 1
            raise parser.fail("a valid date YYYY-MM-DD") from None
        check_year(on, "until")
        rule_args["until"] = end_of_day(on, load_zone(zone))
    elif parser.accept("for"):
        token = parser.take("number", "a number of times")
        rule_args["count"] = check_bounded("count", token.number, "count", MAX_COUNT)
        if parser.accept("times", "time") is None:
            raise parser.fail("'times'")
    following = parser.peek()
    if following is None:
        return
    if rule_args.keys() & {"until", "count"} and following.text in ("until", "for"):
        raise parser.fail("the end (one end: until a date or for N times, not both)")
    raise parser.fail("the end, or 'until YYYY-MM-DD' or 'for N times'")


def parse_repeat(
    expression: str, zone: str, start: datetime, *, start_given: bool = True
) -> Repeat:
    """A repeat from the natural grammar, beginning at ``start`` (naive local) in ``zone``
    (see `repeat_from_rule` for a start not given)."""
    load_place(zone)
    parser = _Parser(expression)
    if parser.accept("every") is None:
        raise parser.fail("'every'")
    rule_args: dict[str, object] = {}
    _body(parser, rule_args)
    _end(parser, rule_args, zone)
    rule = Rule(**rule_args)  # type: ignore[arg-type]
    return repeat_from_rule(rule, zone, start, "repeat", start_given=start_given)
