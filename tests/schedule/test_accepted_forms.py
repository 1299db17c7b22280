"""Ways of writing a repeat that are accepted, each with the canonical rule it makes: the
same as its plainest spelling's."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from reminders_svc.schedule import Repeat, occurrences, parse_repeat, parse_rrule

START = datetime(2026, 10, 20, 8, 0)
NY = "America/New_York"


@pytest.mark.parametrize(
    ("expression", "rrule"),
    [
        # An nth weekday rings once a month, as "every month on the ..." does (these were
        # refused with a hint to write "every 2 weeks on Tue", another schedule).
        ("every 2nd Tuesday 18:00", "FREQ=MONTHLY;BYDAY=2TU;BYHOUR=18;BYMINUTE=0"),
        ("every month on the 2nd Tue 18:00", "FREQ=MONTHLY;BYDAY=2TU;BYHOUR=18;BYMINUTE=0"),
        ("every 1st Monday 09:00", "FREQ=MONTHLY;BYDAY=1MO;BYHOUR=9;BYMINUTE=0"),
        ("every first Monday at 09:00", "FREQ=MONTHLY;BYDAY=1MO;BYHOUR=9;BYMINUTE=0"),
        ("every last Friday 17:00", "FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=17;BYMINUTE=0"),
        ("every month on the last Fri 17:00", "FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=17;BYMINUTE=0"),
        (
            "every 5th Sunday 10:00 for 3 times",
            "FREQ=MONTHLY;COUNT=3;BYDAY=5SU;BYHOUR=10;BYMINUTE=0",
        ),
        # Weekdays in the plural, as "every days" and "every weekdays" are read.
        ("every Mondays 09:00", "FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0"),
        ("every Monday 09:00", "FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0"),
        ("every Tuesdays,Thursdays 18:00", "FREQ=WEEKLY;BYDAY=TU,TH;BYHOUR=18;BYMINUTE=0"),
        (
            "every 2 weeks on Saturdays,Sundays 10:00",
            "FREQ=WEEKLY;INTERVAL=2;BYDAY=SA,SU;BYHOUR=10;BYMINUTE=0",
        ),
        ("every weekdays 07:30", "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;BYHOUR=7;BYMINUTE=30"),
        # Several times a day at one minute: one rule (BYMINUTE takes one value).
        ("every day 08:00,20:00", "FREQ=DAILY;BYHOUR=8,20;BYMINUTE=0"),
        ("every day at 20:30,08:30,20:30", "FREQ=DAILY;BYHOUR=8,20;BYMINUTE=30"),
        ("every Mon,Fri 09:15,17:15", "FREQ=WEEKLY;BYDAY=MO,FR;BYHOUR=9,17;BYMINUTE=15"),
        # February 29 rings in leap years (the 30th is refused, naming February's length).
        ("every year on Feb 29 09:00", "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29;BYHOUR=9;BYMINUTE=0"),
        ("every year on Apr 30 09:00", "FREQ=YEARLY;BYMONTH=4;BYMONTHDAY=30;BYHOUR=9;BYMINUTE=0"),
    ],
)
def test_an_expression_makes_its_rule(expression: str, rrule: str) -> None:
    assert parse_repeat(expression, NY, START) == Repeat(rrule, NY, START)


@pytest.mark.parametrize(
    ("text", "rrule"),
    [
        ("RRULE:FREQ=DAILY", "FREQ=DAILY"),
        ("RRULE:FREQ=DAILY\r\n", "FREQ=DAILY"),
        ("\nFREQ=WEEKLY;BYDAY=MO\n", "FREQ=WEEKLY;BYDAY=MO"),
        # Leading zeros, as every other number part takes them (BYSECOND=00 was refused).
        ("FREQ=DAILY;BYSECOND=00", "FREQ=DAILY"),
        ("FREQ=DAILY;BYSECOND=0;BYHOUR=07;BYMINUTE=05", "FREQ=DAILY;BYHOUR=7;BYMINUTE=5"),
        # Ordinals past a month's 5th count in the year without BYMONTH (RFC 5545).
        ("FREQ=YEARLY;BYDAY=53MO", "FREQ=YEARLY;BYDAY=53MO"),
    ],
)
def test_an_rrule_makes_its_canonical_rule(text: str, rrule: str) -> None:
    assert parse_rrule(text, NY, START) == Repeat(rrule, NY, START)


def test_an_nth_weekday_rings_once_a_month() -> None:
    rings = occurrences(
        parse_repeat("every 2nd Tuesday 18:00", "UTC", START), START.replace(tzinfo=UTC), 3
    )
    assert [f"{ring:%Y-%m-%d %H:%M}" for ring in rings] == [
        "2026-11-10 18:00",
        "2026-12-08 18:00",
        "2027-01-12 18:00",
    ]


def test_a_stored_rule_made_before_a_refusal_keeps_ringing() -> None:
    """A 6th Friday (never a month's) beside Monday, and the placeholder zone, are refused
    when made; stored before that, the rule rings as it did (every Monday)."""
    for zone in ("UTC", "Factory"):
        stored = Repeat("FREQ=MONTHLY;BYDAY=MO,6FR", zone, datetime(2026, 10, 19, 9, 0))
        rings = occurrences(stored, datetime(2026, 10, 20, tzinfo=UTC), 2)
        assert [f"{ring:%a %m-%d %H:%M}" for ring in rings] == [
            "Mon 10-26 09:00",
            "Mon 11-02 09:00",
        ]
