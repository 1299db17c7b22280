"""Every offset change of every zone, 2000-2037: daily rings around each gap and fold, and
a local time in each fold meant as one ahead, and the end of each day around it.

Expected rings are computed here from UTC offsets alone (no fold arithmetic): a local
time L is the instants U with U + offset(U) == L; the first of those, or for none (a
gap) L read with the offset before the change; then only strictly increasing rings.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from reminders_svc.schedule import (
    OneOff,
    ScheduleError,
    load_zone,
    named_at,
    occurrences,
    one_off_local,
    parse_repeat,
    parse_rrule,
    validate_new,
)
from reminders_svc.schedule.rule import end_of_day
from reminders_svc.schedule.zones import (
    round_up,
    start_from,
    to_local,
    to_utc_in,
    upcoming_utc,
    zone_names,
)

FIRST, LAST = datetime(2000, 1, 1, tzinfo=UTC), datetime(2037, 12, 31, tzinfo=UTC)
SCAN_STEP = timedelta(days=3)
DAYS_AROUND = 3


@dataclass(frozen=True)
class Transition:
    at: datetime  # first UTC instant with the new offset
    before: timedelta
    after: timedelta


def offset(zone: ZoneInfo, instant: datetime) -> timedelta:
    value = instant.astimezone(zone).utcoffset()
    assert value is not None
    return value


def transitions(zone: ZoneInfo) -> Iterator[Transition]:
    """Offset changes, found by a coarse scan and bisected to the second."""
    instant, current = FIRST, offset(zone, FIRST)
    while instant < LAST:
        probe = instant + SCAN_STEP
        changed = offset(zone, probe)
        if changed != current:
            low, high = instant, probe
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                middle = middle.replace(microsecond=0)
                low, high = (low, middle) if offset(zone, middle) != current else (middle, high)
            yield Transition(high, current, offset(zone, high))
            current = changed
        instant = probe


def expected_ring(zone: ZoneInfo, local: datetime, change: Transition) -> datetime:
    instants = [
        (local - shift).replace(tzinfo=UTC)
        for shift in {change.before, change.after}
        if offset(zone, (local - shift).replace(tzinfo=UTC)) == shift
    ]
    return min(instants) if instants else (local - change.before).replace(tzinfo=UTC)


def wall_times(change: Transition) -> list[datetime]:
    """Local wall times just before, inside and at the end of the gap or fold."""
    edge_early = (change.at + min(change.before, change.after)).replace(tzinfo=None)
    edge_late = (change.at + max(change.before, change.after)).replace(tzinfo=None)
    inside = edge_early + (edge_late - edge_early) / 2
    return [edge_early - timedelta(minutes=1), inside.replace(second=0, microsecond=0), edge_late]


def in_fold(change: Transition) -> tuple[datetime, datetime, datetime]:
    """A wall time in the middle of the repeated hour, and its first and second instants."""
    inside = (change.at + change.after + (change.before - change.after) / 2).replace(
        tzinfo=None, microsecond=0
    )
    return (
        inside,
        (inside - change.before).replace(tzinfo=UTC),
        (inside - change.after).replace(tzinfo=UTC),
    )


def check_time_ahead_in_fold(name: str, change: Transition) -> None:
    """A local time of the repeated hour, meant as one ahead (a snooze to it): the first
    instant while it is to come, the second once the first has passed, the first again
    (in the past, to be refused) once both have."""
    inside, first, second = in_fold(change)
    one_second = timedelta(seconds=1)
    assert upcoming_utc(inside, name, first - one_second) == first, (name, change)
    assert upcoming_utc(inside, name, first) == second, (name, change)
    assert upcoming_utc(inside, name, second - one_second) == second, (name, change)
    assert upcoming_utc(inside, name, second) == first, (name, change)


def check_one_off_named_in_fold(name: str, change: Transition) -> None:
    """A new one-off at a local time of the repeated hour rings as a snooze to it would: at
    the first instant while it is to come, at the second once the first has passed (kept
    as that instant), refused once both have."""
    inside, first, second = in_fold(change)
    one_off = one_off_local(inside, name)
    assert validate_new(one_off, first) == first, (name, change)
    after_first = first + timedelta(seconds=1)
    assert validate_new(one_off, after_first) == second, (name, change)
    assert named_at(one_off, after_first) == OneOff(name, None, second), (name, change)
    with pytest.raises(ScheduleError, match="is in the past"):
        validate_new(one_off, second + timedelta(seconds=1))


def check_start_from(zone: ZoneInfo, change: Transition) -> None:
    """A series "starting now" begins at the next whole local minute, or where that wall
    time's instant is past (a repeated hour's second pass: its wall times are the first
    pass's instants), at the same minute of the first hour after it whose instant is not."""
    fold = change.before - change.after
    moments = [change.at - timedelta(minutes=30), change.at + timedelta(seconds=20)]
    if fold > timedelta(0):
        moments.append(change.at + fold / 2)
    for now in moments:
        start = start_from(now, zone)
        next_minute = round_up(to_local(now, zone), "minute")
        assert to_utc_in(start, zone) >= now, (zone, change, now)
        assert (start - next_minute) % timedelta(hours=1) == timedelta(0), (zone, change, now)
        earlier = start - timedelta(hours=1)
        assert earlier < next_minute or to_utc_in(earlier, zone) < now, (zone, change, now)
    if fold > timedelta(0):
        in_second_pass = change.at + fold / 2
        next_minute = round_up(to_local(in_second_pass, zone), "minute")
        assert start_from(in_second_pass, zone) > next_minute, (zone, change)


