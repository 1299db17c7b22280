"""Storage trouble during a long admin run (a replan of hours, a replay of a day): a step
that failed is tried again after a pause instead of ending the run; each retry is told."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from reminders_svc.concurrency import backoff_s
from reminders_svc.storage.errors import STORAGE_ERRORS

T = TypeVar("T")
Tell = Callable[[str], None]

# Five tries over about a minute (1, 2, 4, 8 s, doubled with jitter, capped at 30 s): a
# node restarting or a compaction storm passes; a cluster down for longer ends the run.
ATTEMPTS = 5
_FIRST_PAUSE_S = 2.0
_LONGEST_PAUSE_S = 30.0


async def patiently(step: Callable[[], Awaitable[T]], what: str, tell: Tell) -> T:
    """`step()`, tried up to ATTEMPTS times while it fails on storage; each step given
    here must be safe to run again (a read, or a write its row decides)."""
    for attempt in range(1, ATTEMPTS):
        try:
            return await step()
        except STORAGE_ERRORS as error:
            pause_s = backoff_s(_FIRST_PAUSE_S, attempt, _LONGEST_PAUSE_S)
            tell(f"{what}: {type(error).__name__}; trying again in {pause_s:.0f} s")
            await asyncio.sleep(pause_s)
    return await step()
