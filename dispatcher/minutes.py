"""One part's minutes, in order from its checkpoint (DESIGN.md invariants 3 and 9).

For each minute M of the part:
- live (M not yet past its grace): read the bucket `prefetch` ahead of M; until M ends,
  keep reading entries written since the last look (less a skew margin) and start each
  new entry's ring at its due; after M + 60 s + grace, read the whole minute once more;
- past (catch-up after an outage): read the whole minute once, at a bounded rate.
A part taken behind (an outage, a part never checkpointed) has a backlog: the minutes
already past their final read when it was taken. They are read in order, at most
`_MAX_OPEN_MINUTES` at a time and at the catch-up pace, while the live minutes from then on
open on time beside them, so rings due now are not held up behind the backlog (and a
backlog drains at its pace even while more is due each minute than that pace). Live minutes
that fell behind their final read (held open by a notifier outage) become such a backlog.
M is checkpointed only when every ring started from it is resolved (finalized, skipped,
or taken over by a user's change), and only in order (no live minute before the backlog
is done), and only while the lease is held.
A stop (SIGTERM, a hand-over) ends the reads and waits at once; a minute it cut short is
not checkpointed, so the part's next owner reads it again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import heapq
import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import NamedTuple, TypeVar

from dispatcher.buckets import BucketReader, Entry
from dispatcher.leases import Lease, PartLeases
from dispatcher.metrics import DispatcherMetrics
from dispatcher.ratelimit import RateLimiter
from dispatcher.ringer import Ringer
from dispatcher.settings import DispatcherSettings
from dispatcher.shift import LOOK_EVERY_S, Shift
from reminders_svc.storage.clock import DbClock
from reminders_svc.storage.errors import STORAGE_ERRORS
from reminders_svc.storage.parts import MINUTE, floor_minute

log = logging.getLogger(__name__)
T = TypeVar("T")
# Minutes holding entries (still reading, or with entries not yet started) at once, of a
# backlog; of the live ones, at least as many (the current one, plus those still in their
# grace: more with a longer grace, `PartWorker.live_cap`). A minute whose reads are over
# and whose rings have all started holds only them (a task each, bounded by
# `Ringer.start`) and counts against neither, however long one ring takes.
_MAX_OPEN_MINUTES = 4
# Between tries of a bucket read or a checkpoint storage did not answer.
_STORAGE_RETRY_S = 1.0


async def _tried_again(
    part: int, what: str, attempt: Callable[[], Awaitable[T]], pause: Callable[[], Awaitable[bool]]
) -> T | None:
    """`attempt()`, tried again after each `pause()` while storage does not answer; None
    once `pause()` says to give up."""
    while True:
        try:
            return await attempt()
        except STORAGE_ERRORS as error:
            log.warning("part %d: %s failed (%s)", part, what, type(error).__name__)
            if not await pause():
                return None


async def _woken(event: asyncio.Event, wait_s: float) -> None:
    """Until `event` is set anew, or `wait_s` passes (a look at the shift, a due)."""
    event.clear()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(wait_s):
            await event.wait()


class MinuteJob:
    """One minute of one part: its reads, and its rings started in due order (those read
    late, a backlog's, in their own order beside them, at the catch-up pace).

    Entries read wait here as data (in a heap by due), not as a task each, until their due:
    a busy minute's hundreds of thousands of entries cost a few hundred bytes each, and
    only the rings under way (bounded by `Ringer.start`) cost a task.
    """

    def __init__(self, worker: PartWorker, minute: datetime, *, live: bool) -> None:
        self.minute = minute
        self._worker = worker
        # Opened before its final read (not a backlog's): its own entries are never paced.
        self._live = live
        self._seen: set[tuple[object, object]] = set()
        # Heaps by due (or by when to look again): (due, arrival, entry). Entries read
        # late (a backlog's) wait apart: they go through the catch-up pace, which must
        # not hold up the rings due now.
        self._waiting: list[tuple[datetime, int, Entry]] = []
        self._late: list[tuple[datetime, int, Entry]] = []
        self._late_starting = 0  # late entries taken off `_late`, waiting to start
        self._arrivals = itertools.count()
        self._arrived = asyncio.Event()
        self._late_arrived = asyncio.Event()
        self._reads_over = False
        self._running: set[asyncio.Task[bool | datetime]] = set()
        self._all_resolved = True
        self._failure: BaseException | None = None

    def _add(self, entries: list[Entry], read_at: datetime) -> None:
        """Keep the entries not seen before. One is late (paced) when it was read past its
        due by more than `late_after`, not when its turn comes: a busy minute's entries
        wait their turn behind each other, and that wait must not slow them down to the
        catch-up pace. A live minute's own entries (due in it) are never late: read late
        only because the minute opened late (its part taken over mid-minute, by a rollout
        or a scale-up at the busiest minute), they were paced at 50 a second, the rings
        its old owner had not sent a quarter of an hour late behind those it had."""
        late_after = self._worker.settings.late_after
        for entry in entries:
            key = (entry.reminder_id, entry.write_id)
            if key in self._seen:
                continue
            self._seen.add(key)
            entry = dataclasses.replace(entry, found_at=read_at)
            own = self._live and entry.due >= self.minute
            if read_at - entry.due > late_after and not own:
                heapq.heappush(self._late, (entry.due, next(self._arrivals), entry))
                self._late_arrived.set()
            else:
                self._wait(entry.due, entry)
        self._arrived.set()

    def _wait(self, start_at: datetime, entry: Entry) -> None:
        heapq.heappush(self._waiting, (start_at, next(self._arrivals), entry))

    @property
    def holding_entries(self) -> bool:
        """Whether the minute still reads, or holds entries not started yet (each a few
        hundred bytes): what bounds the minutes a part opens at once. One whose rings have
        all started, however long one of them takes (a device throttled for an hour), holds
        up its checkpoint, never the minutes after it."""
        reading = not self._reads_over
        return reading or bool(self._waiting or self._late) or self._late_starting > 0

    async def run(self) -> bool:
        """True when the minute is finished: read to its end and once more after the grace,
        and every ring started from it resolved. False when the shift ended first."""
        starting = asyncio.create_task(self._start_rings())
        try:
            read_through = await self._read_through()
            self._reads_over = True
            self._seen.clear()  # read no more: a busy minute's keys need not stay
            self._arrived.set()
            self._late_arrived.set()
            all_started = await starting
            # Every ring started is seen to its end, stopping or not: rings already with the
            # notifier finish, the others let their claims go.
            while self._running:
                await asyncio.wait(list(self._running))
            if self._failure is not None:
                raise self._failure
            return read_through and all_started and self._all_resolved
        finally:
            # Cancelled (the part lost, or the shutdown grace over): the rings let their
            # claims go as they are cancelled, before this returns; entries not yet started
            # hold nothing.
            starting.cancel()
            running = list(self._running)
            for ring in running:
                ring.cancel()
            await asyncio.gather(starting, *running, return_exceptions=True)

    async def _start_rings(self) -> bool:
        """Start each entry's ring, as the reads bring entries: those on time at their due,
        in due order; those read late beside them, in due order, at the catch-up pace.
        True once the reads are over and every entry is started, False if the shift ended."""
        late = asyncio.create_task(self._start_late())
        try:
            on_time = await self._start_on_time()
            return on_time and await late
        finally:
            late.cancel()
            await asyncio.gather(late, return_exceptions=True)

    def _started(self, entry: Entry, ring: asyncio.Task[bool | datetime]) -> None:
        self._running.add(ring)
        ring.add_done_callback(functools.partial(self._ring_ended, entry))

    async def _start_late(self) -> bool:
        w = self._worker
        while w.shift.on():
            if self._late:
                # Taken off before the wait: a poll meanwhile may push one due earlier,
                # which is then the heap's head. Counted while it waits: not all started.
                queued = heapq.heappop(self._late)
                self._late_starting += 1
                try:
                    ring = await w.ringer.start(queued[2], self.minute + MINUTE, w.shift, late=True)
                except BaseException:
                    heapq.heappush(self._late, queued)  # cancelled: back, not started
                    raise
                finally:
                    self._late_starting -= 1
                if ring is None:  # not started (the shift ended): back
                    heapq.heappush(self._late, queued)
                    return False
                self._started(queued[2], ring)
                continue
            if self._reads_over:
                return True
            await _woken(self._late_arrived, LOOK_EVERY_S)
        return False

    async def _start_on_time(self) -> bool:
        w = self._worker
        horizon = self.minute + MINUTE
        while w.shift.on():
            if self._waiting:
                wait_s = (self._waiting[0][0] - w.clock.now()).total_seconds()
                if wait_s <= 0:
                    _, _, entry = heapq.heappop(self._waiting)
                    ring = await w.ringer.start(entry, horizon, w.shift, late=False)
                    if ring is None:
                        return False
                    self._started(entry, ring)
                    continue
            elif self._reads_over and not self._running and not (self._late or self._late_starting):
                return True  # (a ring under way may yet hand its entry back: see _ring_ended)
            else:
                wait_s = LOOK_EVERY_S
            # Until the next due, an entry read meanwhile (it may be due sooner), or a look
            # at the shift (a stop or a lost lease ends the minute).
            await _woken(self._arrived, min(wait_s, LOOK_EVERY_S))
        return False

    def _ring_ended(self, entry: Entry, ring: asyncio.Task[bool | datetime]) -> None:
        self._running.discard(ring)
        self._arrived.set()
        if ring.cancelled():
            self._all_resolved = False
        elif (error := ring.exception()) is not None:
            self._failure = self._failure or error
        elif isinstance(again := ring.result(), datetime):
            self._wait(again, entry)  # a skip to decide again (Ringer._recheck_at)
        elif not again:
            self._all_resolved = False

    async def _read_through(self) -> bool:
        w = self._worker
        shift = w.shift
        end = self.minute + MINUTE
        final_read_at = end + w.settings.grace
        if w.clock.now() < final_read_at:
            if not await shift.sleep_until(w.clock, self.minute - w.settings.prefetch):
                return False
            looked_at = w.clock.now()
            if not await self._read_and_start():
                return False
            while w.clock.now() < end:
                if not await shift.sleep(w.settings.poll_every.total_seconds()):
                    return False
                since = looked_at - w.settings.skew
                looked_at = w.clock.now()
                if not await self._read_and_start(since):
                    return False
            if not await shift.sleep_until(w.clock, final_read_at):
                return False
        elif not await w.catch_up.take(shift):
            return False
        return await self._read_and_start()

    async def _read_and_start(self, written_since: datetime | None = None) -> bool:
        """Read the minute's entries (all, or those written since) and start their rings;
        a read storage does not answer is tried again while the shift is on (a blip does
        not cost the part its open minutes). False once the shift ended."""
        w = self._worker
        entries = await _tried_again(
            w.lease.part,
            "bucket read",
            lambda: w.reader.read(self.minute, w.lease.part, written_since),
            lambda: w.shift.sleep(_STORAGE_RETRY_S),
        )
        if entries is None:
            return False
        self._add(entries, w.clock.now())
        return True


class _Backlog:
    """Minutes past their final read, still to be opened, in order: spans [start, end)
    added in increasing order (a part taken behind; live minutes that fell behind)."""

    def __init__(self) -> None:
        self._spans: collections.deque[tuple[datetime, datetime]] = collections.deque()

    def add(self, start: datetime, end: datetime) -> None:
        if start < end:
            self._spans.append((start, end))

    def next_minute(self) -> datetime | None:
        return self._spans[0][0] if self._spans else None

    def take(self) -> datetime:
        start, end = self._spans.popleft()
        if start + MINUTE < end:
            self._spans.appendleft((start + MINUTE, end))
        return start


class _OpenMinute(NamedTuple):
    job: MinuteJob
    task: asyncio.Task[bool]

    @property
    def holds_entries(self) -> bool:
        return not self.task.done() and self.job.holding_entries


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
        self.shift = Shift(lease)
        self.leases = leases
        self.reader = reader
        self.ringer = ringer
        self.clock = clock
        self.settings = settings
        self.metrics = metrics
        self.catch_up = catch_up
        self.oldest_unfinished: datetime | None = None
        # Live minutes read at once: from `prefetch` before each to its grace after it ends
        # (a longer grace, more of them), so a minute never opens late for want of room.
        reading = math.ceil((settings.prefetch + MINUTE + settings.grace) / MINUTE)
        self.live_cap = max(_MAX_OPEN_MINUTES, reading + 1)

    @property
    def lease(self) -> Lease:
        return self.shift.lease

    def stop(self) -> None:
        """Take no new minute and no new ring; open minutes wind down (see `Shift`)."""
        self.shift.stop()

    def _first_minute(self) -> datetime:
        if self.lease.checkpoint is not None:
            return self.lease.checkpoint + MINUTE
        return floor_minute(self.clock.now() - self.settings.initial_lookback)

    def _first_live_minute(self) -> datetime:
        """The first minute whose final read (its end plus the grace) is still to come."""
        return floor_minute(self.clock.now() - MINUTE - self.settings.grace) + MINUTE

    async def run(self) -> None:
        open_jobs: dict[datetime, _OpenMinute] = {}
        cancel_open = True
        try:
            await self._work(open_jobs)
            # Stopping: the open minutes wind down by themselves. Otherwise the part was
            # lost (or a minute left unfinished): they stop now.
            cancel_open = not self.shift.stopping
        finally:
            tasks = [opened.task for opened in open_jobs.values()]
            if cancel_open:
                for task in tasks:
                    task.cancel()
            ended = await asyncio.gather(*tasks, return_exceptions=True)
            for outcome in ended:
                if isinstance(outcome, Exception):
                    log.error("part %d: a minute failed", self.lease.part, exc_info=outcome)

    async def _work(self, open_jobs: dict[datetime, _OpenMinute]) -> None:
        """Open the backlog's minutes and the live ones, each cursor in order; checkpoint
        each minute once it and every minute before it are finished, under the lease."""
        start = self._first_minute()
        live = live_from = max(start, self._first_live_minute())
        backlog = _Backlog()
        backlog.add(start, live_from)
        while self.lease.held():
            if live < (first_live := self._first_live_minute()):
                # The live minutes fell behind (a notifier outage held four of them open,
                # a stalled loop): those past their final read join the backlog, read at
                # the catch-up pace beside the minutes due from here on, which open on time
                # rather than queue behind them.
                backlog.add(live, first_live)
                live = live_from = first_live
            next_backlog = backlog.next_minute()
            self.oldest_unfinished = min(
                [*open_jobs, live if next_backlog is None else next_backlog]
            )
            if self.shift.on():
                opened = False
                # Open minutes lie below live_from (the backlog's) or from it on (live ones).
                # Only those holding entries count (`MinuteJob.holding_entries`): after a
                # jump, finished live minutes below the new live_from wait for the backlog's
                # checkpoint, and minutes whose rings have all started wait for the slowest
                # of them; counting either kept the minutes after them from opening. All of
                # them together are bounded too: a notifier outage holds every minute's
                # entries unstarted, and each jump of the live cursor opened four more.
                holding = [m for m, opened in open_jobs.items() if opened.holds_entries]
                open_backlog = sum(1 for m in holding if m < live_from)
                room = len(holding) < self.live_cap + _MAX_OPEN_MINUTES
                if next_backlog is not None and open_backlog < _MAX_OPEN_MINUTES and room:
                    self._open(open_jobs, backlog.take(), live=False)
                    opened = True
                open_live = len(holding) - open_backlog
                time_to_open = self.clock.now() >= live - self.settings.prefetch - MINUTE
                if open_live < self.live_cap and room and time_to_open:
                    self._open(open_jobs, live, live=True)
                    live += MINUTE
                    opened = True
                if opened:
                    continue
            if not open_jobs:
                if self.shift.stopping:
                    return
                await self.shift.sleep(0.5)
                continue
            first_minute = min(open_jobs)
            first = open_jobs[first_minute].task
            # The first open minute is the first unfinished one, unless backlog minutes
            # are still to be opened below it.
            in_order = next_backlog is None or first_minute < next_backlog
            if not (first.done() and in_order):
                pending = [o.task for o in open_jobs.values() if not o.task.done()]
                if pending:
                    await asyncio.wait(pending, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                elif not self.shift.on():
                    return  # backlog minutes not opened: the part's next owner reads them
                else:
                    await self.shift.sleep(0.5)
                continue
            del open_jobs[first_minute]
            if not first.result():
                # Unfinished (the shift ended first): neither it nor any later minute is
                # checkpointed; whoever works the part next re-reads it from the checkpoint.
                if self.shift.on():
                    log.warning("part %d: minute %s left unfinished", self.lease.part, first_minute)
                return
            if not await self._checkpoint(first_minute):
                log.warning("part %d: lease lost; stopping", self.lease.part)
                self.metrics.leases_lost.inc()
                return
            self.metrics.minutes_done.inc()
        if not self.lease.ended:
            # Its local deadline passed before a renewal landed (storage did not answer the
            # renewals in time): lost as far as this process can tell.
            log.warning("part %d: lease not renewed in time; stopping", self.lease.part)
            self.metrics.leases_lost.inc()

    def _open(self, open_jobs: dict[datetime, _OpenMinute], minute: datetime, live: bool) -> None:
        job = MinuteJob(self, minute, live=live)
        open_jobs[minute] = _OpenMinute(job, asyncio.create_task(job.run()))

    async def _checkpoint(self, minute: datetime) -> bool:
        """Checkpoint `minute` under the lease, tried again while storage does not answer
        and the lease lasts, stopping or not (a repeat of one that landed unseen applies
        the same again)."""

        async def lease_lasts() -> bool:
            await asyncio.sleep(_STORAGE_RETRY_S)
            return self.lease.held()

        done = await _tried_again(
            self.lease.part,
            "checkpoint",
            lambda: self.leases.checkpoint(self.lease, minute),
            lease_lasts,
        )
        return bool(done)
