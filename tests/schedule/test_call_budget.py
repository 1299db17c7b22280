"""A call expanding many rings at once (a preview) spends at most `max_steps` in all.

The per-ring budget alone lets a dense BYSETPOS rule cost ~1,000 steps a ring, so 100
rings of it held a core for half a second; past the call's cap the answer names how many
rings the caller may ask for instead, and asking for that many succeeds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from reminders_svc.schedule import Repeat, ScheduleError, occurrences, parse_rrule

NOW = datetime(2026, 12, 3, tzinfo=UTC)
# The last day of every third year: BYSETPOS picks 1 of ~366 candidate days a period.
DENSE = "FREQ=YEARLY;INTERVAL=3;BYMONTHDAY=" + ",".join(map(str, range(1, 32))) + ";BYSETPOS=-1"
CAP = 20_000


def dense() -> Repeat:
    return parse_rrule(DENSE, "America/New_York", datetime(2026, 12, 4, 9, 0))


def test_a_costly_call_is_refused_naming_how_many_rings_fit() -> None:
    schedule = dense()
    with pytest.raises(ScheduleError) as refused:
        occurrences(schedule, NOW, 100, max_steps=CAP)
    assert refused.value.field == "count"
    fits = int(re.findall(r"at most (\d+)", refused.value.message)[0])
    assert 1 <= fits < 100
    found = occurrences(schedule, NOW, fits, max_steps=CAP)
    assert len(found) == fits
    assert found == occurrences(schedule, NOW, fits)  # as uncapped
    assert all(ring.astimezone(UTC).month == 12 for ring in found)  # 31 Dec, 09:00 local


def test_the_cap_leaves_cheap_rules_alone() -> None:
    daily = parse_rrule("FREQ=DAILY", "America/New_York", datetime(2026, 12, 4, 9, 0))
    assert len(occurrences(daily, NOW, 100, max_steps=CAP)) == 100


def test_a_count_walk_too_costly_to_reach_from_names_no_count_that_would_fail_too() -> None:
    """With COUNT the walk starts at the series' start: from far past it, even one ring
    costs more than the cap, and asking for fewer would not help. (A rule stored before
    the COUNT walk's limit: a new one that long is refused when made.)"""
    rule = DENSE.replace("INTERVAL=3;", "COUNT=109;")
    schedule = Repeat(rrule=rule, zone="America/New_York", start=datetime(1950, 1, 1, 9, 0))
    with pytest.raises(ScheduleError, match="COUNT with BYSETPOS"):
        parse_rrule(rule, schedule.zone, schedule.start)
    with pytest.raises(ScheduleError) as refused:
        occurrences(schedule, NOW, 1, max_steps=CAP)
    assert refused.value.field == "count"
    assert "this far past its start" in refused.value.message
    assert "ask for" not in refused.value.message
    assert len(occurrences(schedule, NOW, 1)) == 1  # uncapped, it is there
