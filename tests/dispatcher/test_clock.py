"""The dispatcher's clock against the real node's: never ahead of the database's, even
when the local wall clock steps between two measurements."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from cassandra.cluster import ResponseFuture, Session

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.clock import DbClock
from reminders_svc.storage.loop_reactor import connected_on_loop


def test_a_wall_clock_step_between_measurements_moves_the_clock_neither_ahead_nor_ready(
    migrated_settings: CassandraSettings,
) -> None:
    step_s = 0.0

    def stepping_wall() -> float:
        return time.time() + step_s

    async def observe() -> tuple[float, bool, float, bool]:
        nonlocal step_s
        async with connected_on_loop(migrated_settings) as connection:
            clock = DbClock(connection.session, timedelta(seconds=5), wall=stepping_wall)
            await clock.measure()
            assert clock.ready()
            # NTP or a resumed VM steps the wall clock 30 s ahead right after a check.
            step_s = 30.0
            ahead_s = (clock.now() - datetime.now(UTC)).total_seconds()
            still_ready = clock.ready()
            # The next check sees the wall clock off by 30 s: not ready until it agrees.
            offset_s = await clock.measure()
            return ahead_s, still_ready, offset_s, clock.ready()

    ahead_s, still_ready, offset_s, ready_after = asyncio.run(observe())
    # The database's clock and this host's are the same one here: "ahead" is only the
    # rounding down, never the 30 s step.
    assert ahead_s <= 0.01
    assert ahead_s > -1.5
    assert still_ready
    assert abs(offset_s + 30) < 1
    assert not ready_after


class SlowToSend:
    """A session whose requests leave `delay_s` late: the database reads its clock at the
    end of the probe's round trip, not in its middle."""

    def __init__(self, session: Session, delay_s: float) -> None:
        self._session = session
        self.delay_s = delay_s

    def execute_async(self, *args: Any, **kwargs: Any) -> ResponseFuture:
        time.sleep(self.delay_s)
        return self._session.execute_async(*args, **kwargs)


@pytest.mark.parametrize(
    ("bound_s", "ready"),
    [(4.0, True), (1.0, False)],
    ids=["error within the bound", "error past the bound"],
)
def test_a_slow_probe_leaves_the_clock_not_ahead_and_ready_only_within_its_bound(
    migrated_settings: CassandraSettings, bound_s: float, ready: bool
) -> None:
    async def observe() -> tuple[bool, float, float]:
        async with connected_on_loop(migrated_settings) as connection:
            slow = cast(Session, SlowToSend(connection.session, 3.0))
            # A 3 s round trip: an error of 1.5 s, within a bound of 4 s, past one of 1 s.
            clock = DbClock(slow, timedelta(seconds=bound_s))
            await clock.measure()
            return (
                clock.ready(),
                clock.uncertainty_s,
                (clock.now() - datetime.now(UTC)).total_seconds(),
            )

    was_ready, uncertainty_s, ahead_s = asyncio.run(observe())
    assert was_ready is ready
    assert uncertainty_s > 1.4
    # The whole error is taken off, not just a second of it, nor just the bound (each left
    # it 0.5 s ahead): a ring that found the clock ready before this probe still reads it.
    assert ahead_s <= 0.01


def test_a_slow_probe_after_a_fast_one_leaves_the_clock_ready_on_the_fast_ones_estimate(
    migrated_settings: CassandraSettings,
) -> None:
    """One probe slowed by a busy database must not hold every ring for a round: a fast
    estimate a few seconds old is tighter than the slow probe's, and is kept."""

    async def observe() -> tuple[float, bool, float, float]:
        async with connected_on_loop(migrated_settings) as connection:
            probes = SlowToSend(connection.session, 0.0)
            clock = DbClock(cast(Session, probes), timedelta(seconds=1))
            await clock.measure()
            fast_error_s = clock.uncertainty_s
            probes.delay_s = 3.0  # an error of 1.5 s alone, past the bound
            await clock.measure()
            return (
                fast_error_s,
                clock.ready(),
                clock.uncertainty_s,
                (clock.now() - datetime.now(UTC)).total_seconds(),
            )

    fast_error_s, ready, error_s, ahead_s = asyncio.run(observe())
    assert ready
    # The fast estimate's error, grown by the drift allowance over the slow probe's 3 s.
    assert fast_error_s < error_s < fast_error_s + 0.05
    assert -0.5 < ahead_s <= 0.01
