"""Bad inputs, each with the field and message it must give."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from reminders_svc.schedule import (
    Repeat,
    ScheduleError,
    build,
    load_zone,
    occurrences,
    one_off_instant,
    one_off_local,
    parse_local_datetime,
    parse_repeat,
    parse_rrule,
    validate_new,
)
from reminders_svc.schedule.expand import first_ring

START = datetime(2026, 10, 20, 8, 0)
NOW = datetime(2026, 10, 20, 12, 0, tzinfo=UTC)
NY = "America/New_York"
EVERY_HOUR = ",".join(str(hour) for hour in range(24))
EVERY_HOUR_AT_00 = ",".join(f"{hour:02d}:00" for hour in range(24))


def rrule(text: str) -> Callable[[], object]:
    return lambda: parse_rrule(text, NY, START)


def repeat(text: str) -> Callable[[], object]:
    return lambda: parse_repeat(text, NY, START)


# BYSETPOS past every period's times: (what holds fewer, the rule, why it never picks).
NEVER_PICKED = [
    ("a week's one Friday", "FREQ=WEEKLY;BYDAY=FR;BYSETPOS=2;INTERVAL=2",
     "BYSETPOS=2 but a week holds at most 1 time"),
    ("a week's one time", "FREQ=WEEKLY;BYMINUTE=30;BYSETPOS=-2;INTERVAL=4",
     "BYSETPOS=-2 but a week holds at most 1 time"),
    ("a week's 2 days at 2 hours", "FREQ=WEEKLY;BYDAY=SU,MO;BYHOUR=22,23;BYSETPOS=10;INTERVAL=3",
     "BYSETPOS=10 but a week holds at most 4 times"),
    ("a month's Mondays, Tuesdays and Saturdays",  # 5 + 5 + 4 at most
     "FREQ=MONTHLY;BYDAY=MO,TU,SA;BYHOUR=6;BYSETPOS=20;INTERVAL=5",
     "BYSETPOS=20 but a month holds at most 14 times"),
    ("a month's 1st or 2nd on a Monday", "FREQ=MONTHLY;BYMONTHDAY=1,2;BYDAY=MO;BYSETPOS=2",
     "BYSETPOS=2 but a month holds at most 1 time"),
    ("a year's 53rd Monday", "FREQ=YEARLY;BYDAY=53MO;BYSETPOS=-2",
     "BYSETPOS=-2 but a year holds at most 1 time"),
    ("a year's Mondays and Tuesdays", "FREQ=YEARLY;BYDAY=MO,TU,20WE;BYSETPOS=200,-108",
     "BYSETPOS=-108,200 but a year holds at most 107 times"),
    ("February's Mondays at every hour", f"FREQ=YEARLY;BYMONTH=2;BYDAY=MO;BYHOUR={EVERY_HOUR};"
     "BYSETPOS=121", "BYSETPOS=121 but a year holds at most 120 times"),
]  # fmt: skip

BAD_INPUTS: list[tuple[str, Callable[[], object], str, str]] = [
    ("unknown zone", lambda: load_zone("Mars/Olympus"), "zone",
     "unknown time zone 'Mars/Olympus' (want an IANA name)"),
    ("zone path", lambda: load_zone("../../etc/passwd"), "zone",
     "unknown time zone '../../etc/passwd' (want an IANA name)"),
    ("empty rrule", rrule(""), "rrule", "empty RRULE"),
    ("no FREQ", rrule("BYDAY=MO"), "rrule", "FREQ is required"),
    ("minutely", rrule("FREQ=MINUTELY"), "rrule", "FREQ=MINUTELY is too frequent (HOURLY at most)"),
    ("secondly", rrule("FREQ=SECONDLY"), "rrule", "FREQ=SECONDLY is too frequent (HOURLY at most)"),
    ("bad FREQ", rrule("FREQ=SOMETIMES"), "rrule", "FREQ=SOMETIMES is not a frequency"),
    ("unknown part", rrule("FREQ=DAILY;COLOR=RED"), "rrule",
     "part 2 'COLOR=RED': unknown RRULE part COLOR"),
    ("no value", rrule("FREQ=DAILY;BYDAY"), "rrule", "part 2 'BYDAY': expected NAME=VALUE"),
    ("BYYEARDAY", rrule("FREQ=YEARLY;BYYEARDAY=100"), "rrule",
     "part 2 'BYYEARDAY=100': BYYEARDAY is not supported"),
    ("twice", rrule("FREQ=DAILY;FREQ=WEEKLY"), "rrule", "part 2 'FREQ=WEEKLY': FREQ given twice"),
    ("BYSECOND", rrule("FREQ=DAILY;BYSECOND=30"), "rrule",
     "BYSECOND must be 0 (reminders ring on whole minutes)"),
    ("bad weekday", rrule("FREQ=WEEKLY;BYDAY=XX"), "rrule",
     "BYDAY: 'XX' is not a weekday like MO, 1FR, -1SU"),
    ("ordinal weekly", rrule("FREQ=WEEKLY;BYDAY=1MO"), "rrule",
     "BYDAY: 1MO has an ordinal, allowed only with MONTHLY or YEARLY"),
    ("BYMONTHDAY weekly", rrule("FREQ=WEEKLY;BYMONTHDAY=1"), "rrule",
     "BYMONTHDAY cannot be used with FREQ=WEEKLY"),
    ("hour range", rrule("FREQ=DAILY;BYHOUR=24"), "rrule", "BYHOUR: 24 is out of range"),
    ("month zero", rrule("FREQ=YEARLY;BYMONTH=0"), "rrule", "BYMONTH: 0 is out of range"),
    ("two minutes", rrule("FREQ=DAILY;BYMINUTE=0,30"), "rrule",
     "BYMINUTE takes one value: at most one ring an hour"),
    ("lone BYSETPOS", rrule("FREQ=MONTHLY;BYSETPOS=1"), "rrule",
     "BYSETPOS needs another BYxxx part to select from"),
    ("BYSETPOS past an hour's one time", rrule("FREQ=HOURLY;BYMONTH=5;BYSETPOS=2"), "rrule",
     "never occurs: BYSETPOS=2 but an hour holds at most 1 time"),
    ("BYSETPOS past a day's times", rrule(f"FREQ=DAILY;BYHOUR={EVERY_HOUR};BYSETPOS=25"),
     "rrule", "never occurs: BYSETPOS=25 but a day holds at most 24 times"),
    # A period's times counted, not its days (each was walked for 400 years, 60-120 ms).
    *[
        (f"BYSETPOS past {held}", rrule(text), "rrule", f"never occurs: {message}")
        for held, text, message in NEVER_PICKED
    ],
    ("BYSETPOS over a year of hours",
     rrule(f"FREQ=YEARLY;BYDAY=MO,TU,WE,TH,FR,SA,SU;BYHOUR={EVERY_HOUR};BYSETPOS=-1"), "rrule",
     "BYSETPOS picks from at most 366 times a period, not up to 8784: use fewer BYHOUR"
     " values, a BYMONTH, or a shorter FREQ"),
    ("BYSETPOS with a long COUNT",
     rrule("FREQ=YEARLY;COUNT=1000;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1"), "rrule",
     "COUNT with BYSETPOS picking from up to 262 times a period: at most 4, or UNTIL"),
    # Within the estimate (one ring a year), but a 366th day comes only in leap years.
    ("BYSETPOS a leap year's, with a COUNT",
     rrule("FREQ=YEARLY;COUNT=2;BYDAY=MO,TU,WE,TH,FR,SA,SU;BYSETPOS=366"), "rrule",
     "COUNT=2 costs too much to walk from the start, as every search does: from this start"
     " the limit allows COUNT=1 at most (use a smaller COUNT, a later start, or UNTIL)"),
    # iCalendar lines around the RRULE, refused as such (read as parts, with their line
    # breaks in the message).
    ("a DTSTART line", rrule("DTSTART:20261026T090000\nRRULE:FREQ=WEEKLY"), "rrule",
     "DTSTART not accepted: the RRULE alone (the start is the repeat's start_local_time;"
     " RDATE, EXDATE and EXRULE are not supported)"),
    ("a DTSTART with its zone", rrule("DTSTART;TZID=America/New_York:20261026T090000"), "rrule",
     "DTSTART not accepted: the RRULE alone (the start is the repeat's start_local_time;"
     " RDATE, EXDATE and EXRULE are not supported)"),
    ("an EXDATE line", rrule("RRULE:FREQ=DAILY\r\nEXDATE:20261027T090000\r\n"), "rrule",
     "EXDATE not accepted: the RRULE alone (the start is the repeat's start_local_time;"
     " RDATE, EXDATE and EXRULE are not supported)"),
    ("two RRULE lines", rrule("RRULE:FREQ=DAILY\nRRULE:FREQ=WEEKLY"), "rrule",
     "2 lines: one RRULE line only"),
    ("the placeholder zone", lambda: parse_rrule("FREQ=DAILY", "Factory", START), "zone",
     "'Factory' is no place's time zone (want an IANA name)"),
    ("a one-off in the placeholder zone",
     lambda: one_off_local(datetime(2026, 11, 1, 9), "Factory"), "zone",
     "'Factory' is no place's time zone (want an IANA name)"),
    ("an expression in the placeholder zone",
     lambda: parse_repeat("every day 09:00", "Factory", START), "zone",
     "'Factory' is no place's time zone (want an IANA name)"),
    # Python's int() refuses past 4,300 digits (a ValueError, and a traceback from preview).
    ("a number of 5,000 digits", repeat("every " + "9" * 5000 + " days 08:00"), "repeat",
     "at character 7 ('999999999999999...'): expected a number of at most 9 digits"),
    # Common ways of writing, refused with what to write instead.
    ("times joined by and", repeat("every day 08:00 and 20:00"), "repeat",
     "at character 17 ('and'): expected the end, or 'until YYYY-MM-DD' or 'for N times'"
     " (times are listed with commas, at one minute: 08:00,20:00)"),
    ("times at two minutes", repeat("every day 08:30,20:00"), "repeat",
     "at character 17 ('20:00'): expected a time at :30 as the first (the times of a repeat"
     " share their minutes: other minutes take another reminder)"),
    ("both ends", repeat("every weekday 07:30 until 2026-10-30 for 2 times"), "repeat",
     "at character 38 ('for'): expected the end (one end: until a date or for N times, not"
     " both)"),
    ("both ends, count first", repeat("every weekday 07:30 for 2 times until 2026-10-30"),
     "repeat",
     "at character 33 ('until'): expected the end (one end: until a date or for N times,"
     " not both)"),
    ("a 6th weekday", repeat("every 6th Monday 09:00"), "repeat",
     "at character 7 ('6th'): expected an ordinal 1st..5th before a weekday"),
    ("a 6th weekday of the month", repeat("every month on the 6th Mon 09:00"), "repeat",
     "at character 20 ('6th'): expected an ordinal 1st..5th before a weekday"),
    ("a 12-hour time", repeat("every day 9am"), "repeat",
     "at character 11 ('9'): expected a time HH:MM (times are 24-hour: 21:30, not 9:30 pm)"),
    ("days joined by and", repeat("every 2 weeks on Monday and Friday 09:00"), "repeat",
     "at character 25 ('and'): expected a time HH:MM (days are listed with commas: Mon,Fri)"),
    ("days apart by spaces", repeat("every Mon Wed Fri 09:00"), "repeat",
     "at character 11 ('wed'): expected a time HH:MM (days are listed with commas: Mon,Fri)"),
    ("a day of the month in words", repeat("every month on the first at 09:00"), "repeat",
     "at character 26 ('at'): expected a weekday (Mon..Sun) (a day of the month is a number:"
     " 1st)"),
    ("a day of the month as a day", repeat("every month on the 3rd day at 09:00"), "repeat",
     "at character 24 ('day'): expected a time HH:MM (write 3rd alone)"),
    ("every other", repeat("every other day at 09:00"), "repeat",
     "at character 7 ('other'): expected a unit (hours, day, week, month, year) or a weekday"
     " (every other day is every 2 days)"),
    # No BYSETPOS, but ~24 days a ring walked from 1900 at every search (~90 ms each).
    ("a sparse COUNT rule started long ago",
     lambda: parse_rrule("FREQ=HOURLY;INTERVAL=47;COUNT=1000;BYHOUR=1", NY, datetime(1900, 1, 1)),
     "rrule",
     "COUNT=1000 costs too much to walk from the start, as every search does: from this"
     " start the limit allows COUNT=55 at most (use a smaller COUNT, a later start, or"
     " UNTIL)"),
    ("RRULE not in ASCII", rrule("FREQ=DA\u0131LY;INTERVAL=2"), "rrule",
     "at character 8 ('\u0131'): RRULE text is ASCII only"),
    ("RRULE digits not in ASCII", rrule("FREQ=DAILY;INTERVAL=\u0662"), "rrule",
     "at character 21 ('\u0662'): RRULE text is ASCII only"),
    ("interval 0", rrule("FREQ=DAILY;INTERVAL=0"), "rrule",
     "INTERVAL=0 must be between 1 and 10000"),
    ("count 0", rrule("FREQ=DAILY;COUNT=0"), "count", "COUNT=0 must be between 1 and 1000"),
    ("count negative", rrule("FREQ=DAILY;COUNT=-3"), "count",
     "COUNT=-3 must be between 1 and 1000"),
    ("count and until", rrule("FREQ=DAILY;COUNT=3;UNTIL=20270101"), "rrule",
     "COUNT and UNTIL cannot both be given"),
    ("bad until", rrule("FREQ=DAILY;UNTIL=tomorrow"), "until",
     "UNTIL=TOMORROW is not YYYYMMDD or YYYYMMDDTHHMMSS[Z]"),
    ("until before start", rrule("FREQ=DAILY;UNTIL=20260101T000000Z"), "until",
     "end 2025-12-31T19:00:00 (2026-01-01T00:00:00Z) is before the start"
     " 2026-10-20T08:00:00, America/New_York"),
    ("feb 30", rrule("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30"), "rrule",
     "never occurs: no occurrence within 400 years of the start"),
    # RFC 5545 counts a monthly rule's ordinals, and a yearly one's with BYMONTH, in the
    # month: a 6th never matches (a plain day beside it rang alone, described as both).
    ("6th monday", rrule("FREQ=MONTHLY;BYDAY=6MO"), "rrule",
     "BYDAY: ordinal in 6MO must be 1..5 or -5..-1 with FREQ=MONTHLY (a month holds at"
     " most 5 of a weekday)"),
    ("a 6th beside a plain day", rrule("FREQ=MONTHLY;BYDAY=MO,6FR"), "rrule",
     "BYDAY: ordinal in 6FR must be 1..5 or -5..-1 with FREQ=MONTHLY (a month holds at"
     " most 5 of a weekday)"),
    ("a 10th in a month", rrule("FREQ=YEARLY;BYMONTH=1;BYDAY=1TU,10MO"), "rrule",
     "BYDAY: ordinal in 10MO must be 1..5 or -5..-1 with FREQ=YEARLY and BYMONTH (a month"
     " holds at most 5 of a weekday)"),
    ("interval misses weekday", rrule("FREQ=DAILY;INTERVAL=7;BYDAY=MO"), "rrule",
     "never occurs: no occurrence within 400 years of the start"),
    ("interval misses hour", rrule("FREQ=HOURLY;INTERVAL=48;BYHOUR=9"), "rrule",
     "never occurs: no occurrence within 400 years of the start"),
    ("ends before first", rrule("FREQ=YEARLY;BYMONTH=1;UNTIL=20261231"), "rrule",
     "never occurs between the start and its end"),
    ("not every", repeat("each day 08:00"), "repeat",
     "at character 1 ('each'): expected 'every'"),
    ("no unit", repeat("every"), "repeat",
     "at end of input: expected a unit (hours, day, week, month, year) or a weekday"),
    ("bad unit", repeat("every fortnight 08:00"), "repeat",
     "at character 7 ('fortnight'): expected a unit (hours, day, week, month, year) or a weekday"),
    ("no time", repeat("every day"), "repeat", "at end of input: expected a time HH:MM"),
    ("bad time", repeat("every day 24:00"), "repeat",
     "at character 11 ('24:00'): expected a time HH:MM between 00:00 and 23:59"),
    ("bad char", repeat("every day 08:00 !"), "repeat", "at character 17: unexpected '!'"),
    # str.lower() turns "İ" into two characters: positions must count the caller's.
    ("dotted capital I", repeat("every day 08:00 İ"), "repeat", "at character 17: unexpected 'İ'"),
    ("after a dotted I", repeat("every İİ 09:00"), "repeat", "at character 7: unexpected 'İ'"),
    ("trailing", repeat("every day 08:00 please"), "repeat",
     "at character 17 ('please'): expected the end, or 'until YYYY-MM-DD' or 'for N times'"),
    ("month without on", repeat("every month 09:00"), "repeat",
     "at character 13 ('09:00'): expected 'on' (e.g. every month on the 1st 09:00)"),
    ("32nd", repeat("every month on the 32nd 09:00"), "repeat",
     "at character 20 ('32nd'): expected a day of the month 1..31"),
    ("bad month", repeat("every year on Smarch 3 09:00"), "repeat",
     "at character 15 ('smarch'): expected a month name (Jan..Dec)"),
    # A month's length said where the day is written (answered after a 400-year search).
    ("grammar feb 30", repeat("every year on Feb 30 09:00"), "repeat",
     "at character 19 ('30'): expected a day 1..29 (February has 29 days in leap years)"),
    ("grammar apr 31", repeat("every year on Apr 31 09:00"), "repeat",
     "at character 19 ('31'): expected a day 1..30 (April has 30 days)"),
    ("for 0 times", repeat("every day 08:00 for 0 times"), "count",
     "count=0 must be between 1 and 1000"),
    ("bad date", repeat("every day 08:00 until 2027-02-30"), "repeat",
     "at character 23 ('2027-02-30'): expected a valid date YYYY-MM-DD"),
    ("grammar until before start", repeat("every day 08:00 until 2026-01-01"), "until",
     "end 2026-01-01T23:59:59 (2026-01-02T04:59:59Z) is before the start"
     " 2026-10-20T08:00:00, America/New_York"),
    # Local times are written date, "T", time to the minute or second, as RFC 3339 does:
    # the parser's other forms would each be read silently (a lost time, midnight).
    *[
        (f"local time {text!r}", lambda text=text: parse_local_datetime(text, "at"), "at",
         f"{text!r} is not a local date-time YYYY-MM-DDTHH:MM[:SS]")
        for text in ("2026-12-10", "2026-12-10T09:30:45.5", "2026-12-20 09:00:00",
                     "20261220T090000", "2026-W52-1T09:00", "\u0662\u0660\u0662\u0666-12-10T09:30")
    ],
    ("other digits in an expression", repeat("every day \u0660\u0669:\u0660\u0660"), "repeat",
     "at character 11: unexpected '\u0660'"),
    ("local time with an offset", lambda: parse_local_datetime("2026-12-10T09:30Z", "at"), "at",
     "'2026-12-10T09:30Z' must be a local time without offset"),
    ("aware local", lambda: one_off_local(datetime(2026, 11, 1, tzinfo=UTC), NY), "at",
     "2026-11-01T00:00:00+00:00 must be a local time without offset"),
    ("naive instant", lambda: one_off_instant(datetime(2026, 11, 1)), "at",
     "2026-11-01T00:00:00 must be an aware instant"),
    ("aware start", lambda: parse_rrule("FREQ=DAILY", NY, NOW), "start",
     "2026-10-20T12:00:00+00:00 must be a local time without offset"),
    ("one-off in the past",
     lambda: validate_new(one_off_local(datetime(2026, 10, 20, 7, 59), NY), NOW), "at",
     "2026-10-20T07:59:00 in America/New_York (2026-10-20T11:59:00Z) is in the past"),
    ("repeat ended",
     lambda: validate_new(parse_rrule("FREQ=DAILY;COUNT=1", NY, datetime(2026, 10, 19)), NOW),
     "repeat",
     "no occurrence at or after 2026-10-20T12:00:00Z"),
    # A ring's bucket entry must fit Cassandra's 20-year TTL: nothing rings more than 10
    # years after now or after the ring before it.
    ("one-off over 10 years ahead",
     lambda: validate_new(one_off_local(datetime(2036, 10, 21, 9), NY), NOW), "at",
     "the first ring must be within 10 years from now"),
    ("repeat starting over 10 years ahead",
     lambda: validate_new(parse_rrule("FREQ=DAILY", NY, datetime(2036, 10, 21)), NOW), "start",
     "the first ring must be within 10 years from now"),
    # Periods over 10 years apart, refused when parsed: the rings of the first 12 alone
    # were checked, and 24 a day every 30 years passed.
    ("rrule rings 11 years apart", rrule("FREQ=YEARLY;INTERVAL=11"), "rrule",
     "INTERVAL=11 with FREQ=YEARLY puts rings over 10 years apart: at most INTERVAL=10"),
    ("grammar rings 25 years apart", repeat("every 25 years on Nov 1 09:00"), "repeat",
     "every 25 years puts rings over 10 years apart: at most every 10 years"),
    ("leap days 20 years apart",
     lambda: validate_new(
         parse_rrule("FREQ=YEARLY;INTERVAL=5;BYMONTH=2;BYMONTHDAY=29", NY, datetime(2028, 1, 1)),
         NOW),
     "rule", "rings must be at most 10 years apart"),
    ("rings 401 years apart: one within the search's 400 years",
     rrule("FREQ=YEARLY;INTERVAL=401"), "rrule",
     "INTERVAL=401 with FREQ=YEARLY puts rings over 10 years apart: at most INTERVAL=10"),
    ("a gap only after the first rings",  # 2027, 2029, 2031, then 2052
     lambda: validate_new(
         parse_rrule("FREQ=MONTHLY;INTERVAL=25;BYMONTH=1,2,3", NY, datetime(2027, 1, 15)), NOW),
     "rule", "rings must be at most 10 years apart"),
    # Dates near datetime's own limits (years 1 and 9999): zone offsets and the search
    # around an end overflowed there (OverflowError, answered INTERNAL by the API).
    ("UNTIL in year 9999", rrule("FREQ=DAILY;UNTIL=99991231"), "until",
     "the year must be 1900 to 8999"),
    ("UTC UNTIL in year 9999", rrule("FREQ=DAILY;UNTIL=99991229T000000Z"), "until",
     "the year must be 1900 to 8999"),
    ("local UNTIL in year 1", lambda: parse_rrule("FREQ=DAILY;UNTIL=00010101T000000", "Asia/Tokyo",
                                                  START),
     "until", "the year must be 1900 to 8999"),
    ("until 9999-12-31", repeat("every day 09:00 until 9999-12-31"), "until",
     "the year must be 1900 to 8999"),
    # A UTC UNTIL is checked where the schedule's dates are, in its zone.
    ("UTC UNTIL in range, past it in the zone",
     lambda: parse_rrule("FREQ=DAILY;UNTIL=89991231T230000Z", "Asia/Tokyo", START), "until",
     "UNTIL=89991231T230000Z is 9000-01-01T08:00:00 in Asia/Tokyo: the year must be 1900 to"
     " 8999"),
    ("one-off in year 1", lambda: one_off_local(datetime(1, 1, 1), "Asia/Tokyo"), "at",
     "the year must be 1900 to 8999"),
    ("one-off at datetime's last minute", lambda: one_off_local(datetime(9999, 12, 31, 23, 59), NY),
     "at", "the year must be 1900 to 8999"),
    ("instant in year 1", lambda: one_off_instant(datetime(1, 1, 1, tzinfo=UTC)), "at",
     "the year must be 1900 to 8999"),
    ("repeat starting in year 9000", lambda: parse_repeat("every day 09:00", NY,
                                                          datetime(9000, 1, 1)),
     "start", "the year must be 1900 to 8999"),
]  # fmt: skip


@pytest.mark.parametrize(
    "make",
    [
        lambda: parse_rrule("FREQ=DAILY;UNTIL=89991231", "Etc/GMT+12", datetime(8999, 12, 31, 23)),
        lambda: parse_repeat("every day 23:00 until 8999-12-31", NY, datetime(8999, 12, 31)),
        lambda: parse_rrule("FREQ=DAILY;UNTIL=19000101T050000", "Asia/Tokyo", datetime(1900, 1, 1)),
    ],
    ids=["west of UTC, in 9000 there", "in New York, in 9000 in UTC", "Tokyo, in 1899 in UTC"],
)
def test_an_end_in_range_where_the_schedule_is_is_accepted_whatever_its_utc_year(
    make: Callable[[], Repeat],
) -> None:
    """Stored in UTC, it is outside 1900-8999 there: reading the stored form back for the
    first ring refused it ("until: the year must be 1900 to 8999")."""
    made = make()
    assert parse_rrule(made.rrule, made.zone, made.start) == made  # sent back as stored
    assert len(occurrences(made, datetime(1899, 12, 1, tzinfo=UTC), 2)) == 1


def test_rings_exactly_10_years_apart_and_ahead_are_accepted() -> None:
    every_10_years = parse_rrule("FREQ=YEARLY;INTERVAL=10", NY, datetime(2036, 10, 20, 7))
    assert validate_new(every_10_years, NOW) == datetime(2036, 10, 20, 11, tzinfo=UTC)


@pytest.mark.parametrize(
    ("call", "field", "message"),
    [pytest.param(call, field, message, id=name) for name, call, field, message in BAD_INPUTS],
)
def test_bad_input(call: Callable[[], object], field: str, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        call()
    assert (caught.value.field, caught.value.message) == (field, message)
    assert str(caught.value) == f"{field}: {message}"


def refusal(make: Callable[[], object]) -> tuple[str, str]:
    with pytest.raises(ScheduleError) as refused:
        make()
    return refused.value.field, refused.value.message


@pytest.mark.parametrize(
    ("rule", "expression", "most"),
    [
        ("FREQ=YEARLY;BYMONTH=5;BYMONTHDAY=2", f"years on May 2 {EVERY_HOUR_AT_00}", 10),
        ("FREQ=MONTHLY;BYMONTHDAY=2", "months on the 2nd 09:00", 120),
        ("FREQ=WEEKLY;BYDAY=MO", "weeks on Mon 09:00", 521),
        ("FREQ=DAILY", "days 09:00", 3652),
    ],
    ids=["yearly", "monthly", "weekly", "daily"],
)
def test_periods_over_ten_years_apart_are_refused_when_made(
    rule: str, expression: str, most: int
) -> None:
    """Up to 10 years of periods, in both grammars. Every 30 years at every hour of May 2
    passed (its first 12 rings an hour apart, the 25th 30 years on), and every 401 years
    ended after one day, the 400 years a search looks ahead."""
    assert validate_new(parse_rrule(f"{rule};INTERVAL={most}", NY, START), NOW)
    assert validate_new(parse_repeat(f"every {most} {expression}", NY, START), NOW)
    freq, unit = rule.split(";")[0], expression.split()[0]
    assert refusal(rrule(f"{rule};INTERVAL={most + 1}")) == (
        "rrule",
        f"INTERVAL={most + 1} with {freq} puts rings over 10 years apart: at most INTERVAL={most}",
    )
    assert refusal(repeat(f"every {most + 1} {expression}")) == (
        "repeat",
        f"every {most + 1} {unit} puts rings over 10 years apart: at most every {most} {unit}",
    )


def test_a_repeat_that_ends_after_one_ring_is_not_refused_for_its_spacing() -> None:
    """Its one ring has no next: no gap to refuse (COUNT=1, or an UNTIL before the next).
    Leap days every 5 years from 2028: 2028, then 2048."""
    leap_days = "FREQ=YEARLY;INTERVAL=5;BYMONTH=2;BYMONTHDAY=29"
    for text in (f"{leap_days};COUNT=1", f"{leap_days};UNTIL=20300101"):
        schedule = parse_rrule(text, NY, datetime(2028, 1, 1, 9))
        assert validate_new(schedule, NOW) == datetime(2028, 2, 29, 14, tzinfo=UTC), text


@pytest.mark.parametrize("start_given", [True, False], ids=["start given", "no start"])
@pytest.mark.parametrize(
    ("text", "message"),
    [pytest.param(text, message, id=held) for held, text, message in NEVER_PICKED],
)
def test_a_set_position_no_period_holds_is_refused_without_a_search(
    text: str, message: str, start_given: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted from the rule at once (a search for its first ring took 60-120 ms, and
    without a start it was made twice)."""

    def no_search(repeat: Repeat) -> None:
        raise AssertionError(f"searched for a ring of {repeat.rrule}")

    monkeypatch.setattr(build, "first_ring", no_search)
    with pytest.raises(ScheduleError) as caught:
        parse_rrule(text, NY, START, start_given=start_given)
    assert (caught.value.field, caught.value.message) == ("rrule", f"never occurs: {message}")


