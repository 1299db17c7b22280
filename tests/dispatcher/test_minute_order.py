"""The order a part's minutes are opened and checkpointed in (`PartWorker`), with each
minute's own work (its reads and rings, `MinuteJob`) replaced by a minute the test finishes
when it likes and a clock the test moves: what is asserted is the bookkeeping, which no
Cassandra timing decides."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from dispatcher import minutes
from dispatcher.buckets import BucketReader, Entry
from dispatcher.leases import Lease, PartLeases
from dispatcher.metrics import DispatcherMetrics
from dispatcher.ratelimit import RateLimiter
from dispatcher.ringer import Ringer
from dispatcher.settings import DispatcherSettings
from dispatcher.shift import Shift
from reminders_svc.storage.clock import DbClock
from tests.dispatcher.conftest import held_shift

MINUTE = timedelta(minutes=1)
CHECKPOINT = datetime(2026, 12, 6, 11, 0, tzinfo=UTC)
# With a grace of 3 minutes, the first live minute at 12:03 is 12:00 (its final read is at
# 12:04): an hour of backlog behind, and four live minutes (12:00 .. 12:03) open at once.
GRACE = timedelta(minutes=3)
TAKEN_AT = datetime(2026, 12, 6, 12, 3, tzinfo=UTC)
LIVE = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


class MovedClock:
    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


class RecordedLeases:
    def __init__(self) -> None:
        self.checkpoints: list[datetime] = []

    async def checkpoint(self, lease: Lease, minute: datetime) -> bool:
        self.checkpoints.append(minute)
        lease.checkpoint = minute
        return lease.held()


class HeldMinutes:
    """Stands in for `MinuteJob`: a minute in `held` runs until the test releases it; any
    other finishes at once."""

    def __init__(self) -> None:
        self.held: dict[datetime, asyncio.Event] = {}
        self.opened: list[datetime] = []

    def hold(self, *minutes_held: datetime) -> None:
        for minute in minutes_held:
            self.held[minute] = asyncio.Event()

    def release(self, *minutes_released: datetime) -> None:
        for minute in minutes_released:
            self.held.pop(minute).set()

    def __call__(self, worker: object, minute: datetime) -> Any:
        self.opened.append(minute)
        release = self.held.get(minute)

        class Job:
            async def run(self) -> bool:
                if release is not None:
                    await release.wait()
                return True

        return Job()


@pytest.fixture
def held_minutes(monkeypatch: pytest.MonkeyPatch) -> HeldMinutes:
    held = HeldMinutes()
    monkeypatch.setattr(minutes, "MinuteJob", held)
    return held


async def _until(condition: Any, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def test_a_backlog_drains_after_the_live_minutes_jumped_past_finished_ones(
    held_minutes: HeldMinutes,
) -> None:
    """A part taken an hour behind; a notifier outage holds its four live minutes open long
    enough for their final reads to pass, so the live cursor jumps ahead and those four
    join the backlog. Once they finish they wait, finished, for the older backlog minutes'
    checkpoints: they must not count against the backlog's open minutes, or the backlog
    never opens the minutes they wait for and the part's checkpoint stops for good."""

    async def scenario() -> None:
        clock = MovedClock(TAKEN_AT)
        leases = RecordedLeases()
        settings = DispatcherSettings(dispatcher_id="d1", grace=GRACE)
        lease = held_shift(checkpoint=CHECKPOINT).lease
        backlog_head = [CHECKPOINT + MINUTE * n for n in range(1, 5)]  # 11:01 .. 11:04
        live_held = [LIVE + MINUTE * n for n in range(4)]  # 12:00 .. 12:03
        held_minutes.hold(*backlog_head, *live_held)
        worker = _worker(settings, lease, leases, None, None, clock)
        working = asyncio.create_task(worker.run())
        try:
            # Four backlog minutes and four live ones open, none finished.
            assert await _until(lambda: len(held_minutes.opened) == 8)
            assert sorted(held_minutes.opened) == [*backlog_head, *live_held]

            # At 12:13 the held live minutes are past their final reads: the live cursor
            # jumps to 12:10, and 12:00 .. 12:09 are behind it.
            clock.at = TAKEN_AT + timedelta(minutes=10)
            assert await _until(lambda: LIVE + 10 * MINUTE in held_minutes.opened)
            held_minutes.release(*live_held)  # the notifier is back
            await asyncio.sleep(0.2)
            assert leases.checkpoints == []  # 11:01 is not finished: nothing is checkpointed
            held_minutes.release(*backlog_head)

            # The rest of the backlog (11:05 .. 11:59, and 12:04 .. 12:09 that joined it)
            # opens and finishes, and the checkpoint reaches the live minutes opened since
            # (12:10 .. 12:14: each opens 65 s before it ends, the prefetch ahead).
            last_live_open = LIVE + 14 * MINUTE
            reached = await _until(lambda: last_live_open in leases.checkpoints)
            assert reached, f"checkpoint stuck at {max(leases.checkpoints, default=CHECKPOINT)}"
            expected = [CHECKPOINT + MINUTE * n for n in range(1, 75)]  # 11:01 .. 12:14
            assert leases.checkpoints == expected  # every minute, in order, once
        finally:
            worker.stop()
            working.cancel()
            await asyncio.gather(working, return_exceptions=True)

    asyncio.run(scenario())


