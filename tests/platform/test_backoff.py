"""The one backoff every retry loop draws its delays from (dispatcher, notifier, purge)."""

from __future__ import annotations

import pytest

from reminders_svc.concurrency import backoff_s


@pytest.mark.parametrize(("attempt", "low", "high"), [(1, 0.25, 0.5), (2, 0.5, 1), (4, 2, 4)])
def test_doubles_from_the_first_delay_with_jitter_in_its_upper_half(
    attempt: int, low: float, high: float
) -> None:
    delays = [backoff_s(0.5, attempt) for _ in range(200)]
    assert all(low <= delay <= high for delay in delays)
    assert len(set(delays)) > 100  # jittered: a burst's retries do not come back in step


def test_stops_doubling_at_its_cap_even_after_a_day_of_retries() -> None:
    assert all(15 <= backoff_s(0.5, attempt, 30) <= 30 for attempt in (7, 100, 100_000))
    assert backoff_s(0.5, 100_000) > 1e9  # uncapped, yet no OverflowError
