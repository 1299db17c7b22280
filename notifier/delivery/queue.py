"""An in-memory priority queue of recorded notifications waiting for a push: URGENT ahead
of BULK, first in first out within a priority. Retries come back after a delay and still
count as unfinished, so `drained()` waits for them too. Each item carries the future its
caller awaits: a notification is answered once its delivery ended, so nothing answered
"accepted" lives only in this process's memory."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from notifier.domain.model import Device, HandBack, Notification, Priority, Settlement
from notifier.storage.keys import KeyHold

# How the item's delivery ended: settled, or handed back undelivered (and why).
DeliveryEnd = asyncio.Future[Settlement | HandBack]


@dataclass(frozen=True)
class QueuedNotification:
    notification: Notification
    ended: DeliveryEnd = field(compare=False)
    # This delivery's hold on the key, refreshed before a push if it grew old waiting.
    hold: KeyHold
    attempt: int = 1
    # None: push to all the user's devices; on a retry, only those that asked for one.
    devices: tuple[Device, ...] | None = None
    # Storage calls before its push that storage did not answer (device lookups, hold
    # refreshes): they use up no push attempt.
    storage_failures: int = 0
    # Pushed to at least one of the user's devices by an earlier attempt.
    reached: bool = False
    # Refused for good by one of its devices in an earlier attempt (the others asked for
    # a retry): if none takes it, it was refused, not left without a device.
    refused: bool = False


@dataclass(order=True, frozen=True)
class _Entry:
    rank: int
    sequence: int
    item: QueuedNotification = field(compare=False)


DepthListener = Callable[[Priority, int], None]


class QueueClosed(Exception):
    """The push workers have stopped: nothing put now would be pushed."""


class DeliveryQueue:
    def __init__(self, on_depth: DepthListener | None = None) -> None:
        self._entries: asyncio.PriorityQueue[_Entry] = asyncio.PriorityQueue()
        self._sequence = itertools.count()
        self._unfinished = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._depth = dict.fromkeys(Priority, 0)
        self._on_depth = on_depth
        self._delayed: dict[asyncio.TimerHandle, QueuedNotification] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        """The workers have stopped: nothing more is taken."""
        return self._closed

    def put(self, item: QueuedNotification) -> None:
        """Raises QueueClosed once the workers have stopped."""
        self._begin()
        self._push(item)

    def put_after(self, item: QueuedNotification, delay_s: float) -> None:
        """Queue `item` after `delay_s`; counted as unfinished from now on. Raises
        QueueClosed once the workers have stopped."""
        self._begin()
        loop = asyncio.get_running_loop()

        def due() -> None:
            self._delayed.pop(handle, None)
            self._push(item)

        handle = loop.call_later(delay_s, due)
        self._delayed[handle] = item

    async def get(self) -> QueuedNotification:
        item = (await self._entries.get()).item
        self._count(item.notification.priority, -1)
        return item

    def done(self) -> None:
        """One item taken with `get()` is finished (pushed, dropped, or re-queued)."""
        self._unfinished -= 1
        if self._unfinished == 0:
            self._idle.set()

    async def drained(self) -> None:
        await self._idle.wait()

    def close(self) -> list[QueuedNotification]:
        """The workers stop: empty the queue and refuse what is put from now on;
        returns what was left, waiting retries included, to be handed back."""
        self._closed = True
        for handle in self._delayed:
            handle.cancel()
        left = list(self._delayed.values())
        self._delayed.clear()
        while not self._entries.empty():
            left.append(self._entries.get_nowait().item)
        for priority in Priority:
            self._count(priority, -self._depth[priority])
        return left

    def _begin(self) -> None:
        if self._closed:
            raise QueueClosed
        self._unfinished += 1
        self._idle.clear()

    def _push(self, item: QueuedNotification) -> None:
        priority = item.notification.priority
        self._entries.put_nowait(_Entry(priority.rank, next(self._sequence), item))
        self._count(priority, 1)

    def _count(self, priority: Priority, change: int) -> None:
        self._depth[priority] += change
        if self._on_depth is not None:
            self._on_depth(priority, self._depth[priority])