class PacedRinger:
    """Stands in for `Ringer.start`: a late entry waits for the catch-up pace, held here
    until the test lets it through; an entry on time starts at once."""

    def __init__(self) -> None:
        self.pace = asyncio.Event()
        self.started: list[uuid.UUID] = []
        self.paced: list[uuid.UUID] = []  # late entries that came to the pace, in order

    async def start(
        self, entry: Entry, horizon: datetime, shift: Shift, *, late: bool
    ) -> asyncio.Task[bool | datetime] | None:
        if late:
            self.paced.append(entry.reminder_id)
            await self.pace.wait()
        self.started.append(entry.reminder_id)

        async def rung() -> bool | datetime:
            return True

        return asyncio.create_task(rung())


class OneRead:
    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries

    async def read(
        self, minute: datetime, part: int, written_since: datetime | None = None
    ) -> list[Entry]:
        return [] if written_since is not None else self.entries


def _live_worker(
    settings: DispatcherSettings, reader: object, ringer: PacedRinger, clock: MovedClock
) -> minutes.PartWorker:
    """A worker of a part taken just now (no checkpoint), its lease held for 10 minutes."""
    return _worker(settings, held_shift().lease, RecordedLeases(), reader, ringer, clock)


def _worker(
    settings: DispatcherSettings,
    lease: Lease,
    leases: RecordedLeases,
    reader: object,
    ringer: object,
    clock: MovedClock,
) -> minutes.PartWorker:
    return minutes.PartWorker(
        lease,
        cast(PartLeases, leases),
        cast(BucketReader, reader),
        cast(Ringer, ringer),
        cast(DbClock, clock),
        settings,
        DispatcherMetrics(),
        RateLimiter(settings.catch_up_minutes_per_s),
    )


def test_a_late_entry_waiting_for_the_catch_up_pace_holds_up_no_ring_due_now() -> None:
    """A live minute holding an entry read long past its due (a snooze already passed
    when its finalize wrote it, an entry rewritten after a stall) next to one due now:
    the late one waits its turn in the pace all parts share, behind a backlog's, and the
    ring due now must not wait behind it."""

    async def scenario() -> None:
        minute = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
        clock = MovedClock(minute + timedelta(seconds=10))
        late = Entry("u-late", uuid.uuid4(), minute - timedelta(minutes=3), uuid.uuid1())
        on_time = Entry("u-now", uuid.uuid4(), clock.now(), uuid.uuid1())
        ringer = PacedRinger()
        settings = DispatcherSettings(dispatcher_id="d1")
        worker = _live_worker(settings, OneRead([late, on_time]), ringer, clock)
        job = asyncio.create_task(minutes.MinuteJob(worker, minute).run())
        try:
            assert await _until(lambda: on_time.reminder_id in ringer.started, within_s=2)
            assert ringer.started == [on_time.reminder_id]  # the late one still in line
            ringer.pace.set()
            assert await _until(lambda: late.reminder_id in ringer.started, within_s=2)
        finally:
            worker.stop()
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)

    asyncio.run(scenario())


class ReadsInTurn:
    """Each read answers the next of `reads` (a poll's new entries), then nothing."""

    def __init__(self, *reads: list[Entry]) -> None:
        self.reads = list(reads)

    async def read(
        self, minute: datetime, part: int, written_since: datetime | None = None
    ) -> list[Entry]:
        return self.reads.pop(0) if self.reads else []


def test_a_late_entry_read_while_another_waits_for_the_pace_is_started_too() -> None:
    """A late entry waited for the pace at the head of the late ones; a poll meanwhile
    read another, due earlier, which took the head; once the pace let the first through,
    the head was taken off, so the earlier one was never started (and the first twice),
    and the minute, all its reads done, was checkpointed: that reminder never rang."""

    async def scenario() -> tuple[bool, list[uuid.UUID], list[uuid.UUID]]:
        minute = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
        clock = MovedClock(minute + timedelta(seconds=10))
        first = Entry("u-first", uuid.uuid4(), minute - timedelta(minutes=3), uuid.uuid1())
        earlier = Entry("u-earlier", uuid.uuid4(), minute - timedelta(minutes=4), uuid.uuid1())
        ringer = PacedRinger()
        settings = DispatcherSettings(dispatcher_id="d1", poll_every=timedelta(seconds=0.05))
        reader = ReadsInTurn([first], [earlier])
        worker = _live_worker(settings, reader, ringer, clock)
        job = asyncio.create_task(minutes.MinuteJob(worker, minute).run())
        try:
            # The set-up, waited for: the first at the pace, then the earlier one read (an
            # entry is queued in the step of its read). Read before, the earlier one would
            # have been the one at the pace.
            both_read = await _until(
                lambda: not reader.reads and ringer.paced == [first.reminder_id]
            )
            assert both_read, f"reads left: {reader.reads}, at the pace: {ringer.paced}"
            ringer.pace.set()
            clock.at = minute + MINUTE + settings.grace + timedelta(seconds=1)
            finished = await asyncio.wait_for(job, timeout=10)
        finally:
            worker.stop()
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
        return finished, ringer.started, [first.reminder_id, earlier.reminder_id]

    finished, started, entries = asyncio.run(scenario())
    assert finished
    assert sorted(started) == sorted(entries)
