"""The catch-up pace: waiters go through in order at the pace, and one that leaves (its part
handed over, its lease lost, cancelled) takes no slot from those behind it."""

from __future__ import annotations

import asyncio
import itertools

from dispatcher.ratelimit import MAKE_UP_S, RateLimiter
from tests.dispatcher.conftest import held_shift

PER_S = 50.0


def test_waiters_go_through_in_order_at_the_pace() -> None:
    async def scenario() -> None:
        limiter, shift, loop = RateLimiter(PER_S), held_shift(), asyncio.get_running_loop()
        through: list[tuple[int, float]] = []

        async def wait(n: int) -> None:
            assert await limiter.take(shift)
            through.append((n, loop.time()))

        await asyncio.gather(*(wait(n) for n in range(11)))

        assert [n for n, _ in through] == list(range(11))
        # Never faster than the pace over any stretch, but for the make-up allowance: at
        # most one waiter more than the pace allows, plus MAKE_UP_S's worth.
        assert MAKE_UP_S * PER_S <= 1
        for (i, at_i), (j, at_j) in itertools.combinations(through, 2):
            assert j - i <= (at_j - at_i + 0.002) * PER_S + MAKE_UP_S * PER_S + 1

    asyncio.run(scenario())


def test_a_fast_pace_is_kept_though_each_wake_up_is_late() -> None:
    """10,000/s: the loop oversleeps each 0.1 ms wait by ~1 ms; the missed slots are made
    up, so 3,000 waiters take ~0.3 s (they took 3.3 s: every rate was capped near 900/s,
    `admin replan --rows-per-s 5000` scanned at 900)."""

    async def scenario() -> None:
        limiter, loop = RateLimiter(10_000), asyncio.get_running_loop()
        started = loop.time()
        for _ in range(3000):
            assert await limiter.take()
        assert loop.time() - started < 1.5

    asyncio.run(scenario())


def test_a_part_handed_over_leaves_no_slots_for_the_parts_kept_to_wait_out() -> None:
    """3,000 late rings of a part handed over: once they stop, a kept part's late ring goes
    through at once (it waited ~60 s behind their unused slots before)."""

    async def scenario() -> None:
        limiter, handed_over, kept = RateLimiter(PER_S), held_shift(), held_shift()
        leaving = [asyncio.create_task(limiter.take(handed_over)) for _ in range(3000)]
        await asyncio.sleep(0.2)
        # However long that sleep took: those through by the stop, and none after it.
        through = sum(task.done() for task in leaving)
        handed_over.stop()
        assert through < len(leaving) - 2 * PER_S  # seconds of slots were left unused
        results = await asyncio.gather(*leaving)
        assert results == [True] * through + [False] * (len(leaving) - through)

        async with asyncio.timeout(1.0):
            assert await limiter.take(kept)

    asyncio.run(scenario())


def test_a_waiter_whose_lease_lapses_leaves_the_line() -> None:
    """A lease lost sets no event: the waiter at the head still leaves within about a
    second, and the one behind it goes through."""

    async def scenario() -> None:
        limiter, lapsing, kept = RateLimiter(1 / 30), held_shift(held_for_s=0.5), held_shift()
        assert await limiter.take(kept)  # the next slot is 30 s away
        behind_it = [asyncio.create_task(limiter.take(lapsing)) for _ in range(5)]
        last = asyncio.create_task(limiter.take(kept))

        async with asyncio.timeout(3.0):
            assert not any(await asyncio.gather(*behind_it))
        assert not last.done()  # still paced: its slot is the next one, ~30 s on
        last.cancel()

    asyncio.run(scenario())


def test_a_cancelled_waiter_takes_no_slot() -> None:
    async def scenario() -> None:
        limiter, shift, loop = RateLimiter(1.0), held_shift(), asyncio.get_running_loop()
        assert await limiter.take(shift)
        first_through = loop.time()  # the next slot is 1 s on, the one after it 2 s on
        head = asyncio.create_task(limiter.take(shift))  # waits ~1 s for its slot
        await asyncio.sleep(0.1)
        assert not head.done()
        head.cancel()

        assert await limiter.take(shift)

        # The slot the cancelled one waited for (~1 s), not the one after (2 s or more).
        assert loop.time() - first_through < 1.8

    asyncio.run(scenario())
