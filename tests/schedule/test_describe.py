"""Descriptions say what rings: RFC 5545's reading of each rule's day parts, in words."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from reminders_svc.schedule import occurrences, one_off_local, parse_repeat, parse_rrule
from reminders_svc.schedule.describe import describe

START = datetime(2027, 1, 31, 9, 0)  # a Sunday, the 31st: short months show


@pytest.mark.parametrize(
    ("rrule", "described"),
    [
        ("FREQ=DAILY", "Every day"),
        ("FREQ=DAILY;BYDAY=MO,TU,WE,TH,FR", "Every weekday"),
        ("FREQ=WEEKLY;BYDAY=MO", "Every Monday"),
        ("FREQ=WEEKLY;INTERVAL=2;BYDAY=TU,TH", "Every 2 weeks on Tuesday and Thursday"),
        # Each of them rings ("on weekday" read as one day).
        ("FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,TU,WE,TH,FR", "Every 2 weeks on weekdays"),
        ("FREQ=WEEKLY;INTERVAL=2;BYDAY=SA,SU", "Every 2 weeks on weekend days"),
        # A weekly rule without days rings on the start's weekday.
        ("FREQ=WEEKLY", "Every Sunday"),
        ("FREQ=WEEKLY;INTERVAL=2;BYMONTH=1,2", "Every 2 weeks on Sunday in January and February"),
        # Hours, or every few days, ring on those days: not once a day.
        ("FREQ=DAILY;INTERVAL=2;BYDAY=MO", "Every 2 days on Monday"),
        # A plain weekday in a monthly or yearly rule is every such day of the period.
        ("FREQ=MONTHLY;BYDAY=MO", "Every Monday"),
        ("FREQ=MONTHLY;INTERVAL=2;BYDAY=MO", "Every Monday of every 2 months"),
        ("FREQ=YEARLY;BYDAY=MO", "Every Monday"),
        ("FREQ=MONTHLY;BYDAY=-1FR", "Every month on the last Friday"),
        ("FREQ=YEARLY;BYDAY=20MO", "Every year on the 20th Monday of the year"),
        ("FREQ=YEARLY;BYMONTH=10;BYDAY=-1FR", "Every year on the last Friday in October"),
        # Plain days and ordinals, a union: each plain day rings all through the period
        # (this read "on the last Friday and Monday", as if the month's last Monday).
        ("FREQ=MONTHLY;BYDAY=MO,-1FR", "Every Monday and the last Friday of the month"),
        (
            "FREQ=MONTHLY;INTERVAL=2;BYDAY=MO,TU,WE,TH,FR,-1SA",
            "Every weekday and the last Saturday of every 2 months",
        ),
        ("FREQ=YEARLY;BYMONTH=3;BYDAY=MO,1FR", "Every Monday and the 1st Friday in March"),
        ("FREQ=YEARLY;BYDAY=TU,20MO", "Every Tuesday and the 20th Monday of the year"),
        # A yearly rule's month days without months fall in every month.
        ("FREQ=YEARLY;BYMONTHDAY=15", "Every month on the 15th day"),
        ("FREQ=YEARLY;INTERVAL=2;BYMONTHDAY=15", "Every month of every 2 years on the 15th day"),
        ("FREQ=MONTHLY;BYMONTHDAY=-1", "Every month on the last day"),
        ("FREQ=YEARLY;BYMONTH=10;BYMONTHDAY=26", "Every year on October 26"),
        # Without day parts, the day (and a yearly rule's month) is the start's.
        ("FREQ=MONTHLY", "Every month on the 31st day at 09:00, skipped in months without one"),
        ("FREQ=YEARLY", "Every year on January 31"),
        ("FREQ=YEARLY;BYMONTH=1,3", "Every year on the 31st day in January and March"),
    ],
)
def test_a_rule_is_described_as_it_rings(rrule: str, described: str) -> None:
    if " at 09:00" not in described:
        described += " at 09:00"
    assert describe(parse_rrule(rrule, "UTC", START)) == f"{described}, from 2027-01-31, UTC"


@pytest.mark.parametrize(
    ("rrule", "described"),
    [
        (
            "FREQ=MONTHLY;BYMONTHDAY=29",
            "Every month on the 29th day at 09:00, skipped in months without one",
        ),
        ("FREQ=MONTHLY;BYMONTHDAY=28", "Every month on the 28th day at 09:00"),
        (
            "FREQ=MONTHLY;BYMONTHDAY=1,31",
            "Every month on the 1st and 31st day at 09:00, the 31st skipped in months without one",
        ),
        (
            "FREQ=MONTHLY;BYMONTHDAY=-30,-31",
            "Every month on the 31st to last and 30th to last"
            " day at 09:00, the 31st to last and 30th to last skipped in months without them",
        ),
        (
            "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29",
            "Every year on February 29 at 09:00, only in leap years",
        ),
        (  # the 28th rings every year
            "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=28,29",
            "Every year on the 28th and 29th day in February at 09:00, the 29th only in leap years",
        ),
        (  # no February holds a 30th: accepted for the 28th, and said never to ring
            "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=28,30",
            "Every year on the 28th and 30th day in February at 09:00, the 30th never",
        ),
        (
            "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=1,29,-31",
            "Every year on the 31st to last, 1st and 29th day in February at 09:00, the 29th"
            " only in leap years, the 31st to last never",
        ),
        (
            "FREQ=YEARLY;BYMONTH=1,3;BYMONTHDAY=31",
            "Every year on the 31st day in January and March at 09:00",
        ),
        (
            "FREQ=YEARLY;BYMONTH=3,4;BYMONTHDAY=31",
            "Every year on the 31st day in March and April at 09:00, skipped in months without one",
        ),
        (
            "FREQ=DAILY;BYMONTHDAY=31",
            "Every day on the 31st day at 09:00, skipped in months without one",
        ),
        (
            "FREQ=MONTHLY;BYDAY=5FR",
            "Every month on the 5th Friday at 09:00, skipped in months without one",
        ),
        (
            "FREQ=MONTHLY;BYDAY=1MO,-5FR",
            "Every month on the 5th to last Friday and 1st Monday"
            " at 09:00, the 5th to last Friday skipped in months without one",
        ),
        (
            "FREQ=YEARLY;BYMONTH=10;BYDAY=5SU",
            "Every year on the 5th Sunday in October at 09:00, skipped in months without one",
        ),
        (
            "FREQ=MONTHLY;BYDAY=MO,5FR",
            "Every Monday and the 5th Friday of the month at 09:00, the 5th Friday skipped in"
            " months without one",
        ),
        # Counted in the year (no BYMONTH): every year holds 52 Mondays, some a 53rd.
        (
            "FREQ=YEARLY;BYDAY=53MO",
            "Every year on the 53rd Monday of the year at 09:00, skipped in years without one",
        ),
        (
            "FREQ=YEARLY;BYDAY=MO,-53FR",
            "Every Monday and the 53rd to last Friday of the year at 09:00, the 53rd to last"
            " Friday skipped in years without one",
        ),
        ("FREQ=YEARLY;BYDAY=52MO", "Every year on the 52nd Monday of the year at 09:00"),
        # A set position picks from what each period holds: nothing named is skipped.
        (
            "FREQ=MONTHLY;BYMONTHDAY=30,31;BYSETPOS=-1",
            "Every month on the 30th and 31st day at 09:00, keeping the last of each month",
        ),
    ],
)
def test_a_day_some_months_lack_is_said_to_be_skipped_in_them(rrule: str, described: str) -> None:
    """RFC 5545 skips a day a month lacks: a monthly 31st rings 7 times a year, and every 2
    months from the 31st of December rings in December and August, then October."""
    assert describe(parse_rrule(rrule, "UTC", START)) == f"{described}, from 2027-01-31, UTC"


@pytest.mark.parametrize(
    ("rrule", "described"),
    [
        ("FREQ=HOURLY;BYDAY=MO", "Every hour on Monday at :00"),
        ("FREQ=HOURLY;INTERVAL=2;BYDAY=MO,TU", "Every 2 hours on Monday and Tuesday at :00"),
        ("FREQ=HOURLY;BYHOUR=9,10,11", "Every hour in the hours 09:00, 10:00 and 11:00"),
        # Only the hours the steps from the start (09:00) land on: 10:00 never rings.
        ("FREQ=HOURLY;INTERVAL=2;BYHOUR=9,10", "Every 2 hours in the hour 09:00"),
        ("FREQ=HOURLY;INTERVAL=3;BYHOUR=9,12,13", "Every 3 hours in the hours 09:00 and 12:00"),
        # Steps that do not fit a day land on other hours each day.
        (
            "FREQ=HOURLY;INTERVAL=5;BYHOUR=9,10,11",
            "Every 5 hours in the hours 09:00, 10:00 and 11:00 that 5-hour steps from the"
            " start reach",
        ),
    ],
)
def test_an_hourly_rule_is_described_as_ringing_every_hour(rrule: str, described: str) -> None:
    assert describe(parse_rrule(rrule, "UTC", START)) == f"{described}, from 2027-01-31, UTC"


def test_what_the_descriptions_of_rfc_5545s_readings_claim_is_what_rings() -> None:
    def first(rrule: str, count: int) -> list[str]:
        rings = occurrences(parse_rrule(rrule, "UTC", START), START.replace(tzinfo=UTC), count)
        return [f"{ring:%m-%d}" for ring in rings]

    assert first("FREQ=YEARLY;BYDAY=MO", 3) == ["02-01", "02-08", "02-15"]  # every Monday
    assert first("FREQ=YEARLY;BYMONTHDAY=15", 3) == ["02-15", "03-15", "04-15"]  # every month
    assert first("FREQ=MONTHLY", 3) == ["01-31", "03-31", "05-31"]  # the 31st: short skipped
    assert first("FREQ=MONTHLY;BYDAY=MO", 2) == ["02-01", "02-08"]  # every Monday
    # Every Monday and the last Friday of the month.
    assert first("FREQ=MONTHLY;BYDAY=MO,-1FR", 6) == [
        "02-01",
        "02-08",
        "02-15",
        "02-22",
        "02-26",
        "03-01",
    ]
    assert first("FREQ=YEARLY;BYMONTH=3;BYDAY=MO,1FR", 3) == ["03-01", "03-05", "03-08"]
    # A 53rd Monday: in 2029 and 2035, which begin on a Monday, not in the years between.
    rings = occurrences(
        parse_rrule("FREQ=YEARLY;BYDAY=53MO", "UTC", START), START.replace(tzinfo=UTC), 2
    )
    assert [f"{ring:%Y-%m-%d}" for ring in rings] == ["2029-12-31", "2035-12-31"]


def test_the_grammars_expressions_read_back_as_written() -> None:
    for expression, described in [
        ("every weekday 07:30", "Every weekday at 07:30"),
        ("every month on the last Fri 17:00", "Every month on the last Friday at 17:00"),
        ("every month on the 2nd Tue 09:00", "Every month on the 2nd Tuesday at 09:00"),
        ("every year on Oct 26 09:00", "Every year on October 26 at 09:00"),
        ("every 2 weeks on Tue,Thu 18:00", "Every 2 weeks on Tuesday and Thursday at 18:00"),
        ("every 2nd Tuesday 18:00", "Every month on the 2nd Tuesday at 18:00"),
        ("every last Friday 17:00", "Every month on the last Friday at 17:00"),
        ("every Mondays 09:00", "Every Monday at 09:00"),
        ("every day 08:00,20:00", "Every day at 08:00 and 20:00"),
    ]:
        text = describe(parse_repeat(expression, "UTC", START))
        assert text == f"{described}, from 2027-01-31, UTC", expression


@pytest.mark.parametrize(
    ("local", "described"),
    [
        (datetime(2027, 1, 10, 9, 0), "Once on 2027-01-10 at 09:00, America/New_York"),
        (datetime(2027, 1, 10, 13, 44, 11), "Once on 2027-01-10 at 13:44:11, America/New_York"),
        # A time the spring-forward change skips rings an hour later (docs/time.md): said.
        (
            datetime(2027, 3, 14, 2, 30),
            "Once on 2027-03-14 at 02:30 (rings at 03:30: the clock change skips 02:30),"
            " America/New_York",
        ),
        # A repeated time rings at its first instance, which is the time as written.
        (datetime(2027, 11, 7, 1, 30), "Once on 2027-11-07 at 01:30, America/New_York"),
    ],
    ids=["plain", "seconds", "spring-forward gap", "fall-back overlap"],
)
def test_a_one_off_is_described_at_the_wall_time_it_rings(local: datetime, described: str) -> None:
    assert describe(one_off_local(local, "America/New_York")) == described


def test_a_one_off_on_a_day_the_zone_skipped_is_described_ringing_the_next_day() -> None:
    """Pacific/Apia skipped 2011-12-30 whole: its 10:00 rings on the 31st, and says so."""
    assert describe(one_off_local(datetime(2011, 12, 30, 10, 0), "Pacific/Apia")) == (
        "Once on 2011-12-30 at 10:00 (rings at 2011-12-31 10:00: the clock change skips"
        " 10:00), Pacific/Apia"
    )


@pytest.mark.parametrize(("count", "said"), [(1, "1 time"), (3, "3 times")])
def test_a_count_is_said_in_words_that_agree(count: int, said: str) -> None:
    repeat = parse_repeat(f"every day 09:00 for {count} times", "UTC", START)
    assert f", {said}, UTC" in describe(repeat)
