"""A COUNT series is walked from its start at every search, so a new one must be cheap to
walk: its cost is the work the walk does (days looked at, candidate times, local times
mapped to UTC), not its steps alone, which let a walk take 28-44 ms."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from reminders_svc.schedule import ScheduleError, occurrences, parse_repeat, parse_rrule

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
A_YEAR_AGO = datetime(2025, 12, 7, 9, 0)
NEW_YORK = "America/New_York"


def test_a_sparse_count_from_long_ago_is_refused_while_ordinary_ones_are_made() -> None:
    # ~24 days looked at a ring, from 1976: 28-44 ms at every search (until 2026-12-07,
    # 9,977 of the 10,000 steps allowed). The refusal names the count that fits.
    sparse, paris, in_1976 = (
        "FREQ=HOURLY;INTERVAL=47;BYHOUR=1",
        "Europe/Paris",
        datetime(1976, 6, 1, 1),
    )
    with pytest.raises(ScheduleError) as refused:
        parse_rrule(f"{sparse};COUNT=400", paris, in_1976)
    assert refused.value.field == "rrule"
    assert "the limit allows COUNT=56 at most" in refused.value.message
    parse_rrule(f"{sparse};COUNT=56", paris, in_1976)

    ordinary = [
        parse_rrule("FREQ=DAILY;COUNT=1000", NEW_YORK, A_YEAR_AGO),
        parse_rrule("FREQ=WEEKLY;COUNT=500", NEW_YORK, A_YEAR_AGO),
        parse_rrule("FREQ=HOURLY;COUNT=1000", NEW_YORK, A_YEAR_AGO),
        parse_repeat("every weekday 07:30 for 1000 times", NEW_YORK, A_YEAR_AGO),
    ]
    rings_from_start = [
        len(occurrences(repeat, NOW.replace(year=2025), 1000)) for repeat in ordinary
    ]
    assert rings_from_start == [1000, 500, 1000, 1000]
