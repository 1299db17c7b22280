"""A token bucket for catch-up work, shared by all parts of one dispatcher."""

from __future__ import annotations

import asyncio


class RateLimiter:
    """Spaces out waiters to at most `per_second`, so catch-up leaves the database to the API."""

    def __init__(self, per_second: float) -> None:
        self._interval = 1.0 / per_second
        self._next = 0.0

    def reserve(self) -> float:
        """Take the next slot; returns the seconds to wait for it (a waiter that stops
        early just leaves its slot unused)."""
        now = asyncio.get_running_loop().time()
        self._next = max(self._next, now)
        delay = self._next - now
        self._next += self._interval
        return delay

    async def wait(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)
