"""The design's seed cases, America/New_York."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reminders_svc.schedule import (
    describe,
    named_at,
    next_after,
    occurrences,
    one_off_local,
    parse_repeat,
    validate_new,
)

NEW_YORK = "America/New_York"


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def test_every_monday_keeps_nine_local_across_both_transitions() -> None:
    repeat = parse_repeat("every Monday 09:00", NEW_YORK, datetime(2026, 10, 20))
    rings = occurrences(repeat, utc(2026, 10, 20), 23)
    assert rings[0] == utc(2026, 10, 26, 13)
    winter = [utc(2026, 11, 2, 14) + timedelta(weeks=week) for week in range(19)]
    assert rings[1:20] == winter
    assert winter[-1] == utc(2027, 3, 8, 14)
    assert rings[20:] == [utc(2027, 3, 15, 13), utc(2027, 3, 22, 13), utc(2027, 3, 29, 13)]
    assert describe(repeat) == "Every Monday at 09:00, from 2026-10-20, America/New_York"


def test_one_off_in_the_repeated_hour_rings_at_the_first() -> None:
    one_off = one_off_local(datetime(2026, 11, 1, 1, 30), NEW_YORK)
    assert validate_new(one_off, utc(2026, 10, 20)) == utc(2026, 11, 1, 5, 30)


def test_one_off_named_in_the_repeated_hour_after_its_first_pass_rings_at_the_second() -> None:
    """At 01:10 EST (06:10Z), 01:30 is 20 minutes ahead on the wall clock, as a snooze to
    it is: it was refused as past (05:30Z). Kept as that instant, later readings agree."""
    one_off = one_off_local(datetime(2026, 11, 1, 1, 30), NEW_YORK)
    now = utc(2026, 11, 1, 6, 10)
    assert validate_new(one_off, now) == utc(2026, 11, 1, 6, 30)
    assert occurrences(named_at(one_off, now), now, 2) == [utc(2026, 11, 1, 6, 30)]
    assert describe(named_at(one_off, now)) == "Once on 2026-11-01 at 01:30, America/New_York"


def test_one_off_in_the_skipped_hour_shifts_by_the_gap() -> None:
    one_off = one_off_local(datetime(2027, 3, 14, 2, 30), NEW_YORK)
    ring = validate_new(one_off, utc(2026, 10, 20))
    assert ring == utc(2027, 3, 14, 7, 30)
    assert next_after(one_off, ring) is None


def test_next_after_is_strict_and_resumes_anywhere() -> None:
    repeat = parse_repeat("every Monday 09:00", NEW_YORK, datetime(2026, 10, 20))
    assert next_after(repeat, utc(2026, 10, 26, 13)) == utc(2026, 11, 2, 14)
    assert next_after(repeat, utc(2026, 10, 26, 12, 59)) == utc(2026, 10, 26, 13)
    # A fraction of a second before a ring (a resume, a finalize at `now`): that ring.
    just_before = utc(2026, 10, 26, 13) - timedelta(milliseconds=600)
    assert next_after(repeat, just_before) == utc(2026, 10, 26, 13)
    just_after = utc(2026, 10, 26, 13) + timedelta(milliseconds=600)
    assert next_after(repeat, just_after) == utc(2026, 11, 2, 14)
    assert occurrences(repeat, utc(2026, 10, 26, 13), 1) == [utc(2026, 10, 26, 13)]
