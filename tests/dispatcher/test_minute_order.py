"""The order a part's minutes are opened and checkpointed in (`PartWorker`), with each
minute's own work (its reads and rings, `MinuteJob`) replaced by a minute the test finishes
when it likes and a clock the test moves: what is asserted is the bookkeeping, which no
Cassandra timing decides."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
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
# 12:04): an hour of backlog behind, and five live minutes (12:00 .. 12:04) open at once.
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
    other finishes at once. A held minute holds its entries (as while the notifier is
    down, its rings unstarted) unless held with `entries_started` (its reads over, one
    ring still unresolved)."""

    def __init__(self) -> None:
        self.held: dict[datetime, asyncio.Event] = {}
        self.started: set[datetime] = set()
        self.opened: list[datetime] = []

    def hold(self, *minutes_held: datetime, entries_started: bool = False) -> None:
        for minute in minutes_held:
            self.held[minute] = asyncio.Event()
            if entries_started:
                self.started.add(minute)

    def release(self, *minutes_released: datetime) -> None:
        for minute in minutes_released:
            self.held.pop(minute).set()

    def holding(self) -> list[datetime]:
        """The minutes opened and held that hold entries."""
        return [m for m in self.opened if m in self.held and m not in self.started]

    def __call__(self, worker: object, minute: datetime, *, live: bool) -> Any:
        self.opened.append(minute)
        release = self.held.get(minute)
        holding = release is not None and minute not in self.started

        class Job:
            holding_entries = holding

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


@contextlib.asynccontextmanager
async def _running(worker: minutes.PartWorker) -> AsyncIterator[None]:
    working = asyncio.create_task(worker.run())
    try:
        yield
    finally:
        worker.stop()
        working.cancel()
        await asyncio.gather(working, return_exceptions=True)


def test_a_backlog_drains_after_the_live_minutes_jumped_past_finished_ones(
    held_minutes: HeldMinutes,
) -> None:
    """A part taken an hour behind; a notifier outage holds its live minutes open long
    enough for their final reads to pass, so the live cursor jumps ahead and they join
    the backlog. Once they finish they wait, finished, for the older backlog minutes'
    checkpoints: they must not count against the backlog's open minutes, or the backlog
    never opens the minutes they wait for and the part's checkpoint stops for good."""

    async def scenario() -> None:
        clock = MovedClock(TAKEN_AT)
        leases = RecordedLeases()
        settings = DispatcherSettings(dispatcher_id="d1", grace=GRACE)
        lease = held_shift(checkpoint=CHECKPOINT).lease
        backlog_head = [CHECKPOINT + MINUTE * n for n in range(1, 5)]  # 11:01 .. 11:04
        # With a 3-minute grace five live minutes read at once: 12:00 .. 12:04 (12:04 opens
        # a prefetch before 12:03 ends).
        live_held = [LIVE + MINUTE * n for n in range(5)]
        held_minutes.hold(*backlog_head, *live_held)
        worker = _worker(settings, lease, leases, None, None, clock)
        async with _running(worker):
            # Four backlog minutes and five live ones open, none finished.
            assert await _until(lambda: len(held_minutes.opened) == 9)
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

    asyncio.run(scenario())


def test_minutes_whose_rings_all_started_hold_up_no_minute_after_them(
    held_minutes: HeldMinutes,
) -> None:
    """Four live minutes, their reads over, each with a ring the notifier keeps answering
    "retry" (a device throttled for up to an hour): they filled the four open-minute slots,
    so the next minute never opened and its rings waited for theirs. It opens on time; the
    checkpoint still waits for them."""

    async def scenario() -> None:
        clock = MovedClock(LIVE + timedelta(seconds=10))
        leases = RecordedLeases()
        settings = DispatcherSettings(dispatcher_id="d1")
        lease = held_shift(checkpoint=LIVE - MINUTE).lease
        stuck = [LIVE + MINUTE * n for n in range(4)]  # 12:00 .. 12:03
        held_minutes.hold(*stuck, entries_started=True)
        worker = _worker(settings, lease, leases, None, None, clock)
        async with _running(worker):
            assert await _until(lambda: LIVE + MINUTE in held_minutes.opened)  # 12:00, 12:01
            clock.at = LIVE + 2 * MINUTE + timedelta(seconds=56)  # 12:04 opens at 12:02:55
            assert await _until(lambda: LIVE + 4 * MINUTE in held_minutes.opened)
            assert await _until(lambda: LIVE + 5 * MINUTE not in held_minutes.opened)
            assert leases.checkpoints == []  # 12:00's ring is unresolved
            held_minutes.release(*stuck)
            assert await _until(lambda: LIVE + 4 * MINUTE in leases.checkpoints)

    asyncio.run(scenario())


