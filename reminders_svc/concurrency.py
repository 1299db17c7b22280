"""Task helpers: per-user serialization, work a stop ends or must not cut short.

LWTs on one Cassandra partition contend (Paxos ballots collide and retry), so a process
runs one user's conditional writes one at a time; different users still run in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

T = TypeVar("T")


def backoff_s(first_s: float, attempt: int, cap_s: float = math.inf) -> float:
    """Seconds to wait before retry number `attempt` (from 1): d = `first_s` doubled at
    each attempt, up to `cap_s`, drawn from [d/2, d] so that the retries of one burst do
    not come back in step. The exponent is bounded: 2 ** n overflows a float long before
    an outage ends."""
    delay_s = min(first_s * 2 ** min(attempt - 1, 32), cap_s)
    return random.uniform(delay_s / 2, delay_s)


class UserLocks:
    """One asyncio lock per user with work in flight; dropped when unused."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, user_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(user_id, (asyncio.Lock(), 0))
        self._locks[user_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[user_id]
            if users == 1:
                del self._locks[user_id]
            else:
                self._locks[user_id] = (lock, users - 1)


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result; None, with `work` cancelled, when `stop` is set first (a SIGTERM
    while a process still waits for its database ends it at once)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


async def to_the_end(work: Awaitable[T]) -> T:
    """`work`'s result, `work` run to its end even if this task is cancelled meanwhile, once
    or more (then the cancellation re-raised): for what must not stop half way (a claim
    being let go, a schema lock to release)."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()