def check_end_of_day(zone: ZoneInfo, change: Transition) -> None:
    """ "until <date>" ends with the last second of that local date, whatever the change
    does to its evening or the next midnight (Nuuk springs forward at 23:00)."""
    for day in {(change.at + change.before).date(), (change.at + change.after).date()}:
        end = end_of_day(day, zone)
        # At most that date: a date the zone skipped (Apia, 2011-12-30) ends the day before.
        assert end.astimezone(zone).date() <= day, (zone, change, day)
        assert (end + timedelta(seconds=1)).astimezone(zone).date() > day, (zone, change, day)


def check_hourly_across_gap(name: str, zone: ZoneInfo, change: Transition) -> None:
    """Hourly rings from 3 hours before a gap to 3 after, at the minute of its middle: each
    wall time's instant, in UTC order, once. A gap longer than an hour (Antarctica/Troll
    skips two) shifts a time in it past the next hour's instant; both ring, in order."""
    inside = wall_times(change)[1]
    start = inside - timedelta(hours=3)
    hours = int((change.after - change.before) / timedelta(hours=1)) + 6
    locals_ = [start + timedelta(hours=hour) for hour in range(hours + 1)]
    expected = sorted({expected_ring(zone, local, change) for local in locals_})
    repeat = parse_rrule(f"FREQ=HOURLY;BYMINUTE={start.minute}", name, start)
    got = occurrences(repeat, expected[0], len(expected))
    assert got == expected, (name, change)


def check_zone(name: str) -> int:
    zone = load_zone(name)
    checked = 0
    for change in transitions(zone):
        check_end_of_day(zone, change)
        check_start_from(zone, change)
        if change.after < change.before:  # a fold: clocks went back
            check_time_ahead_in_fold(name, change)
            check_one_off_named_in_fold(name, change)
        else:
            check_hourly_across_gap(name, zone, change)
        for wall in wall_times(change):
            first_day = wall.date() - timedelta(days=DAYS_AROUND)
            start = datetime.combine(first_day, time(wall.hour, wall.minute))
            rule = f"FREQ=DAILY;COUNT={2 * DAYS_AROUND + 1}"
            repeat = parse_rrule(rule, name, start)
            got = occurrences(repeat, FIRST, 2 * DAYS_AROUND + 1)
            expected: list[datetime] = []
            for day in range(2 * DAYS_AROUND + 1):
                ring = expected_ring(zone, start + timedelta(days=day), change)
                if not expected or ring > expected[-1]:
                    expected.append(ring)
            # COUNT counts rings, so a dropped duplicate lets one more day in.
            assert got[: len(expected)] == expected, (name, change, wall)
            assert all(a < b for a, b in itertools.pairwise(got)), (name, wall)
            checked += 1
    return checked


def test_every_transition_of_every_zone_2000_2037() -> None:
    checked = sum(check_zone(name) for name in sorted(zone_names()))
    assert checked > 10_000  # the scan did find the world's transitions


def test_new_york_2026_fall_back_found_exactly() -> None:
    found = [
        change for change in transitions(load_zone("America/New_York")) if change.at.year == 2026
    ]
    assert [change.at for change in found] == [
        datetime(2026, 3, 8, 7, tzinfo=UTC),
        datetime(2026, 11, 1, 6, tzinfo=UTC),
    ]


def test_until_a_date_whose_next_midnight_the_clocks_skip_ends_at_the_change() -> None:
    """America/Toronto, 1919-03-30: clocks went from 23:30 to 00:30, so the next day
    began at the change, half an hour before its midnight's instant: "until" that date
    ends there, and the next day's 00:45 ring is not in."""
    toronto = load_zone("America/Toronto")
    end = end_of_day(date(1919, 3, 30), toronto)
    assert end.astimezone(toronto).replace(tzinfo=None) == datetime(1919, 3, 30, 23, 29, 59)
    assert (end + timedelta(seconds=1)).astimezone(toronto).date() == date(1919, 3, 31)
    repeat = parse_repeat(
        "every day 00:45 until 1919-03-30", "America/Toronto", datetime(1919, 3, 28)
    )
    rings = occurrences(repeat, datetime(1919, 3, 27, tzinfo=UTC), 10)
    assert [ring.astimezone(toronto).day for ring in rings] == [28, 29, 30]
