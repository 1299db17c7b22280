"""One part's minutes, in order from its checkpoint (DESIGN.md invariants 3 and 9).

For each minute M of the part:
- live (M not yet past its grace): read the bucket `prefetch` ahead of M; until M ends,
  keep reading entries written since the last look (less a skew margin) and start each
  new entry's ring at its due; after M + 60 s + grace, read the whole minute once more;
- past (catch-up after an outage): read the whole minute once, at a bounded rate.
M is checkpointed only when every ring started from it is resolved (finalized, skipped
or let go), and only in order, and only while the lease is held.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from datetime import datetime, timedelta

from dispatcher.buckets import BucketReader, Entry
from dispatcher.clock import DbClock
from dispatcher.leases import Lease, PartLeases
from dispatcher.metrics import DispatcherMetrics
from dispatcher.ratelimit import RateLimiter
from dispatcher.ringer import Ringer
from dispatcher.settings import DispatcherSettings
from reminders_svc.storage.parts import floor_minute

log = logging.getLogger(__name__)
MINUTE = timedelta(minutes=1)
# Live minutes worked at once: the current one, plus those still in their grace.
_MAX_OPEN_MINUTES = 4


class MinuteJob:
    def __init__(self, worker: PartWorker, minute: datetime) -> None:
        self.minute = minute
        self._worker = worker
        self._seen: set[tuple[object, object]] = set()
        self._rings: list[asyncio.Task[None]] = []

    def _start(self, entries: list[Entry]) -> None:
        worker = self._worker
        for entry in entries:
            key = (entry.reminder_id, entry.written_at)
            if key in self._seen:
                continue
            self._seen.add(key)
            task = asyncio.create_task(
                worker.ringer.ring(entry, self.minute + MINUTE, worker.lease)
            )
            self._rings.append(task)

    async def run(self) -> None:
        w = self._worker
        end = self.minute + MINUTE
        final_read_at = end + w.settings.grace
        if w.clock.now() < final_read_at:
            await w.clock.sleep_until(self.minute - w.settings.prefetch)
            looked_at = w.clock.now()
            self._start(await w.reader.read(self.minute, w.lease.part))
            while w.clock.now() < end and w.lease.held():
                await asyncio.sleep(w.settings.poll_every.total_seconds())
                since = looked_at - w.settings.skew
                looked_at = w.clock.now()
                self._start(await w.reader.read(self.minute, w.lease.part, since))
            await w.clock.sleep_until(final_read_at)
        else:
            await w.catch_up.wait()
        if w.lease.held():
            self._start(await w.reader.read(self.minute, w.lease.part))
        await asyncio.gather(*self._rings)


class PartWorker:
    """Works one leased part until the lease is lost or `stop()` is called."""

    def __init__(
        self,
        lease: Lease,
        leases: PartLeases,
        reader: BucketReader,
        ringer: Ringer,
        clock: DbClock,
        settings: DispatcherSettings,
        metrics: DispatcherMetrics,
        catch_up: RateLimiter,
    ) -> None:
        self.lease = lease
        self.leases = leases
        self.reader = reader
        self.ringer = ringer
        self.clock = clock
        self.settings = settings
        self.metrics = metrics
        self.catch_up = catch_up
        self._stopping = asyncio.Event()
        self.oldest_unfinished: datetime | None = None

    def stop(self) -> None:
        """Take no new minute; minutes already open finish."""
        self._stopping.set()

    def _first_minute(self) -> datetime:
        if self.lease.checkpoint is not None:
            return self.lease.checkpoint + MINUTE
        return floor_minute(self.clock.now() - self.settings.initial_lookback)

    async def run(self) -> None:
        minute = self._first_minute()
        open_jobs: deque[tuple[datetime, asyncio.Task[None]]] = deque()
        while self.lease.held():
            self._report(minute, open_jobs)
            can_open = not self._stopping.is_set() and len(open_jobs) < _MAX_OPEN_MINUTES
            if can_open and self.clock.now() >= minute - self.settings.prefetch - MINUTE:
                job = MinuteJob(self, minute)
                open_jobs.append((minute, asyncio.create_task(job.run())))
                minute += MINUTE
                continue
            if not open_jobs:
                if self._stopping.is_set():
                    return
                await asyncio.sleep(0.5)
                continue
            first_minute, first = open_jobs[0]
            waiters: set[asyncio.Future[object]] = {first}  # type: ignore[arg-type]
            if not self._stopping.is_set():
                waiters.add(asyncio.ensure_future(asyncio.sleep(0.5)))
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if first.done():
                open_jobs.popleft()
                first.result()
                if not await self.leases.checkpoint(self.lease, first_minute):
                    log.warning("part %d: lease lost; stopping", self.lease.part)
                    self.metrics.leases_lost.inc()
                    break
                self.metrics.minutes_done.inc()
        for _, task in open_jobs:
            task.cancel()

    def _report(
        self, next_minute: datetime, open_jobs: deque[tuple[datetime, asyncio.Task[None]]]
    ) -> None:
        self.oldest_unfinished = open_jobs[0][0] if open_jobs else next_minute
