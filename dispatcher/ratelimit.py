"""A pace for catch-up work, shared by all parts of one dispatcher."""

from __future__ import annotations

import asyncio

from dispatcher.shift import LOOK_EVERY_S, Shift

# Slots missed by late wake-ups within this long are made up: the loop oversleeps ~1 ms, so
# pacing from each wake-up capped every rate near 900/s (replan's default is 5,000 rows/s).
# Idle time beyond it is no credit: after a pause at most this much goes through at once.
MAKE_UP_S = 0.02


class RateLimiter:
    """Lets waiters through one at a time, at most `per_second` on average, in the order
    they came, so catch-up leaves the database to the API.

    Slots follow a schedule, each `1 / per_second` after the one before, not after the
    moment its waiter woke: a slot a late wake-up missed is made up at once, if it fell
    within the last `MAKE_UP_S`.

    A slot is taken only when its waiter goes through. A waiter whose shift ends first (a
    stop, a hand-over, a lost lease) or that is cancelled leaves the line without one: the
    waiters behind it do not wait for slots nobody uses.
    """

    def __init__(self, per_second: float) -> None:
        self._interval = 1.0 / per_second
        self._next = 0.0  # the loop's time from which the next waiter may go through
        self._line = asyncio.Lock()  # FIFO: only the head of the line waits for the time

    async def take(self, shift: Shift | None = None) -> bool:
        """Wait in line for the next slot; True once through with the shift (if any) still
        on. Without a shift (the admin tools) the wait ends only with the slot."""
        loop = asyncio.get_running_loop()
        async with self._line:
            while shift is None or shift.on():
                now = loop.time()
                delay = self._next - now
                if delay <= 0:
                    self._next = max(self._next, now - MAKE_UP_S) + self._interval
                    return True
                if shift is None:
                    await asyncio.sleep(delay)
                else:
                    await shift.sleep(min(delay, LOOK_EVERY_S))
            return False
