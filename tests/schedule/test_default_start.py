"""A repeat given no start: an INTERVAL above 1 counts its periods from the first one that
rings, not from now's (which skipped the next matching day: "every 2 weeks on Monday",
made on a Sunday, first rang 8 days later)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

from reminders_svc.schedule import ScheduleError, occurrences, parse_repeat, parse_rrule
from reminders_svc.schedule.model import Repeat
from reminders_svc.schedule.rule import parse_rule_text
from reminders_svc.schedule.zones import load_zone, start_from, zone_names
from tests.schedule.test_properties import SETTINGS, rules

NEW_YORK = "America/New_York"


def made_at(now: datetime, expression: str, zone: str = NEW_YORK) -> list[str]:
    """The first three rings, local, of `expression` made at `now` with no start."""
    zone_info = load_zone(zone)
    repeat = parse_repeat(expression, zone, start_from(now, zone_info), start_given=False)
    return [f"{ring.astimezone(zone_info):%a %m-%d %H:%M}" for ring in occurrences(repeat, now, 3)]


@pytest.mark.parametrize(
    ("now", "expression", "rings"),
    [
        # A Sunday: tomorrow, not 8 days on.
        (
            datetime(2026, 12, 13, 15, 0, tzinfo=UTC),
            "every 2 weeks on Mon 09:00",
            ["Mon 12-14 09:00", "Mon 12-28 09:00", "Mon 01-11 09:00"],
        ),
        # DESIGN.md's example, made on a Friday: the coming Tuesday, not 11 days on.
        (
            datetime(2026, 12, 11, 15, 0, tzinfo=UTC),
            "every 2 weeks on Tue,Thu 18:00",
            ["Tue 12-15 18:00", "Thu 12-17 18:00", "Tue 12-29 18:00"],
        ),
        # January 1, not March 1 (the series Jan/Apr/Jul/Oct, not Mar/Jun/Sep/Dec).
        (
            datetime(2026, 12, 8, 15, 0, tzinfo=UTC),
            "every 3 months on the 1st 09:00",
            ["Fri 01-01 09:00", "Thu 04-01 09:00", "Thu 07-01 09:00"],
        ),
        # Past today's 08:00: tomorrow, not the day after.
        (
            datetime(2026, 12, 8, 17, 0, tzinfo=UTC),
            "every 2 days 08:00",
            ["Wed 12-09 08:00", "Fri 12-11 08:00", "Sun 12-13 08:00"],
        ),
        # With an end counted from the first ring.
        (
            datetime(2026, 12, 13, 15, 0, tzinfo=UTC),
            "every 2 weeks on Mon 09:00 for 2 times",
            ["Mon 12-14 09:00", "Mon 12-28 09:00"],
        ),
        # INTERVAL=1: as before, from now.
        (
            datetime(2026, 12, 13, 15, 0, tzinfo=UTC),
            "every week on Mon 09:00",
            ["Mon 12-14 09:00", "Mon 12-21 09:00", "Mon 12-28 09:00"],
        ),
    ],
)
def test_the_first_ring_is_the_next_matching_one(
    now: datetime, expression: str, rings: list[str]
) -> None:
    assert made_at(now, expression) == rings


def test_a_start_given_still_counts_from_that_start() -> None:
    """Sunday 2026-12-13's week is period 0: the Monday after it is period 1, skipped."""
    repeat = parse_repeat("every 2 weeks on Mon 09:00", NEW_YORK, datetime(2026, 12, 13, 10, 0))
    first = occurrences(repeat, datetime(2026, 12, 13, 15, 0, tzinfo=UTC), 1)
    assert first == [datetime(2026, 12, 21, 14, 0, tzinfo=UTC)]


def every_period(repeat: Repeat) -> Repeat:
    rule = parse_rule_text(repeat.rrule, load_zone(repeat.zone))
    return dataclasses.replace(repeat, rrule=dataclasses.replace(rule, interval=1).text())


