"""Lease renewal rounds keep their period from the start of each round (no database: the
rounds' timing alone)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from datetime import timedelta

from dispatcher.service import Dispatcher
from dispatcher.settings import DispatcherSettings
from reminders_svc.config import CassandraSettings

# Long enough that a loaded machine's loop delays (up to a second) stay under half, and the
# slow round's 0.9 periods put a wrong gap (1.9 periods) well past the bound (1.5).
PERIOD_S = 2.0


def test_a_slow_round_does_not_push_the_next_one_back() -> None:
    """A round held up (one renewal waiting out its timeout, at most a period) must not
    delay the next round by its own length: with a 15 s lease renewed every 5 s and a
    3 s margin, a round started 10 s after the last has 2 s left to land."""
    settings = dataclasses.replace(
        DispatcherSettings.from_env({"REMINDERS_ENV": "dev"}),
        lease_renew_every=timedelta(seconds=PERIOD_S),
    )
    dispatcher = Dispatcher(settings, CassandraSettings.from_env({}))
    starts: list[float] = []

    async def renew() -> None:
        loop = asyncio.get_running_loop()
        starts.append(loop.time())
        if len(starts) == 1:
            await asyncio.sleep(0.9 * PERIOD_S)  # the slow round

    async def rounds() -> None:
        dispatcher._renew = renew  # type: ignore[method-assign]
        renewing = asyncio.create_task(dispatcher._keep_renewing())
        await asyncio.sleep(4.5 * PERIOD_S)
        renewing.cancel()

    asyncio.run(rounds())
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert len(gaps) >= 2, starts
    # Every PERIOD_S from the first start (give or take the loop's own delay), where
    # sleeping a period after each round's end started the second 0.9 periods late.
    assert all(gap < 1.5 * PERIOD_S for gap in gaps), gaps