def test_a_notifier_outage_holds_a_bounded_number_of_minutes_entries(
    held_minutes: HeldMinutes,
) -> None:
    """While the notifier is down nothing is claimed, so every minute opened keeps all its
    entries; each jump of the live cursor opened four more minutes, so a pod's memory grew
    with the outage (an hour of the busiest minutes: out of memory). The minutes past that
    bound join the backlog, as spans, read again at the catch-up pace once it is over."""

    async def scenario() -> None:
        clock = MovedClock(LIVE)
        settings = DispatcherSettings(dispatcher_id="d1")
        lease = held_shift(checkpoint=LIVE - MINUTE).lease
        outage = [LIVE + MINUTE * n for n in range(61)]  # every minute of an hour
        held_minutes.hold(*outage)
        worker = _worker(settings, lease, RecordedLeases(), None, None, clock)
        bound = 8  # four live minutes (the default grace's) and four of a backlog
        async with _running(worker):
            for _ in range(6):  # an hour, ten minutes at a time
                clock.at += 10 * MINUTE
                await asyncio.sleep(0.8)  # the worker looks again every 0.5 s
                assert len(held_minutes.holding()) <= bound, held_minutes.holding()
            assert len(held_minutes.holding()) == bound  # it kept opening up to the bound

    asyncio.run(scenario())


@pytest.mark.parametrize("grace_s", [20, 200, 300])
def test_live_minutes_open_a_prefetch_ahead_whatever_the_grace(
    held_minutes: HeldMinutes, grace_s: int
) -> None:
    """Each live minute stays open from a prefetch before it to its grace after its end: with
    a grace of 200 s, five minutes read at once, and the fifth opened 20 s into its minute
    (its first rings late); at 300 s, two minutes late."""

    async def scenario() -> None:
        clock = MovedClock(LIVE)
        settings = DispatcherSettings(dispatcher_id="d1", grace=timedelta(seconds=grace_s))
        lease = held_shift(checkpoint=LIVE - MINUTE).lease
        worker = _worker(settings, lease, RecordedLeases(), None, None, clock)
        reading = [LIVE + MINUTE * n for n in range(12)]
        held_minutes.hold(*reading)  # each reads until its final read (released below)
        async with _running(worker):
            for n in range(1, 10):
                clock.at = LIVE + n * MINUTE - timedelta(seconds=1)
                read_through = [m for m in reading if m + MINUTE + settings.grace <= clock.at]
                held_minutes.release(*(m for m in read_through if m in held_minutes.held))
                # Minute n + 1 opens a prefetch (5 s) before minute n ends.
                assert await _until(lambda n=n: LIVE + (n + 1) * MINUTE in held_minutes.opened)

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
        job = asyncio.create_task(minutes.MinuteJob(worker, minute, live=True).run())
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


def test_a_minute_taken_over_mid_way_rings_its_own_entries_unpaced() -> None:
    """A part taken over a minute into its busiest minute (a rollout, a scale-up at
    09:00): that minute is still live (its final read to come), and its entries, read
    over `late_after` past their due, were all paced at the catch-up rate with a backlog's,
    the rings its old owner had not sent a quarter of an hour late. A backlog minute's
    entries are still paced."""

    minute = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
    own = Entry("u-own", uuid.uuid4(), minute + timedelta(seconds=1), uuid.uuid1())
    backlog = Entry("u-backlog", uuid.uuid4(), minute - MINUTE, uuid.uuid1())

    async def scenario() -> PacedRinger:
        clock = MovedClock(minute + timedelta(seconds=62))

        class ReadsByMinute:
            async def read(
                self, read_minute: datetime, part: int, written_since: datetime | None = None
            ) -> list[Entry]:
                entries = {minute: [own], minute - MINUTE: [backlog]}.get(read_minute, [])
                return [] if written_since is not None else entries

        ringer = PacedRinger()
        settings = DispatcherSettings(dispatcher_id="d1", grace=timedelta(seconds=15))
        # Checkpointed two minutes back: the minute before is a backlog's, this one live.
        lease = held_shift(checkpoint=minute - 2 * MINUTE).lease
        worker = _worker(settings, lease, RecordedLeases(), ReadsByMinute(), ringer, clock)
        async with _running(worker):
            await _until(lambda: own.reminder_id in ringer.started, within_s=3)
            await _until(lambda: backlog.reminder_id in ringer.paced, within_s=3)
        return ringer

    ringer = asyncio.run(scenario())
    assert own.reminder_id in ringer.started
    assert ringer.paced == [backlog.reminder_id]  # the pace never let through


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
        job = asyncio.create_task(minutes.MinuteJob(worker, minute, live=True).run())
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