@SETTINGS
@given(
    rule_text=rules().filter(lambda text: "INTERVAL=" in text and "INTERVAL=1;" not in text),
    now=st.datetimes(datetime(2000, 1, 1), datetime(2035, 12, 31)).map(
        lambda naive: naive.replace(tzinfo=UTC)
    ),
    zone=st.sampled_from(sorted(zone_names())),
)
def test_any_rule_made_with_no_start_rings_first_where_every_period_would(
    rule_text: str, now: datetime, zone: str
) -> None:
    """The first ring is the INTERVAL=1 rule's, and the series is the rule's from there
    on; where that ring's wall time does not name it (a clock change), the count is
    from now, as before."""
    start = start_from(now, load_zone(zone))
    from_now = built(rule_text, zone, start, start_given=True)
    made = built(rule_text, zone, start, start_given=False)
    if from_now is not None:
        assert made is not None  # nothing accepted counted from now is refused
    if made is None:
        reject()
    rings = occurrences(made, now, 3)
    if made == from_now:
        assert rings == occurrences(from_now, now, 3)
        return
    assert rings[:1] == occurrences(every_period(made), now, 1)
    assert rings == occurrences(made, rings[0], 3)  # the rule's own series from its start


def built(rule_text: str, zone: str, start: datetime, *, start_given: bool) -> Repeat | None:
    try:
        return parse_rrule(rule_text, zone, start, start_given=start_given)
    except ScheduleError:
        return None


@pytest.mark.parametrize(
    ("now", "expression", "first"),
    [
        # The first match (Mar 14 02:30) is skipped by the clock change, and the rule's end
        # falls before the anchored series' next ring: counted from now, as before (this
        # was refused as "never occurs").
        (
            datetime(2027, 3, 13, 17, 0, tzinfo=UTC),
            "every 2 days 02:30 until 2027-03-15",
            datetime(2027, 3, 15, 6, 30, tzinfo=UTC),
        ),
        # Counted from now (2026) it never rings (no leap year is 4k years on); from its
        # first match, 2028-02-29, it rings every leap day.
        (
            datetime(2026, 12, 8, 15, 0, tzinfo=UTC),
            "every 4 years on Feb 29 09:00",
            datetime(2028, 2, 29, 14, 0, tzinfo=UTC),
        ),
    ],
)
def test_a_rule_valid_either_way_is_accepted(
    now: datetime, expression: str, first: datetime
) -> None:
    repeat = parse_repeat(
        expression, NEW_YORK, start_from(now, load_zone(NEW_YORK)), start_given=False
    )
    assert occurrences(repeat, now, 1) == [first]


def test_a_start_in_a_clock_change_gap_lends_the_rule_its_own_time_of_day() -> None:
    """Made at 01:59:30 New York on the night 02:00 is skipped: "starts now" is 02:00,
    which rings at 03:00 that night. Anchored at that ring, the series took 03:00 for
    good; it stays at 02:00, as the same rule counted every day does."""
    now = datetime(2027, 3, 14, 6, 59, 30, tzinfo=UTC)
    start = start_from(now, load_zone(NEW_YORK))
    every_other_day = parse_rrule("FREQ=DAILY;INTERVAL=2", NEW_YORK, start, start_given=False)
    assert occurrences(every_other_day, now, 3) == [
        datetime(2027, 3, 14, 7, 0, tzinfo=UTC),  # 03:00 EDT: 02:00 does not exist
        datetime(2027, 3, 16, 6, 0, tzinfo=UTC),  # 02:00 EDT
        datetime(2027, 3, 18, 6, 0, tzinfo=UTC),
    ]


@pytest.mark.parametrize(
    ("expression", "rings"),
    [
        ("every hour for 3 times", ["Sun 11-01 02:31", "Sun 11-01 03:31", "Sun 11-01 04:31"]),
        ("every 2 hours", ["Sun 11-01 02:31", "Sun 11-01 04:31", "Sun 11-01 06:31"]),
    ],
)
def test_a_repeat_made_in_a_repeated_hours_second_pass_rings_at_nows_minute(
    expression: str, rings: list[str]
) -> None:
    """Made at 01:30:10 EST on the fall-back night, where 01:31 is first 01:31 EDT, an hour
    ago: at :31, as made an hour earlier, all of a count ahead. It began at the repeated
    hour's end, 02:00, and rang at :00 for good."""
    assert made_at(datetime(2026, 11, 1, 6, 30, 10, tzinfo=UTC), expression) == rings