def test_a_rule_that_never_rings_is_searched_once_without_a_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where INTERVAL=1 finds no first match, the rule (some of its periods) has none:
    refused then, not searched again counted from now."""
    searches: list[Repeat] = []

    def counted(repeat: Repeat) -> datetime | None:
        searches.append(repeat)
        return first_ring(repeat)

    monkeypatch.setattr(build, "first_ring", counted)
    with pytest.raises(ScheduleError) as caught:
        parse_rrule("FREQ=YEARLY;INTERVAL=2;BYMONTH=2;BYMONTHDAY=30", NY, START, start_given=False)
    assert caught.value.message == "never occurs: no occurrence within 400 years of the start"
    assert len(searches) == 1


def test_monthly_and_yearly_count_a_months_times_alike() -> None:
    """February's Mondays at 12 hours: up to 60 times in a month or a year (a monthly
    rule was refused as "up to 372", every day of a 31-day month)."""
    hours = ",".join(str(hour) for hour in range(12))
    first = [
        occurrences(
            parse_rrule(f"FREQ={freq};BYMONTH=2;BYDAY=MO;BYHOUR={hours};BYSETPOS=60", NY, START),
            NOW,
            1,
        )
        for freq in ("MONTHLY", "YEARLY")
    ]
    # 2044 is the next leap year whose February begins on a Monday: 5 Mondays.
    assert first == [[datetime(2044, 2, 29, 16, 0, tzinfo=UTC)]] * 2
