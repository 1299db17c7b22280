"""`latest_at_or_before`: the last ring in [since, instant], the misfire policy's question.

Bounds are inclusive on both ends; a one-off has its one ring; a repeat's answer keeps the
zone's local time across DST gaps and folds and honours COUNT and UNTIL. Random rules in
random zones are checked against `occurrences`, which lists the same rings forwards.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

from reminders_svc.schedule import (
    ScheduleError,
    latest_at_or_before,
    occurrences,
    one_off_instant,
    one_off_local,
    parse_repeat,
    parse_rrule,
)
from reminders_svc.schedule.zones import zone_names
from tests.schedule.test_properties import SETTINGS, rules, starts
from tests.schedule.test_seed import NEW_YORK, utc

SECOND = timedelta(seconds=1)
MONDAYS = parse_repeat("every Monday 09:00", NEW_YORK, datetime(2026, 10, 19, 10, 0))


def test_a_one_off_has_its_ring_only_within_both_bounds() -> None:
    ring = utc(2026, 10, 20, 13)
    one_off = one_off_instant(ring)
    assert latest_at_or_before(one_off, ring - SECOND, ring + SECOND) == ring
    assert latest_at_or_before(one_off, ring, ring) == ring  # both bounds inclusive
    assert latest_at_or_before(one_off, ring + SECOND, ring + timedelta(days=1)) is None
    assert latest_at_or_before(one_off, ring - timedelta(days=1), ring - SECOND) is None


def test_a_local_one_off_in_the_skipped_hour_is_its_shifted_instant() -> None:
    one_off = one_off_local(datetime(2027, 3, 14, 2, 30), NEW_YORK)
    assert latest_at_or_before(one_off, utc(2027, 3, 14), utc(2027, 3, 15)) == utc(
        2027, 3, 14, 7, 30
    )


def test_three_missed_mondays_across_the_fall_back_give_the_last_one() -> None:
    # Oct 26 13:00Z (EDT), then Nov 2 and Nov 9 at 14:00Z (EST): 09:00 local each time.
    assert latest_at_or_before(MONDAYS, utc(2026, 10, 26, 13), utc(2026, 11, 10, 12)) == utc(
        2026, 11, 9, 14
    )


def test_the_bounds_are_inclusive_and_strictly_respected() -> None:
    first, second = utc(2026, 10, 26, 13), utc(2026, 11, 2, 14)
    assert latest_at_or_before(MONDAYS, first, second) == second
    assert latest_at_or_before(MONDAYS, first, second - SECOND) == first
    assert latest_at_or_before(MONDAYS, first, first) == first
    assert latest_at_or_before(MONDAYS, first + SECOND, second - SECOND) is None
    assert latest_at_or_before(MONDAYS, second, first) is None  # an empty interval


def test_before_the_start_there_is_nothing() -> None:
    assert latest_at_or_before(MONDAYS, utc(2026, 1, 1), utc(2026, 10, 26, 12, 59)) is None


def test_hourly_across_the_spring_gap_keeps_the_shifted_ring() -> None:
    hourly = parse_rrule("FREQ=HOURLY", NEW_YORK, datetime(2027, 3, 13, 22))
    # 01:00 EST = 06:00Z; 02:00 does not exist: shifted to 03:00 EDT = 07:00Z; 04:00 EDT.
    assert latest_at_or_before(hourly, utc(2027, 3, 14, 4), utc(2027, 3, 14, 7, 30)) == utc(
        2027, 3, 14, 7
    )
    assert latest_at_or_before(hourly, utc(2027, 3, 14, 4), utc(2027, 3, 14, 6, 59)) == utc(
        2027, 3, 14, 6
    )


def test_hourly_across_the_fall_fold_rings_the_repeated_hour_once() -> None:
    hourly = parse_rrule("FREQ=HOURLY", NEW_YORK, datetime(2026, 10, 31, 22))
    # 01:00 EDT = 05:00Z rings; the second 01:00 (EST, 06:00Z) does not; 02:00 EST = 07:00Z.
    assert latest_at_or_before(hourly, utc(2026, 11, 1, 3), utc(2026, 11, 1, 6, 30)) == utc(
        2026, 11, 1, 5
    )
    assert latest_at_or_before(hourly, utc(2026, 11, 1, 3), utc(2026, 11, 1, 7)) == utc(
        2026, 11, 1, 7
    )


def test_count_ends_the_series_at_its_last_ring() -> None:
    three_days = parse_rrule("FREQ=DAILY;COUNT=3", NEW_YORK, datetime(2026, 10, 30, 8))
    last = utc(2026, 11, 1, 13)  # Oct 30, 31 at 12:00Z (EDT), Nov 1 at 13:00Z (EST)
    assert latest_at_or_before(three_days, utc(2026, 10, 30), utc(2027, 1, 1)) == last
    assert latest_at_or_before(three_days, last + SECOND, utc(2027, 1, 1)) is None


def test_until_ends_the_series_at_its_last_ring() -> None:
    until_sunday = parse_rrule(
        "FREQ=DAILY;UNTIL=20261101T235959", NEW_YORK, datetime(2026, 10, 25, 8)
    )
    assert latest_at_or_before(until_sunday, utc(2026, 10, 25), utc(2026, 12, 1)) == utc(
        2026, 11, 1, 13
    )


def test_an_interval_skips_the_periods_it_does_not_select() -> None:
    fortnightly = parse_repeat("every 2 weeks on Tue,Thu 18:00", "UTC", datetime(2026, 11, 2))
    # Tue Nov 3, Thu Nov 5, then Tue Nov 17: the week of Nov 9 is skipped.
    assert latest_at_or_before(fortnightly, utc(2026, 11, 3, 18), utc(2026, 11, 16)) == utc(
        2026, 11, 5, 18
    )


def test_naive_bounds_are_refused() -> None:
    with pytest.raises(ScheduleError):
        latest_at_or_before(MONDAYS, datetime(2026, 10, 26), utc(2026, 11, 10))
    with pytest.raises(ScheduleError):
        latest_at_or_before(MONDAYS, utc(2026, 10, 26), datetime(2026, 11, 10))


@SETTINGS
@given(
    rule_text=rules(),
    start=starts,
    zone=st.sampled_from(sorted(zone_names())),
    picks=st.tuples(st.integers(0, 7), st.integers(0, 7), st.integers(-3600, 3600)),
)
def test_it_is_the_last_of_the_rings_occurrences_lists_in_the_interval(
    rule_text: str, start: datetime, zone: str, picks: tuple[int, int, int]
) -> None:
    try:
        repeat = parse_rrule(rule_text, zone, start)
    except ScheduleError:
        reject()  # never occurs, or too sparse: refused with an error, not checked
    rings = occurrences(repeat, datetime(1990, 1, 1, tzinfo=UTC), 8)
    first, last, shift = picks
    since = rings[min(first, len(rings) - 1)]
    instant = rings[min(last, len(rings) - 1)] + timedelta(seconds=shift)
    inside = [ring for ring in rings if since <= ring <= instant]
    expected = inside[-1] if inside else None
    if inside and inside[-1] == rings[-1] and instant > rings[-1]:
        return  # a ring after the 8 listed may still fall before `instant`
    assert latest_at_or_before(repeat, since, instant) == expected
