"""One part's rings in process, on the real node, handed off to a real gRPC notifier.

These pin what end-to-end timing cannot: a user's change landing just before the
dispatcher's own LWT (before its claim, again and again before its finalize), many claims
of one user let go at once, a part lost while its rings wait for the notifier.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from cassandra import ReadTimeout
from cassandra.cluster import Session
from cassandra.connection import OperationTimedOut
from cassandra.util import uuid_from_time

from dispatcher.buckets import BucketReader, Entry
from dispatcher.handoff import Answer, NotifierClient, Outcome, Ring
from dispatcher.leases import PartLeases
from dispatcher.metrics import DispatcherMetrics
from dispatcher.minutes import PartWorker
from dispatcher.ratelimit import RateLimiter
from dispatcher.ringer import HandoffBatcher, Ringer
from dispatcher.settings import DispatcherSettings, MisfirePolicy
from dispatcher.shift import Shift
from genproto.notification.v1 import notification_pb2 as npb
from genproto.notification.v1 import notification_pb2_grpc as npb_grpc
from reminders_svc.app import RemindersApp
from reminders_svc.concurrency import to_the_end
from reminders_svc.config import HANDOFF_WINDOW, Retention
from reminders_svc.connections import MAX_RECONNECT_BACKOFF_MS
from reminders_svc.domain import dispatch
from reminders_svc.domain.delivery import Answer as HistoryAnswer
from reminders_svc.domain.delivery import Delivery
from reminders_svc.domain.limits import Limits
from reminders_svc.domain.reminder import (
    Reminder,
    Status,
    delete,
    edit_schedule,
    new_reminder,
    pause,
    snooze,
)
from reminders_svc.schedule import Repeat, one_off_instant, validate_new
from reminders_svc.storage import aio
from reminders_svc.storage.clock import DbClock
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.parts import DEFAULT_PARTS, MINUTE, floor_minute, part_of
from reminders_svc.storage.purge import UserPurge
from reminders_svc.storage.reminders_store import Executor, ReminderStore, StoredReminder
from reminders_svc.storage.retry import is_conditional
from reminders_svc.storage.session import CassandraConnection
from tests.dispatcher.conftest import held_shift
from tests.dispatcher.stack import room_wait_s
from tests.platform.helpers import free_port
from tests.unknown_outcome import UnknownOutcome

UserChange = Callable[[Reminder, datetime], Reminder]


def snooze_an_hour(row: Reminder, now: datetime) -> Reminder:
    return snooze(row, now + timedelta(hours=1), now)


class Notifier(npb_grpc.NotificationServiceServicer):
    """Answers every item retryable while `down` (those of `down_for`'s users always),
    accepted otherwise."""

    def __init__(self) -> None:
        self.down = False
        self.down_for: set[str] = set()
        self.accepted: list[str] = []
        self.refused = 0
        self.received = 0  # items, as soon as they arrive
        self.answer_after_s = 0.0  # a slow push: the answer (and the push) this much later
        self.reason = ""  # each answer's
        self.first_sent: dict[str, set[datetime]] = collections.defaultdict(set)  # by key
        self.expiries: dict[str, list[datetime]] = collections.defaultdict(list)  # by key

    async def SendBatch(  # noqa: N802 (the gRPC method's name)
        self, request: npb.SendBatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> npb.SendBatchResponse:
        keys = [item.idempotency_key for item in request.notifications]
        self.received += len(keys)
        for item in request.notifications:
            self.first_sent[item.idempotency_key].add(item.first_send_time.ToDatetime(tzinfo=UTC))
            self.expiries[item.idempotency_key].append(item.expire_time.ToDatetime(tzinfo=UTC))
        await asyncio.sleep(self.answer_after_s)
        results = []
        for item in request.notifications:
            key = item.idempotency_key
            if self.down or item.user_id in self.down_for:
                self.refused += 1
                outcome = npb.SendResult.OUTCOME_RETRYABLE
            else:
                self.accepted.append(key)
                outcome = npb.SendResult.OUTCOME_ACCEPTED
            results.append(npb.SendResult(idempotency_key=key, outcome=outcome, reason=self.reason))
        return npb.SendBatchResponse(results=results)


class RacedStore(ReminderStore):
    """The real store, where a user's change can land (by LWT, as the API makes it) just
    before the dispatcher's claim or finalize; it also records the most LWTs it saw running
    at once on one user's partition."""

    def __init__(self, session: Session, executor: Executor | None = None) -> None:
        if executor is None:
            super().__init__(session, Retention())
        else:
            super().__init__(session, Retention(), executor=executor)
        self.before_claim: list[UserChange] = []
        self.before_finalize: list[UserChange] = []
        self.after_finalize: list[Callable[[], None]] = []  # run once a finalize landed
        self.after_read: list[Callable[[], None]] = []  # run once a plain row read answered
        # Rows no plain read shows: as after an LWT whose commit reached no quorum (only a
        # read through Paxos, or another LWT on the partition, completes it).
        self.unseen_by_plain_reads: set[uuid.UUID] = set()
        # A claim's reply held this long after it landed; `claim_landed` is set meanwhile.
        self.claim_reply_delay_s = 0.0
        self.claim_landed = asyncio.Event()
        # Writes of the row that land but whose answer is lost (the driver times out).
        self.replies_lost = 0
        self._running: collections.Counter[str] = collections.Counter()
        self.most_at_once = 0

    async def replace(self, before: StoredReminder, after: Reminder, now: datetime) -> bool:
        old = before.reminder
        if old.status is Status.PENDING and after.status is Status.SENDING:
            await self._land_first(self.before_claim, old, now)
        elif old.status is Status.SENDING and after.claim is None:
            await self._land_first(self.before_finalize, old, now)
        async with self._counted(old.user_id):
            applied = await super().replace(before, after, now)
        if applied and self.replies_lost:
            self.replies_lost -= 1
            raise OperationTimedOut("the answer to a write that landed was lost")
        if old.status is Status.PENDING and after.status is Status.SENDING and applied:
            self.claim_landed.set()
            await asyncio.sleep(self.claim_reply_delay_s)
        if old.status is Status.SENDING and after.claim is None and applied:
            while self.after_finalize:
                self.after_finalize.pop(0)()
        return applied

    async def get(self, user_id: str, reminder_id: uuid.UUID) -> StoredReminder | None:
        stored = await super().get(user_id, reminder_id)
        while self.after_read:
            self.after_read.pop(0)()
        return None if reminder_id in self.unseen_by_plain_reads else stored

    async def set_claim_expiry(
        self, user_id: str, reminder_id: uuid.UUID, token: uuid.UUID, expires: datetime
    ) -> bool:
        async with self._counted(user_id):
            return await super().set_claim_expiry(user_id, reminder_id, token, expires)

    async def _land_first(self, changes: list[UserChange], row: Reminder, now: datetime) -> None:
        if changes:
            stored = await self.get_serial(row.user_id, row.reminder_id)
            assert stored is not None
            assert await super().replace(stored, changes.pop(0)(stored.reminder, now), now)

    @contextlib.asynccontextmanager
    async def _counted(self, user_id: str) -> AsyncIterator[None]:
        self._running[user_id] += 1
        self.most_at_once = max(self.most_at_once, self._running[user_id])
        try:
            yield
        finally:
            self._running[user_id] -= 1


class StalledClock(DbClock):
    """The database's clock as the dispatcher reads it, `stalled` ahead: what it reads
    after a storage stall of that long (the monotonic clock it runs on cannot be moved)."""

    stalled = timedelta(0)

    def now(self) -> datetime:
        return super().now() + self.stalled


@dataclass
class Part:
    """A leased part with its ringer, as a dispatcher process has it."""

    store: RacedStore
    history: DeliveryHistory
    notifier: Notifier
    metrics: DispatcherMetrics
    settings: DispatcherSettings
    clock: StalledClock
    leases: PartLeases
    ringer: Ringer
    shift: Shift
    notifier_port: int
    notifier_server: grpc.aio.Server

    def count(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    async def due_reminder(self, user: str, due: datetime) -> Reminder:
        """A one-off created at its due (so its bucket entry is in its due's minute)."""
        reminder = new_reminder(user, "ring", one_off_instant(due), due, due)
        assert await self.store.create(reminder, await self.store.active_count(user), 1000)
        return reminder

    async def cut_notifier(self) -> None:
        """The notifier gone: connections to it refused until `restore_notifier()`."""
        await self.notifier_server.stop(None)

    async def restore_notifier(self) -> None:
        self.notifier_server = await serve_notifier(self.notifier, self.notifier_port)

    def ring(self, reminder: Reminder, shift: Shift | None = None) -> asyncio.Task[bool | datetime]:
        """Ring the reminder's bucket entry, in this part's shift or in `shift`."""
        assert reminder.due is not None
        entry = Entry(reminder.user_id, reminder.reminder_id, reminder.due, uuid.uuid1())
        horizon = floor_minute(reminder.due) + timedelta(minutes=1)
        return asyncio.create_task(self.ringer.ring(entry, horizon, shift or self.shift))

    async def row(self, reminder: Reminder) -> Reminder:
        stored = await self.store.get_serial(reminder.user_id, reminder.reminder_id)
        assert stored is not None
        return stored.reminder


async def worker_from(part: Part, session: Session, minute: datetime) -> PartWorker:
    """A worker of the part, as a dispatcher runs one, starting at `minute` (the one before
    it checkpointed)."""
    lease = part.shift.lease
    assert await part.leases.checkpoint(lease, minute - timedelta(minutes=1))
    return PartWorker(
        lease,
        part.leases,
        BucketReader(session),
        part.ringer,
        part.clock,
        part.settings,
        part.metrics,
        RateLimiter(part.settings.catch_up_minutes_per_s),
    )


async def serve_notifier(notifier: Notifier, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    npb_grpc.add_NotificationServiceServicer_to_server(notifier, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


@contextlib.asynccontextmanager
async def leased_part(
    connection: CassandraConnection,
    part: int = 0,
    wall: Callable[[], float] = time.time,
    store_executor: Executor | None = None,
    **settings_changes: Any,
) -> AsyncIterator[Part]:
    notifier = Notifier()  # type: ignore[abstract]  # only SendBatch is served
    port = free_port()
    server = await serve_notifier(notifier, port)
    client = NotifierClient(f"127.0.0.1:{port}")
    session = connection.session
    settings = DispatcherSettings(
        **{"dispatcher_id": "in-process", "grace": timedelta(seconds=1), **settings_changes}
    )
    clock = StalledClock(session, settings.max_clock_offset, wall=wall)
    await clock.measure()
    store = RacedStore(session, store_executor)
    metrics = DispatcherMetrics()
    batcher = HandoffBatcher(client, settings.batch_size)
    history = DeliveryHistory(session)
    ringer = Ringer(store, history, batcher, clock, settings, metrics)
    leases = PartLeases(session, settings.dispatcher_id, settings.lease)
    lease = await leases.try_take(part)
    assert lease is not None
    shift = Shift(lease)
    leased = Part(
        store, history, notifier, metrics, settings, clock, leases, ringer, shift, port, server
    )
    try:
        yield leased
    finally:
        await client.close()
        await leased.notifier_server.stop(None)


async def _until(condition: Callable[[], bool], timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 (set by other tasks: polled, as tests do)
            await asyncio.sleep(0.05)


async def _sleep_until(instant: datetime) -> None:
    await asyncio.sleep(max(0.0, (instant - datetime.now(UTC)).total_seconds()))


async def _with_room_left_in_the_minute(room_s: int) -> None:
    """Before taking a lease: tests do not renew it."""
    await asyncio.sleep(room_wait_s(room_s))


def _with_room_left_in_the_parts_minute(part: Part, room_s: int) -> None:
    """At least `room_s` seconds left in the minute by the part's clock (the one its ringer
    and workers read): moved on to the next minute's second 1 if need be, not waited for
    on the wall clock. Only for a scenario whose dues and waits all go by that clock, and
    whose bucket entries are all read by a whole read (an entry's stamp is the database's
    time, which trails a clock moved on: a read of those written since would miss it)."""
    now = part.clock.now()
    left = floor_minute(now) + MINUTE - now
    if left < timedelta(seconds=room_s):
        part.clock.stalled += left + timedelta(seconds=1)


# A lease for a test whose work takes many seconds: nothing renews a test's lease, and the
# default one holds for 12 s, which a slow machine can use up.
_LONG_WORK = timedelta(seconds=120)


def _just_due() -> datetime:
    return (datetime.now(UTC) - timedelta(seconds=1)).replace(microsecond=0)


@pytest.mark.parametrize(
    ("change", "rings"), [(pause, False), (snooze_an_hour, True)], ids=["pause", "snooze"]
)
def test_a_claim_lost_to_a_users_change_is_counted_and_the_row_decides_again(
    own_keyspace: CassandraConnection, change: UserChange, rings: bool
) -> None:
    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            reminder = await part.due_reminder("u-claim", _just_due())
            part.store.before_claim.append(change)

            ended = await part.ring(reminder)

            assert part.count("reminders_dispatch_claims_lost_total") == 1
            # Snoozed (its due unchanged, so no new entry): it still rings. Paused: skipped,
            # and looked at again at the minute's final read (a resume may be landing).
            assert len(part.notifier.accepted) == (1 if rings else 0)
            # (decided again at the final read while the entry's own write may be landing)
            deferred = part.count("reminders_dispatch_skips_deferred_total")
            paused_skips = part.count("reminders_dispatch_skips_total", reason="paused")
            assert deferred + paused_skips == (0 if rings else 1)
            assert (ended is True) if rings or paused_skips else isinstance(ended, datetime)

    asyncio.run(scenario())


def test_a_minute_is_not_checkpointed_while_its_finalize_keeps_losing_to_snoozes(
    own_keyspace: CassandraConnection,
) -> None:
    user = "u-finalize"
    due = (datetime.now(UTC) - timedelta(seconds=90)).replace(microsecond=0)
    minute = floor_minute(due)

    async def scenario() -> None:
        async with leased_part(
            own_keyspace, part_of(user, DEFAULT_PARTS), lease=_LONG_WORK
        ) as part:
            reminder = await part.due_reminder(user, due)
            # More lost compares than a finalize used to try before giving up (10).
            part.store.before_finalize.extend([snooze_an_hour] * 11)
            lease = part.shift.lease
            worker = await worker_from(part, own_keyspace.session, minute)
            working = asyncio.create_task(worker.run())
            await _until(lambda: lease.checkpoint is not None and lease.checkpoint >= minute, 30)
            worker.stop()
            await working

            row = await part.row(reminder)
            assert row.status is Status.PENDING  # finalized before its minute was checkpointed
            assert row.claim is None
            assert row.due == row.snooze_until  # the last snooze kept, the series went on
            assert len(part.notifier.accepted) == 1
            assert part.store.before_finalize == []

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("snoozed_for", "written_again"),
    [(timedelta(seconds=1), True), (timedelta(hours=1), False)],
    ids=["next-ring-past", "next-ring-ahead"],
)
def test_a_finalize_landing_after_its_next_rings_minute_closed_writes_its_entry_again(
    own_keyspace: CassandraConnection, snoozed_for: timedelta, written_again: bool
) -> None:
    """Snoozed while ringing to a time that passes before the finalize: the next ring's
    entry goes into the minute the finalize begins in. Should the finalize land only after
    that minute's final read (a storage stall of minutes), that read may have found the row
    still sending and skipped it: the entry is written again, into the minute of the
    landing, and the ring is not lost. A next ring still ahead needs nothing more."""
    user = "u-stalled-finalize"
    stall = timedelta(minutes=2)

    def snooze_by(row: Reminder, now: datetime) -> Reminder:
        assert row.claim is not None
        return snooze(row, row.claim.due + snoozed_for, now)

    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            reminder = await part.due_reminder(user, _just_due())
            part.store.before_finalize.append(snooze_by)

            def stalled() -> None:
                part.clock.stalled = stall

            part.store.after_finalize.append(stalled)

            assert await part.ring(reminder) is True

            row = await part.row(reminder)
            assert row.status is Status.PENDING
            assert row.due is not None
            assert row.due == row.snooze_until
            assert len(part.notifier.accepted) == 1
            landed_minute = floor_minute(part.clock.now())
            entries = await _entries_of(own_keyspace.session, row, landed_minute)
            assert entries == ([row.due] if written_again else [])
            rewritten = part.count("reminders_dispatch_entries_rewritten_total")
            assert rewritten == (1 if written_again else 0)
            # The entry written as the finalize began is there in either case (in the
            # minute of its due, or of the finalize's start: the minute just turned, perhaps).
            began = landed_minute - stall
            written_first = [
                due
                for minute in {floor_minute(row.due), began, began - MINUTE}
                for due in await _entries_of(own_keyspace.session, row, minute)
            ]
            assert row.due in written_first

    asyncio.run(scenario())


async def _entries_of(session: Session, row: Reminder, minute: datetime) -> list[datetime]:
    """The dues of the row's bucket entries in `minute`, read as a dispatcher reads them."""
    entries = await BucketReader(session).read(minute, part_of(row.user_id, DEFAULT_PARTS))
    return [entry.due for entry in entries if entry.reminder_id == row.reminder_id]


class _RowOnlyStore(ReminderStore):
    """Writes rows without their bucket entry (the test writes it, stamped as it likes)."""

    async def write_bucket_entry(self, reminder: Reminder, now: datetime) -> None:
        pass


@contextlib.asynccontextmanager
async def _this_minute_worked(
    connection: CassandraConnection, user: str, **settings_changes: Any
) -> AsyncIterator[tuple[Part, PartWorker, datetime]]:
    """The current minute of `user`'s part worked from a checkpoint just before it, with
    room left in it for a due; yields once its first whole read is done and the reads of
    entries written since are under way. Nothing renews the lease: it outlasts the test."""
    await _with_room_left_in_the_minute(15)
    async with leased_part(
        connection, part_of(user, DEFAULT_PARTS), lease=_LONG_WORK, **settings_changes
    ) as part:
        minute = floor_minute(datetime.now(UTC))
        worker = await worker_from(part, connection.session, minute)
        working = asyncio.create_task(worker.run())
        # A clock measured over a minute ago is not ready (no hand-off on it), and the
        # minute's final read may come that late: measured again, as the service's ticks do.
        measuring = asyncio.create_task(_keep_measuring(part.clock))
        await asyncio.sleep(2)
        try:
            yield part, worker, minute
        finally:
            measuring.cancel()
            worker.stop()
            await working


async def _keep_measuring(clock: DbClock) -> None:
    while True:
        await asyncio.sleep(10)
        await clock.measure()


def _one_off_in(user: str, text: str, seconds: int) -> Reminder:
    created = datetime.now(UTC).replace(microsecond=0)
    due = created + timedelta(seconds=seconds)
    return new_reminder(user, text, one_off_instant(due), due, created)


def test_an_entry_the_reads_since_the_last_look_cannot_see_rings_after_the_final_read(
    own_keyspace: CassandraConnection,
) -> None:
    """An entry stamped earlier than the last look less the skew (a write that landed
    late) is invisible to the reads of entries written since: only the whole minute's
    read after its end plus the grace finds it. It rings then, late but once, and the
    minute is checkpointed only after."""
    user = "u-late-entry"
    session = own_keyspace.session

    async def scenario() -> None:
        async with _this_minute_worked(own_keyspace, user) as (part, worker, minute):
            lease = part.shift.lease
            reminder = _one_off_in(user, "late entry", 5)
            due = reminder.due
            rows_only = _RowOnlyStore(session, Retention())
            assert await rows_only.create(reminder, await rows_only.active_count(user), 1000)
            stamped = uuid_from_time(time.time() - 60)  # well before the last look
            await aio.execute(
                session,
                session.prepare(
                    "INSERT INTO due_buckets (minute, part, written_at, reminder_id, user_id,"
                    " due) VALUES (?, ?, ?, ?, ?, ?)"
                ),
                (minute, lease.part, stamped, reminder.reminder_id, user, due),
            )

            end = minute + timedelta(minutes=1)
            assert due is not None
            # The reads since the last look go on past its due, on the wall clock (that of
            # the entries' stamps); then the part's clock is moved on to the minute's last
            # second rather than waited for (no entry is written from here on).
            await _sleep_until(due + timedelta(seconds=5))
            part.clock.stalled = max(timedelta(0), end - timedelta(seconds=1) - part.clock.now())
            assert part.notifier.accepted == []  # due, but not seen by the reads since
            assert lease.checkpoint == minute - timedelta(minutes=1)
            await _until(lambda: len(part.notifier.accepted) == 1, 20)
            assert part.clock.now() >= end + part.settings.grace
            await _until(lambda: lease.checkpoint is not None and lease.checkpoint >= minute, 20)
            worker.stop()
            assert len(part.notifier.accepted) == 1
            assert (await part.row(reminder)).status is Status.DONE

    asyncio.run(scenario())


# The grace G: longer than the row's write takes to land after its entry here (~5 s), as
# the API's write deadline is shorter than G in any deployment (DESIGN.md invariant 3).
_ROW_LANDS_WITHIN = timedelta(seconds=8)


@pytest.mark.parametrize("landing", ["create", "resume"])
def test_a_row_whose_write_lands_after_its_entry_was_read_rings_at_the_final_read(
    own_keyspace: CassandraConnection, landing: str
) -> None:
    """A user's write puts the bucket entry first and the row second; the row's LWT may
    land seconds later (contention, a timeout that lands), within the write deadline. Read
    before it lands, the row says skip (not there yet; still paused): that skip is decided
    again at the minute's final read, and the reminder rings then, once (invariant 3).
    Before, the final read ignored entries already seen, the minute was checkpointed, and
    the reminder (for a repeat, its whole series) never rang."""
    user = f"u-late-{landing}"
    session = own_keyspace.session

    async def scenario() -> None:
        async with _this_minute_worked(own_keyspace, user, grace=_ROW_LANDS_WITHIN) as (
            part,
            worker,
            minute,
        ):
            lease = part.shift.lease
            reminder = _one_off_in(user, "late row", 3)
            created, due = reminder.created_at, reminder.due
            assert due is not None
            rows_only = _RowOnlyStore(session, Retention())
            if landing == "resume":  # the row there, paused, when its entry is read
                assert await rows_only.create(reminder, await rows_only.active_count(user), 9)
                stored = await part.store.get_serial(user, reminder.reminder_id)
                assert stored is not None
                paused = dataclasses.replace(
                    reminder, status=Status.PAUSED, version=reminder.version + 1
                )
                assert await part.store.replace(stored, paused, created)
            await part.store.write_bucket_entry(reminder, created)
            await _sleep_until(due + timedelta(seconds=2))  # read, skipped; then the row:
            if landing == "create":
                assert await rows_only.create(reminder, await rows_only.active_count(user), 9)
            else:
                stored = await part.store.get_serial(user, reminder.reminder_id)
                assert stored is not None
                resumed = dataclasses.replace(
                    stored.reminder, status=Status.PENDING, version=stored.reminder.version + 1
                )
                # The row alone: its entry is the one written first (a replace writing one
                # now would be read at once, and ring without the final read).
                assert await rows_only.replace(stored, resumed, datetime.now(UTC))
            assert part.notifier.accepted == []

            end = minute + timedelta(minutes=1)
            # Skipped and handed back to the minute, and the row landed: the part's clock
            # is moved on to the minute's end rather than waited for (the reads since the
            # last look have nothing left to find); the grace G is still waited out.
            part.clock.stalled = max(timedelta(0), end - part.clock.now())
            await _until(lambda: lease.checkpoint is not None and lease.checkpoint >= minute, 90)
            worker.stop()
            assert len(part.notifier.accepted) == 1
            assert part.clock.now() >= end + part.settings.grace
            assert (await part.row(reminder)).status is Status.DONE

    asyncio.run(scenario())


def test_an_edit_landing_while_sending_that_keeps_the_due_leaves_the_series_ringing(
    own_keyspace: CassandraConnection,
) -> None:
    """An hourly repeat claimed at its due D; while it is with the notifier the user edits
    its text, on an API host whose clock is a little behind, so its next ring computes to
    D again. The row went back to pending at D with no entry left to read (the one for D
    was consumed, its minute checkpointed) and the series never rang again. The edit
    writes the entry again: D is handed off again (the same key, so the notifier answers
    duplicate) and the series goes on to D + 1 h."""
    user = "u-edit-same-due"
    due = floor_minute(datetime.now(UTC) - timedelta(seconds=90))
    hourly = Repeat("FREQ=HOURLY", "UTC", due.replace(tzinfo=None))

    def edit_on_a_lagging_api(row: Reminder, now: datetime) -> Reminder:
        assert row.due is not None
        return edit_schedule(row, "edited", hourly, validate_new(hourly, row.due), row.due)

    async def scenario() -> tuple[Reminder, list[str]]:
        async with leased_part(
            own_keyspace, part_of(user, DEFAULT_PARTS), lease=_LONG_WORK
        ) as part:
            reminder = new_reminder(user, "ring", hourly, due, due)
            assert await part.store.create(reminder, None, 1000)
            part.store.before_finalize.append(edit_on_a_lagging_api)
            worker = await worker_from(part, own_keyspace.session, due)
            working = asyncio.create_task(worker.run())
            try:
                async with asyncio.timeout(60):
                    row = await part.row(reminder)
                    while row.due != due + timedelta(hours=1):
                        await asyncio.sleep(0.2)
                        row = await part.row(reminder)
            finally:
                worker.stop()
                await working
            return row, part.notifier.accepted

    row, accepted = asyncio.run(scenario())
    assert row.status is Status.PENDING
    assert row.text == "edited"
    assert len(set(accepted)) == 1  # D's key, handed off again after the edit


@pytest.mark.parametrize(
    ("written_ago_s", "deferred"), [(0, True), (60, False)], ids=["just-written", "old"]
)
def test_a_skip_is_deferred_only_while_the_entrys_own_write_may_still_be_landing(
    own_keyspace: CassandraConnection, written_ago_s: int, deferred: bool
) -> None:
    """A paused row's entry: written just now, its resume may still be landing (decided
    again at the final read); written a minute ago (more than G), the row shows whatever
    wrote it, and the skip is final at once, not re-read with the minute's live rings."""

    async def scenario() -> tuple[bool | datetime, float, float]:
        async with leased_part(own_keyspace, grace=timedelta(seconds=10)) as part:
            reminder = await part.due_reminder(f"u-paused-{written_ago_s}", _just_due())
            assert reminder.due is not None
            stored = await part.store.get_serial(reminder.user_id, reminder.reminder_id)
            assert stored is not None
            now = datetime.now(UTC)
            assert await part.store.replace(stored, pause(stored.reminder, now), now)
            stamp = uuid_from_time(time.time() - written_ago_s)
            entry = Entry(reminder.user_id, reminder.reminder_id, reminder.due, stamp)
            horizon = floor_minute(reminder.due) + timedelta(minutes=1)
            ended = await part.ringer.ring(entry, horizon, part.shift)
            skips = part.count("reminders_dispatch_skips_total", reason="paused")
            return ended, part.count("reminders_dispatch_skips_deferred_total"), skips

    ended, deferrals, skips = asyncio.run(scenario())
    assert isinstance(ended, datetime) is deferred
    assert (deferrals, skips) == ((1, 0) if deferred else (0, 1))


def test_a_skip_read_before_the_final_read_is_not_final_however_late_the_read_answers(
    own_keyspace: CassandraConnection,
) -> None:
    """A paused row whose entry was just written (its resume may be landing), read before
    the minute's final read but answered after it (a slow replica): the row the read saw
    may predate the write, so the skip is decided again, not made final by the time the
    answer came."""

    async def scenario() -> tuple[bool | datetime, float, float]:
        grace = timedelta(seconds=10)
        async with leased_part(own_keyspace, grace=grace) as part:
            reminder = await part.due_reminder("u-slow-read", _just_due())
            assert reminder.due is not None
            stored = await part.store.get_serial(reminder.user_id, reminder.reminder_id)
            assert stored is not None
            now = datetime.now(UTC)
            assert await part.store.replace(stored, pause(stored.reminder, now), now)
            entry = Entry(reminder.user_id, reminder.reminder_id, reminder.due, uuid.uuid1())
            horizon = floor_minute(reminder.due) + timedelta(minutes=1)

            def answered_past_the_final_read() -> None:
                part.clock.stalled = horizon + grace + timedelta(seconds=1) - part.clock.now()

            part.store.after_read.append(answered_past_the_final_read)
            ended = await part.ringer.ring(entry, horizon, part.shift)
            skips = part.count("reminders_dispatch_skips_total", reason="paused")
            return ended, part.count("reminders_dispatch_skips_deferred_total"), skips

    ended, deferrals, skips = asyncio.run(scenario())
    assert isinstance(ended, datetime)
    assert (deferrals, skips) == (1, 0)


class _RecordingClient:
    """Stands in for the notifier's client: records the keys of each batch, accepts all."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, rings: list[Ring]) -> dict[str, Answer]:
        self.sent += [ring.key for ring in rings]
        await asyncio.sleep(0.05)
        return {ring.key: Answer(Outcome.ACCEPTED, "") for ring in rings}


@pytest.mark.parametrize("cut_first", [False, True], ids=["still-queued", "batch-cut"])
def test_a_cancelled_hand_off_is_either_never_sent_or_seen_as_on_its_way(cut_first: bool) -> None:
    """A ring's waiter cancelled (its part lost) in the same turn as another ring fills the
    batch: its ring must not go out unseen, since its claim is then let go. Either it is
    left out of the batch, or `sending` says it is on its way (its claim then stands)."""

    async def scenario() -> tuple[bool, list[str]]:
        client = _RecordingClient()
        batcher = HandoffBatcher(client, batch_size=2, linger_s=1.0)  # type: ignore[arg-type]
        seen: list[bool] = []

        async def deliver(key: str) -> Answer:
            try:
                return await batcher.send(_ring(key), held_shift())
            except asyncio.CancelledError:
                seen.append(batcher.sending(key))  # what Ringer._deliver then decides on
                raise

        first = asyncio.create_task(deliver("A"))
        await asyncio.sleep(0)  # A queued
        second = asyncio.create_task(batcher.send(_ring("B"), held_shift()))
        if cut_first:
            await asyncio.sleep(0)  # B fills the batch: A's is cut for sending
        first.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
        return seen[0], client.sent

    on_its_way, sent = asyncio.run(scenario())
    assert on_its_way is ("A" in sent)
    assert "B" in sent


def test_a_ring_waiting_for_its_batch_when_its_part_was_lost_is_never_sent() -> None:
    """A dispatcher paused (SIGSTOP) past its lease with rings queued for their batch: on
    waking, the batch went out, for a part the process no longer owned."""

    async def scenario() -> tuple[list[Answer], list[str]]:
        client = _RecordingClient()
        batcher = HandoffBatcher(client, batch_size=10, linger_s=0.2)  # type: ignore[arg-type]
        lost, kept = held_shift(), held_shift()
        queued = [
            asyncio.create_task(batcher.send(_ring("lost"), lost)),
            asyncio.create_task(batcher.send(_ring("kept"), kept)),
        ]
        await asyncio.sleep(0)  # both queued, the batch not yet cut
        lost.lease.end()  # its lease ran out while it waited
        return list(await asyncio.gather(*queued)), client.sent

    answers, sent = asyncio.run(scenario())
    assert sent == ["kept"]
    assert [answer.outcome for answer in answers] == [Outcome.RETRYABLE, Outcome.ACCEPTED]


def _ring(key: str) -> Ring:
    now = datetime.now(UTC)
    return Ring(
        key=key, user_id="u", text="t", due=now, expires=now + timedelta(minutes=1), first_sent=now
    )


def test_a_ring_cancelled_while_with_the_notifier_keeps_its_claim_so_a_delete_says_in_flight(
    own_keyspace: CassandraConnection,
) -> None:
    """The part lost (or the shutdown grace over) while a ring's batch is with the notifier:
    the push may still happen, so the claim is not let go but stands until it expires. A
    pause then clears it with its hand-off window still open, and a delete answers "a ring
    may be in flight". Before, the claim was let go (expiry now), the delete answered "not
    in flight", and the push went out after it."""

    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            part.notifier.answer_after_s = 3.0
            reminder = await part.due_reminder("u-cancelled-in-flight", _just_due())
            ring = part.ring(reminder)
            await _until(lambda: part.notifier.received == 1, 10)
            ring.cancel()
            await asyncio.gather(ring, return_exceptions=True)

            app = RemindersApp(part.store, Limits())
            await app.pause(reminder.user_id, reminder.reminder_id, None)
            deleted = await app.delete(reminder.user_id, reminder.reminder_id, None)
            await _until(lambda: len(part.notifier.accepted) == 1, 10)  # the push went out

            assert deleted.was_sending

    asyncio.run(scenario())


async def _claimed_and_waiting_to_retry(
    part: Part, user: str, count: int, due: datetime | None = None
) -> tuple[list[Reminder], list[asyncio.Task[bool | datetime]]]:
    """`count` of `user`'s reminders due now (or at `due`), each claimed, handed off once
    to a notifier that is down, and waiting to retry."""
    part.notifier.down = True
    due = due or _just_due()
    reminders = [await part.due_reminder(user, due) for _ in range(count)]
    rings = [part.ring(reminder) for reminder in reminders]
    await _until(lambda: part.notifier.refused >= count, 10)
    return reminders, rings


def test_rings_waiting_to_retry_leave_their_slots_to_rings_not_yet_claimed(
    own_keyspace: CassandraConnection,
) -> None:
    """A notifier answering "retry" for one user's rings (a push service throttling one
    device, for up to an hour): each held its slot from its read to its finalize, backoffs
    included, so `max_in_flight` of them left every other ring unclaimed meanwhile."""

    async def scenario() -> None:
        async with leased_part(own_keyspace, max_in_flight=2, lease=_LONG_WORK) as part:
            part.notifier.down_for = {"u-throttled"}
            due = _just_due()
            throttled = [await part.due_reminder("u-throttled", due) for _ in range(2)]
            retrying = [part.ring(reminder) for reminder in throttled]
            await _until(lambda: part.notifier.refused >= 2, 20)
            other = await part.due_reminder("u-other", due)

            async with asyncio.timeout(20):
                assert await part.ring(other)

            assert len(part.notifier.accepted) == 1
            assert (await part.row(other)).status is Status.DONE
            part.notifier.down_for = set()
            async with asyncio.timeout(60):
                assert await asyncio.gather(*retrying) == [True, True]
            assert len(set(part.notifier.accepted)) == 3

    asyncio.run(scenario())


def test_nothing_is_claimed_while_the_notifier_cannot_be_reached_and_all_ring_once_it_is_back(
    own_keyspace: CassandraConnection,
) -> None:
    """Rings due while the notifier is unreachable were each claimed and retried, their
    claims renewed by an LWT at every retry for the whole outage: an hour's rings cost the
    database thousands of LWTs a second. They now wait unclaimed, and go when it is back."""

    async def scenario() -> None:
        async with leased_part(own_keyspace, lease=_LONG_WORK) as part:
            await part.cut_notifier()
            due = _just_due()
            reminders = [await part.due_reminder(f"u-unreached-{n}", due) for n in range(3)]
            rings = [part.ring(reminder) for reminder in reminders]
            await asyncio.sleep(3)

            assert [(await part.row(r)).status for r in reminders] == [Status.PENDING] * 3
            assert part.count("reminders_dispatch_notifier_errors_total") == 0

            await part.restore_notifier()
            back = time.monotonic()
            async with asyncio.timeout(15):
                assert await asyncio.gather(*rings) == [True] * 3
            assert time.monotonic() - back < MAX_RECONNECT_BACKOFF_MS / 1000 + 2
            assert len(part.notifier.accepted) == len(set(part.notifier.accepted)) == 3
            assert [(await part.row(r)).status for r in reminders] == [Status.DONE] * 3

    asyncio.run(scenario())


def test_while_the_notifier_answers_every_ring_retry_new_rings_wait_unclaimed_but_one_probe(
    own_keyspace: CassandraConnection,
) -> None:
    """A notifier connected but taking nothing (its storage down: every item "retry") had
    every ring due meanwhile claimed and retried, an LWT per retry for the whole outage.
    Now the rings due then wait unclaimed, one let through every 2 s to find out when it
    takes rings again; then all go, once each."""

    async def scenario() -> None:
        async with leased_part(own_keyspace, lease=_LONG_WORK) as part:
            part.notifier.down = True
            first = part.ring(await part.due_reminder("u-refused-0", _just_due()))
            # Its retries 0.5, 1 and 2 s apart: three calls refused over 3.5 s.
            await _until(lambda: part.notifier.refused >= 4, 30)
            due = _just_due()
            later = [await part.due_reminder(f"u-refused-{n}", due) for n in range(1, 7)]
            rings = [part.ring(reminder) for reminder in later]
            await asyncio.sleep(3)

            statuses = [(await part.row(r)).status for r in later]
            assert statuses.count(Status.SENDING) <= 2, statuses  # the probes
            assert statuses.count(Status.PENDING) >= 4, statuses

            part.notifier.down = False
            async with asyncio.timeout(20):
                assert await asyncio.gather(first, *rings) == [True] * 7
            assert len(part.notifier.accepted) == len(set(part.notifier.accepted)) == 7

    asyncio.run(scenario())


def test_a_ring_retrying_when_the_notifier_went_away_goes_out_as_soon_as_it_is_back(
    own_keyspace: CassandraConnection,
) -> None:
    """A ring claimed before the outage waited out its backoff (up to 30 s) after the
    notifier was back, behind the rings due since."""

    async def scenario() -> None:
        async with leased_part(own_keyspace, lease=_LONG_WORK) as part:
            part.notifier.down = True
            reminder = await part.due_reminder("u-retrying", _just_due())
            ring = part.ring(reminder)
            # Five "retry" answers: the backoff's next delays are 4 to 8 s, then 8 to 16 s.
            await _until(lambda: part.notifier.refused >= 5, 30)
            await part.cut_notifier()
            part.notifier.down = False
            errors = part.count("reminders_dispatch_notifier_errors_total")
            # Its next attempt finds no notifier; the backoff after it is 8 s or more.
            await _until(
                lambda: part.count("reminders_dispatch_notifier_errors_total") > errors, 30
            )
            await asyncio.sleep(0.5)
            await part.restore_notifier()
            back = time.monotonic()
            async with asyncio.timeout(30):
                assert await ring
            assert time.monotonic() - back < MAX_RECONNECT_BACKOFF_MS / 1000 + 2
            assert len(part.notifier.accepted) == 1

    asyncio.run(scenario())


def test_a_ring_retried_past_its_expiry_is_sent_late_with_an_expiry_of_its_own(
    own_keyspace: CassandraConnection,
) -> None:
    """Each attempt's expiry counts from the attempt: a ring the notifier kept answering
    "retry" longer than the expiry is late (the misfire policy's business), not expired."""

    async def scenario() -> None:
        expiry = timedelta(seconds=2)
        async with leased_part(own_keyspace, lease=_LONG_WORK, ring_expiry=expiry) as part:
            part.notifier.down = True
            due = _just_due()
            ring = part.ring(await part.due_reminder("u-expiring", due))
            await _until(lambda: part.notifier.refused >= 4, 30)
            part.notifier.down = False
            async with asyncio.timeout(30):
                assert await ring

            [key] = part.notifier.accepted
            assert part.notifier.expiries[key][-1] > due + expiry + timedelta(seconds=2)

    asyncio.run(scenario())


def test_one_users_rings_due_at_once_all_go_out_with_one_lwt_at_a_time_on_its_partition(
    own_keyspace: CassandraConnection,
) -> None:
    async def scenario() -> None:
        async with leased_part(own_keyspace, lease=_LONG_WORK) as part:
            due = _just_due()
            reminders = [await part.due_reminder("u-busy", due) for _ in range(20)]

            async with asyncio.timeout(20):
                assert await asyncio.gather(*(part.ring(r) for r in reminders)) == [True] * 20

            assert len(set(part.notifier.accepted)) == 20
            assert part.store.most_at_once == 1  # claims, renewals, finalizes alike

    asyncio.run(scenario())


def test_nothing_is_handed_off_while_the_clock_disagrees_with_the_databases(
    own_keyspace: CassandraConnection,
) -> None:
    """Never early: a host clock found 30 s off holds every ring (the row untouched) until
    a measurement agrees again; then it rings."""
    step_s = 30.0

    def stepped_wall() -> float:
        return time.time() + step_s

    async def scenario() -> None:
        nonlocal step_s
        async with leased_part(own_keyspace, wall=stepped_wall) as part:
            assert not part.clock.ready()
            reminder = await part.due_reminder("u-clock", _just_due())
            ring = part.ring(reminder)
            await asyncio.sleep(2.5)
            assert part.notifier.accepted == []
            assert (await part.row(reminder)).status is Status.PENDING

            step_s = 0.0
            await part.clock.measure()
            async with asyncio.timeout(10):
                assert await ring
            assert len(part.notifier.accepted) == 1

    asyncio.run(scenario())


def test_stopping_lets_one_users_unsent_claims_go_one_lwt_at_a_time(
    own_keyspace: CassandraConnection,
) -> None:
    async def scenario() -> None:
        async with leased_part(own_keyspace, lease=_LONG_WORK) as part:
            reminders, rings = await _claimed_and_waiting_to_retry(part, "u-many", 20)

            part.shift.stop()
            # 20 LWTs one after another, on a loaded machine; still well inside the claim
            # lease (30 s), which the expiries below tell apart from a release.
            async with asyncio.timeout(15):
                assert await asyncio.gather(*rings) == [False] * len(rings)

            let_go_by = part.clock.now() + timedelta(seconds=1)
            for reminder in reminders:
                row = await part.row(reminder)
                assert row.status is Status.SENDING
                assert row.claim is not None
                assert row.claim.expires <= let_go_by  # released, not left to the claim lease
            assert part.store.most_at_once == 1
            assert part.count("reminders_dispatch_claims_lost_total") == 0

    asyncio.run(scenario())


def test_a_ring_retrying_renews_its_claim_and_stops_once_the_user_deletes_it(
    own_keyspace: CassandraConnection,
) -> None:
    """While the notifier answers "retry", each retry first renews the claim; once a
    delete has taken the row, the renewal fails and nothing more is sent."""

    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            [reminder], [ring] = await _claimed_and_waiting_to_retry(part, "u-renew", 1)
            claimed = await part.row(reminder)
            assert claimed.claim is not None
            # Two retries later (a renewal before each), whenever that first read landed.
            await _until(lambda: part.notifier.refused >= 3, 20)
            renewed = await part.row(reminder)
            assert renewed.claim is not None
            assert renewed.claim.token == claimed.claim.token
            assert renewed.claim.expires > claimed.claim.expires

            stored = await part.store.get_serial(reminder.user_id, reminder.reminder_id)
            assert stored is not None
            now = part.clock.now()
            assert await ReminderStore.replace(
                part.store, stored, delete(stored.reminder, now), now
            )

            # The notifier stays down: a ring still retrying would never end. It ends,
            # at its next renewal, and sends nothing more.
            async with asyncio.timeout(60):
                assert await ring  # resolved: the row is the user's now
            sent = part.notifier.refused
            await asyncio.sleep(1)
            assert part.notifier.refused == sent
            assert part.count("reminders_dispatch_claims_lost_total") == 1
            row = await part.row(reminder)
            assert row.status is Status.DELETED
            assert row.claim is None

    asyncio.run(scenario())


def _is_claim_renewal(statement: Any) -> bool:
    return "SET claim_expires" in str(getattr(statement, "query_string", statement))


def test_a_claim_renewal_that_did_not_land_unheard_does_not_give_the_ring_up(
    own_keyspace: CassandraConnection,
) -> None:
    """The renewal before a retry timed out and, read through Paxos, had not landed: the
    claim still stood, this ring's, yet the ring was given up as if the user had taken it
    over (counted a claim lost, its minute free to be checkpointed): the row stayed
    `sending` and never rang. It is storage trouble: the claim is let go and re-claimed,
    under the same key."""
    renewal = UnknownOutcome(lands=False, targets=_is_claim_renewal)

    async def scenario() -> None:
        async with leased_part(own_keyspace, store_executor=renewal) as part:
            [reminder], [ring] = await _claimed_and_waiting_to_retry(part, "u-unrenewed", 1)
            claimed = await part.row(reminder)
            part.notifier.down = False  # the retry, after the renewal, is accepted
            async with asyncio.timeout(30):
                assert await ring
            assert renewal.injected == 1
            assert part.notifier.accepted == [dispatch.idempotency_key(claimed)]
            assert part.count("reminders_dispatch_claims_lost_total") == 0
            row = await part.row(reminder)
            assert (row.status, row.claim) == (Status.DONE, None)

    asyncio.run(scenario())


def test_a_claim_of_unknown_outcome_left_unsettled_does_not_hold_its_own_ring_back(
    own_keyspace: CassandraConnection,
) -> None:
    """The claim timed out and the read settling it failed too: the ring, tried again,
    found its own claim standing and waited out the whole claim lease (30 s) before it
    re-claimed it, meanwhile answering its user's delete "may be in flight". The claim is
    now let go by its token, and the ring goes within seconds, under the one key."""
    armed = False
    claim = UnknownOutcome(
        lands=True, targets=lambda statement: armed and is_conditional(statement)
    )

    async def scenario() -> None:
        nonlocal armed
        async with leased_part(own_keyspace, store_executor=claim) as part:
            reminder = await part.due_reminder("u-unsettled", _just_due())
            settle_read = FailsOnce(
                part.store.get_serial,
                ReadTimeout("injected: the read settling the claim"),
                armed=lambda: claim.injected == 1,
            )
            part.store.get_serial = settle_read  # type: ignore[method-assign]
            armed = True
            ring = part.ring(reminder)
            async with asyncio.timeout(12):
                assert await ring
            assert claim.injected == 1
            assert settle_read.failed
            assert len(set(part.notifier.accepted)) == 1  # one key, however often sent
            row = await part.row(reminder)
            assert (row.status, row.claim) == (Status.DONE, None)

    asyncio.run(scenario())


def test_a_ring_cancelled_while_renewing_its_claim_releases_it_after_the_renewal(
    own_keyspace: CassandraConnection,
) -> None:
    """A ring cancelled (its part lost) while its claim's renewal was under way let the
    claim go at once, beside the renewal still running: two LWTs on the partition at
    once, and the renewal landing last left the claim standing a whole lease against the
    part's next owner. The release now waits for the renewal, and lands after it."""
    renewals_sent = 0

    async def renewal_held_up(session: Session, statement: Any, params: Any) -> Any:
        nonlocal renewals_sent
        if _is_claim_renewal(statement):
            renewals_sent += 1
            if renewals_sent == 1:
                # A renewal slow to land (a Paxos round contended), which a cancel of its
                # caller does not stop: the request is with the coordinator.
                async def lands_late() -> Any:
                    await asyncio.sleep(2)
                    return await aio.execute(session, statement, params)

                return await asyncio.shield(asyncio.ensure_future(lands_late()))
        return await aio.execute(session, statement, params)

    async def scenario() -> None:
        async with leased_part(own_keyspace, store_executor=renewal_held_up) as part:
            [reminder], [ring] = await _claimed_and_waiting_to_retry(part, "u-renewing", 1)
            await _until(lambda: renewals_sent == 1, 10)
            ring.cancel()
            await asyncio.gather(ring, return_exceptions=True)
            await asyncio.sleep(3)  # the renewal's time to land, had it been left running
            row = await part.row(reminder)
            assert row.claim is not None
            assert row.claim.expires <= datetime.now(UTC)

    asyncio.run(scenario())


def test_a_ring_retrying_tells_the_notifier_when_it_was_first_handed_off(
    own_keyspace: CassandraConnection,
) -> None:
    """Every attempt carries the first attempt's time, not its own and not the due: the
    notifier waits out a push service asking for retries for its give-up bound from then,
    so a ring handed off long past its due (a catch-up) is not given up at once."""

    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            due = _just_due() - timedelta(minutes=30)  # as a catch-up hands it off
            _, [ring] = await _claimed_and_waiting_to_retry(part, "u-first", 1, due)
            await _until(lambda: part.notifier.refused >= 3, 20)
            part.notifier.down = False
            async with asyncio.timeout(60):
                assert await ring

            [(key, [first_sent])] = [(k, list(v)) for k, v in part.notifier.first_sent.items()]
            assert part.notifier.accepted == [key]
            assert first_sent >= due + timedelta(minutes=29)

    asyncio.run(scenario())


def test_a_part_lost_while_its_ring_waits_lets_the_claim_go_and_loses_no_claim(
    own_keyspace: CassandraConnection,
) -> None:
    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            [reminder], [ring] = await _claimed_and_waiting_to_retry(part, "u-lost", 1)

            part.shift.lease.end()  # as when a renewal is refused

            async with asyncio.timeout(5):
                assert not await ring
            row = await part.row(reminder)
            assert row.claim is not None
            assert row.claim.expires <= part.clock.now() + timedelta(seconds=1)
            assert part.notifier.accepted == []
            assert part.count("reminders_dispatch_claims_lost_total") == 0

    asyncio.run(scenario())


async def _purge(part: Part, session: Session, user: str) -> None:
    """An operator's DeleteUserData: the rows, then the history."""
    await UserPurge(session, HANDOFF_WINDOW).run(user, part.clock.now())
    await DeliveryHistory(session).purge_user(user)


async def _records(session: Session, user: str) -> list[Any]:
    select = "SELECT claim_due FROM deliveries WHERE user_id = %s"
    return list(await aio.execute(session, select, (user,)))


def test_a_purge_from_a_host_whose_clock_runs_behind_removes_a_record_written_just_before(
    own_keyspace: CassandraConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ring recorded as the operator's DeleteUserData comes in: the API host's clock
    running behind the database's must not stamp the purge's delete before the record."""
    session = own_keyspace.session

    async def scenario() -> None:
        clock = DbClock(session, timedelta(seconds=1))
        await clock.measure()
        history = DeliveryHistory(session)
        due = floor_minute(clock.now())
        delivery = Delivery(
            user_id="u-purged-late",
            reminder_id=uuid.uuid4(),
            claim_due=due,
            claim_token=uuid.uuid4(),
            claimed_at=due,
            handed_off_at=clock.now(),
            answer=HistoryAnswer.ACCEPTED,
            reason=None,
            late=False,
        )
        await history.record(delivery, written_at=clock.now())
        _host_clock_ahead(monkeypatch, own_keyspace, -0.9)

        assert await history.purge_user("u-purged-late") == 1
        assert await _records(session, "u-purged-late") == []

    asyncio.run(scenario())


def test_a_ring_retrying_when_its_user_is_purged_leaves_no_delivery_record(
    own_keyspace: CassandraConnection,
) -> None:
    """The purge removes the history after the rows; the record this ring writes when its
    renewal finds the row gone must go too, or it outlives the user's data."""

    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            [_], [ring] = await _claimed_and_waiting_to_retry(part, "u-purged", 1)
            await _purge(part, own_keyspace.session, "u-purged")

            async with asyncio.timeout(60):
                assert await ring
            assert await _records(own_keyspace.session, "u-purged") == []

    asyncio.run(scenario())


def _host_clock_ahead(
    monkeypatch: pytest.MonkeyPatch, connection: CassandraConnection, ahead_s: float
) -> Callable[[], float]:
    """A host whose clock runs `ahead_s` off the database's (behind when negative): the
    timestamps the driver stamps its writes with, and the wall clock it returns."""
    ahead_us = round(ahead_s * 1e6)
    cluster = connection.session.cluster
    monkeypatch.setattr(cluster, "timestamp_generator", lambda: time.time_ns() // 1000 + ahead_us)
    return lambda: time.time() + ahead_s


def _purged_before_the_record(part: Part, session: Session) -> None:
    """The whole purge lands just before the ring's record is written, which is stamped
    after the purge's removal of the history: that removal does not cover it."""
    record = part.history.record

    async def purged_first(
        delivery: Delivery, *, written_at: datetime, keep_earlier: bool = False
    ) -> None:
        await _purge(part, session, delivery.user_id)
        await asyncio.sleep(0.01)  # past the removal's stamp (the database's ms, plus one)
        await record(delivery, written_at=part.clock.now(), keep_earlier=keep_earlier)

    part.history.record = purged_first  # type: ignore[method-assign]


class FailsOnce:
    """An async method whose first call once `armed()` raises `error`; every other call
    goes to `method` as it is."""

    def __init__(
        self,
        method: Callable[..., Awaitable[Any]],
        error: Exception,
        armed: Callable[[], bool] = lambda: True,
    ) -> None:
        self._method = method
        self._error = error
        self._armed = armed
        self.failed = False

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed and self._armed():
            self.failed = True
            raise self._error
        return await self._method(*args, **kwargs)


def _forget_timing_out_once(part: Part) -> None:
    forget = FailsOnce(part.history.forget, OperationTimedOut("injected"))
    part.history.forget = forget  # type: ignore[method-assign]


# 0.9 s: within the clock bound (1 s), so such a dispatcher is ready and rings.
@pytest.mark.parametrize(
    ("host_ahead_s", "forget_times_out"),
    [(0.0, False), (0.9, False), (0.0, True)],
    ids=["clocks-agree", "host-ahead", "removal-timed-out-once"],
)
def test_a_ring_whose_user_is_purged_while_it_is_handed_off_leaves_no_delivery_record(
    own_keyspace: CassandraConnection,
    monkeypatch: pytest.MonkeyPatch,
    host_ahead_s: float,
    forget_times_out: bool,
) -> None:
    """The whole purge lands between the hand-off and the ring's record: the finalize finds
    the row gone, and the record goes, even from a dispatcher whose clock runs ahead (its
    record is stamped with the database's time, which the removal comes after), and when
    the removal meets a timeout (tried again, the ring found no row and removed nothing)."""
    wall = _host_clock_ahead(monkeypatch, own_keyspace, host_ahead_s)

    async def scenario() -> None:
        async with leased_part(own_keyspace, wall=wall) as part:
            _purged_before_the_record(part, own_keyspace.session)
            if forget_times_out:
                _forget_timing_out_once(part)
            reminder = await part.due_reminder("u-purged", _just_due())

            async with asyncio.timeout(20):
                assert await part.ring(reminder)
            assert len(part.notifier.accepted) == 1  # rang: it was with the notifier
            assert await _records(own_keyspace.session, "u-purged") == []

    asyncio.run(scenario())


def test_a_ring_skipped_as_missed_as_its_user_is_purged_leaves_no_delivery_record(
    own_keyspace: CassandraConnection,
) -> None:
    """skip_missed records its "missed" after the row's LWT: a purge in between removed
    the history before the record, which outlived the user's data."""

    async def scenario() -> None:
        async with leased_part(own_keyspace, **SKIP_MISSED_IN_4_S) as part:
            _purged_before_the_record(part, own_keyspace.session)
            reminder = await part.due_reminder("u-purged", _just_due() - timedelta(seconds=5))

            async with asyncio.timeout(20):
                assert await part.ring(reminder)
            assert part.notifier.accepted == []
            assert part.count("reminders_dispatch_skips_total", reason="missed") == 1
            assert await _records(own_keyspace.session, "u-purged") == []

    asyncio.run(scenario())


def test_a_ring_whose_create_no_plain_read_shows_yet_is_not_skipped_for_good(
    own_keyspace: CassandraConnection,
) -> None:
    """A create accepted by Paxos whose commit reached no quorum (its settle read failed
    too) shows on no plain read until something completes it: a skip made final on a
    plain read lost its ring for good. Its entry, old enough that the skip is final at
    once, now rings on the read through Paxos, which completes the create."""

    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            reminder = await part.due_reminder("u-half-made", _just_due() - 2 * MINUTE)
            part.store.unseen_by_plain_reads.add(reminder.reminder_id)

            async with asyncio.timeout(20):
                assert await part.ring(reminder)
            assert len(part.notifier.accepted) == 1
            assert (await part.row(reminder)).status is Status.DONE

    asyncio.run(scenario())


def test_a_ring_whose_record_fails_once_is_handed_off_once_and_recorded_as_answered(
    own_keyspace: CassandraConnection,
) -> None:
    """The history write after the hand-off failed (a storage blip): the ring failed with
    it, its claim was let go, handed off again and recorded as the notifier's "duplicate".
    The record is now tried again; the ring goes once and is recorded as accepted."""

    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            record = FailsOnce(part.history.record, OperationTimedOut("injected"))
            part.history.record = record  # type: ignore[method-assign]
            reminder = await part.due_reminder("u-recorded", _just_due())
            async with asyncio.timeout(20):
                assert await part.ring(reminder)
            assert record.failed
            assert part.notifier.received == 1
            [delivery], _ = await part.history.list_page(
                "u-recorded", reminder.reminder_id, None, 10
            )
            assert delivery.answer is HistoryAnswer.ACCEPTED

    asyncio.run(scenario())


def test_a_notifiers_long_reason_is_kept_cut_short(own_keyspace: CassandraConnection) -> None:
    """A reason is the notifier's prose, kept in the history and listed 500 records a page:
    a notifier writing 100 KB each made that page pass any client's message limit, for
    good (every retry of the listing alike)."""

    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            part.notifier.reason = "x" * 100_000
            reminder = await part.due_reminder("u-wordy", _just_due())
            async with asyncio.timeout(20):
                assert await part.ring(reminder)
            [record], _ = await part.history.list_page("u-wordy", reminder.reminder_id, None, 10)
            assert record.reason == "x" * 200

    asyncio.run(scenario())


def test_letting_a_claim_go_is_seen_through_even_when_cancelled_twice() -> None:
    done: list[str] = []

    async def let_go() -> None:
        await asyncio.sleep(0.2)  # the release LWT's round trip
        done.append("released")

    async def main() -> None:
        ring = asyncio.create_task(to_the_end(let_go()))
        await asyncio.sleep(0.01)
        ring.cancel()  # the minute is cancelled...
        await asyncio.sleep(0.01)
        ring.cancel()  # ...and the shutdown grace runs out
        with pytest.raises(asyncio.CancelledError):
            await ring
        assert done == ["released"]  # the task ended only once the claim was let go

    asyncio.run(main())


def test_a_ring_cancelled_while_its_claim_is_in_flight_lets_the_claim_go(
    own_keyspace: CassandraConnection,
) -> None:
    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            reminder = await part.due_reminder("u-mid-claim", _just_due())
            part.store.claim_reply_delay_s = 2.0
            ring = part.ring(reminder)
            async with asyncio.timeout(5):
                await part.store.claim_landed.wait()

            ring.cancel()  # the part lost, or the shutdown grace over, before the reply

            with pytest.raises(asyncio.CancelledError):
                await ring
            row = await part.row(reminder)
            assert row.status is Status.SENDING
            assert row.claim is not None
            # Released: the next owner re-claims it at once, not after the claim lease.
            assert row.claim.expires <= part.clock.now() + timedelta(seconds=1)
            assert part.notifier.accepted == []

    asyncio.run(scenario())


def test_an_entry_made_due_sooner_is_not_held_up_by_one_waiting_for_a_later_due(
    own_keyspace: CassandraConnection,
) -> None:
    """Edited to ring later, then sooner again, within a minute already read: the first
    entry waits for the later due; the newest entry's sooner due rings at its time, not
    behind that wait."""

    async def scenario() -> None:
        async with leased_part(own_keyspace, lease=timedelta(seconds=60)) as part:
            # All three dues in one minute, as the entries' horizon (its end) assumes: by
            # the part's clock, which the rings wait by and this test reads throughout.
            _with_room_left_in_the_parts_minute(part, 40)
            start = part.clock.now().replace(microsecond=0)
            # Seconds apart, so the edit lands before the first due on a slow machine (at
            # 2 s ahead, a full run once claimed the ring before the edit; 4 s is tight).
            first = await part.due_reminder("u-sooner", start + timedelta(seconds=8))
            first_entry = part.ring(first)
            # `later` 12 s after `sooner`: a hand-off held up until it is told apart from one
            # on time with 4 s to spare for a loaded machine.
            later, sooner = start + timedelta(seconds=26), start + timedelta(seconds=14)
            edited = await edit_due(part, first, later)
            await part.clock.sleep_until(start + timedelta(seconds=10))
            assert not first_entry.done()  # past its due, it waits for `later`
            await edit_due(part, edited, sooner)
            # The entry the second edit wrote: its due, its minute's horizon.
            sooner_entry = part.ring(dataclasses.replace(first, due=sooner))

            await _until(lambda: bool(part.notifier.accepted), timeout_s=20)
            handed_off = part.clock.now()
            assert sooner <= handed_off < sooner + timedelta(seconds=4)
            assert await sooner_entry
            assert await first_entry  # woken at the later due: the row has rung, skipped
            [key] = part.notifier.accepted
            assert key.startswith(f"{first.reminder_id}/{sooner:%Y-%m-%dT%H:%M:%S}")

    asyncio.run(scenario())


async def edit_due(part: Part, reminder: Reminder, due: datetime) -> Reminder:
    """The user's edit of a one-off's time, landed as the API lands it (by LWT), at the
    part's time."""
    stored = await part.store.get_serial(reminder.user_id, reminder.reminder_id)
    assert stored is not None
    now = part.clock.now()
    after = edit_schedule(stored.reminder, stored.reminder.text, one_off_instant(due), due, now)
    assert await part.store.replace(stored, after, now)
    return after


SKIP_MISSED_IN_4_S: dict[str, Any] = {
    "misfire_policy": MisfirePolicy.SKIP_MISSED,
    # Room for a ring just due to be claimed in time on a loaded machine (at 2 s a full
    # run once claimed it past the grace, and skipped it as missed).
    "misfire_grace": timedelta(seconds=4),
}


def test_skip_missed_skips_a_ring_found_missed_and_counts_it_as_a_skip_not_a_ring(
    own_keyspace: CassandraConnection,
) -> None:
    async def scenario() -> None:
        async with leased_part(own_keyspace, **SKIP_MISSED_IN_4_S) as part:
            due = _just_due() - timedelta(seconds=5)
            reminder = await part.due_reminder("u-missed", due)

            assert await part.ring(reminder)

            assert part.notifier.accepted == []
            assert (await part.row(reminder)).status is Status.DONE
            assert part.count("reminders_dispatch_skips_total", reason="missed") == 1
            assert part.count("reminders_dispatch_rings_total", outcome="rejected") == 0

    asyncio.run(scenario())


def test_skip_missed_rings_a_busy_minutes_tail_found_in_time_however_long_it_waits_its_turn(
    own_keyspace: CassandraConnection,
) -> None:
    """One slot and a notifier taking 3 s stand for a minute draining for longer than the
    grace: the second ring, found in time, is claimed past the grace. Judged by when it was
    claimed, it was skipped as missed, though nothing had missed it."""

    async def scenario() -> None:
        async with leased_part(
            own_keyspace,
            max_in_flight=1,
            misfire_policy=MisfirePolicy.SKIP_MISSED,
            misfire_grace=timedelta(seconds=2),
        ) as part:
            part.notifier.answer_after_s = 3.0
            due = (datetime.now(UTC) + timedelta(seconds=2)).replace(microsecond=0)
            reminders = [await part.due_reminder(f"u-busy-{n}", due) for n in range(2)]

            assert await asyncio.gather(*(part.ring(reminder) for reminder in reminders)) == [
                True,
                True,
            ]

            assert len(part.notifier.accepted) == 2
            assert part.count("reminders_dispatch_skips_total", reason="missed") == 0

    asyncio.run(scenario())


def test_a_ring_found_missed_is_never_handed_off_when_the_answer_to_its_skip_is_lost(
    own_keyspace: CassandraConnection,
) -> None:
    """The skip lands but its answer is lost: the ring is tried again and finds the row
    moved on. When the skip was a claim and then a finalize, that retry (or the next owner,
    after a crash between them) found a claim expired, took it over, and handed it off."""

    async def scenario() -> None:
        async with leased_part(
            own_keyspace, claim_lease=timedelta(seconds=1), **SKIP_MISSED_IN_4_S
        ) as part:
            reminder = await part.due_reminder("u-missed-lost", _just_due() - timedelta(seconds=5))
            part.store.replies_lost = 1

            assert await part.ring(reminder)

            assert part.notifier.received == 0
            assert (await part.row(reminder)).status is Status.DONE
            assert part.count("reminders_dispatch_reclaims_total") == 0

    asyncio.run(scenario())


def test_skip_missed_never_drops_a_ring_already_in_flight_when_its_claim_was_let_go(
    own_keyspace: CassandraConnection,
) -> None:
    """Claimed in time, then held up by a notifier outage and let go (a restart, a part
    moved): whoever re-claims it past the grace still hands it off."""

    async def scenario() -> None:
        async with leased_part(own_keyspace, **SKIP_MISSED_IN_4_S) as part:
            # Due ahead, so it is claimed at its due, well within the grace, however long
            # the setup took on this machine.
            due = (datetime.now(UTC) + timedelta(seconds=3)).replace(microsecond=0)
            [reminder], [ring] = await _claimed_and_waiting_to_retry(part, "u-in-flight", 1, due)
            part.shift.lease.end()
            assert not await ring
            assert reminder.due is not None
            await part.clock.sleep_until(reminder.due + timedelta(seconds=5))  # past grace

            part.notifier.down = False
            lease = await part.leases.try_take(1)
            assert lease is not None
            assert await part.ring(reminder, Shift(lease))

            assert len(part.notifier.accepted) == 1
            assert part.count("reminders_dispatch_skips_total", reason="missed") == 0

    asyncio.run(scenario())


def test_a_ring_taken_over_leaves_the_earlier_attempts_delivery_record_as_it_was(
    own_keyspace: CassandraConnection,
) -> None:
    """The first attempt was answered and recorded, but its finalize never landed (it
    timed out, the part moved): the takeover re-sends under the same key and must not
    overwrite when, and whether, the user was notified with its own "duplicate"."""

    async def scenario() -> None:
        async with leased_part(own_keyspace) as part:
            [reminder], [ring] = await _claimed_and_waiting_to_retry(part, "u-history", 1)
            part.shift.lease.end()
            assert not await ring
            claim = (await part.row(reminder)).claim
            assert claim is not None
            history = DeliveryHistory(own_keyspace.session)
            earlier = Delivery(
                user_id=reminder.user_id,
                reminder_id=reminder.reminder_id,
                claim_due=claim.due,
                claim_token=claim.token,
                claimed_at=claim.due,
                handed_off_at=claim.due + timedelta(milliseconds=250),
                answer=HistoryAnswer.ACCEPTED,
                reason=None,
                late=False,
            )
            await history.record(earlier, written_at=part.clock.now())

            part.notifier.down = False
            lease = await part.leases.try_take(1)
            assert lease is not None
            assert await part.ring(reminder, Shift(lease))

            assert len(part.notifier.accepted) == 1
            recorded, _ = await history.list_page(reminder.user_id, reminder.reminder_id, None, 5)
            assert recorded == [earlier]

    asyncio.run(scenario())


def test_a_batch_whose_call_fails_unexpectedly_answers_each_ring_retryable() -> None:
    """A closed channel raises UsageError, not an RPC error: its rings must still be answered
    (retryable, same keys next time), not left waiting for an answer that never comes."""

    async def scenario() -> None:
        client = NotifierClient("127.0.0.1:9")  # never reached: the channel is closed first
        await client.close()
        batcher = HandoffBatcher(client, batch_size=2)
        due = _just_due()
        rings = [
            Ring(f"r{n}:{due.isoformat()}", "u-closed", "text", due, due + timedelta(hours=1), due)
            for n in range(3)
        ]
        async with asyncio.timeout(5):
            answers = await asyncio.gather(*(batcher.send(ring, held_shift()) for ring in rings))
        assert [answer.outcome for answer in answers] == [Outcome.RETRYABLE] * 3
        assert all("UsageError" in answer.reason for answer in answers)

    asyncio.run(scenario())


def _decided(part: Part) -> float:
    """Entries whose row said skip: final, or deferred to the minute's final read (while
    their own write may still be landing: G after they were written)."""
    final = part.count("reminders_dispatch_skips_total", reason="deleted")
    return final + part.count("reminders_dispatch_skips_deferred_total")


async def _entries_without_rows(session: Session, due: datetime, count: int) -> datetime:
    """`count` entries of part 0 due at `due` with no row (a purge, or a create yet to
    land): each is read, then skipped (see `_decided`). Returns their minute."""
    return await _entries_in_part_0(session, due, [("u-busy", uuid.uuid4()) for _ in range(count)])


async def _entries_in_part_0(
    session: Session, due: datetime, reminders: list[tuple[str, uuid.UUID]]
) -> datetime:
    """Entries of part 0 due at `due`, in its minute, for these (user, reminder id)s
    (whatever their own part). Returns their minute."""
    minute = floor_minute(due)
    insert = session.prepare(
        "INSERT INTO due_buckets (minute, part, written_at, reminder_id, user_id, due)"
        " VALUES (?, 0, now(), ?, ?, ?)"
    )
    await asyncio.gather(
        *(aio.execute(session, insert, (minute, key, user, due)) for user, key in reminders)
    )
    return minute


def test_a_busy_minute_keeps_only_the_rings_under_way_as_tasks(
    own_keyspace: CassandraConnection,
) -> None:
    """2,000 entries due at once: they wait as data, and at most 4 x max_in_flight rings
    are under way at a time (a task each used to wait from the read to its due: ~4 KB
    each, a pod's memory at a busy minute's hundreds of thousands)."""
    entries = 2000

    async def scenario() -> None:
        async with leased_part(own_keyspace, max_in_flight=4, lease=_LONG_WORK) as part:
            due = (datetime.now(UTC) + timedelta(seconds=8)).replace(microsecond=0)
            minute = await _entries_without_rows(own_keyspace.session, due, entries)
            worker = await worker_from(part, own_keyspace.session, minute)
            before = len(asyncio.all_tasks())
            most = 0
            working = asyncio.create_task(worker.run())
            async with asyncio.timeout(90):
                while _decided(part) < entries:
                    most = max(most, len(asyncio.all_tasks()) - before)
                    await asyncio.sleep(0.01)
            worker.stop()
            await working

            assert most <= 4 * 4 + 20  # the rings under way, and the worker's own few

    asyncio.run(scenario())


def test_a_busy_minutes_rings_waiting_their_turn_are_not_paced_as_a_backlog(
    own_keyspace: CassandraConnection,
) -> None:
    """Entries of a live minute wait their turn behind each other (room for 4 rings here),
    some well past `late_after` (0 s here); that wait must not make them a backlog, paced
    at the catch-up rate (1/s here: 150 entries would take minutes). Lateness is judged
    when an entry is read."""
    entries = 150

    async def scenario() -> float:
        async with leased_part(
            own_keyspace,
            max_in_flight=1,
            late_after=timedelta(0),
            catch_up_rings_per_s=1.0,
            lease=_LONG_WORK,
        ) as part:
            # The whole scenario in one minute of the part's clock (the worker's): its
            # entries are all written before the worker's first (whole) read.
            _with_room_left_in_the_parts_minute(part, 50)
            # Ahead enough that the entries are written and first read before it on a slow
            # machine: read after their due, they would be paced as a backlog.
            due = (part.clock.now() + timedelta(seconds=10)).replace(microsecond=0)
            minute = await _entries_without_rows(own_keyspace.session, due, entries)
            worker = await worker_from(part, own_keyspace.session, minute)
            working = asyncio.create_task(worker.run())
            await _until(
                lambda: _decided(part) >= entries,
                60,
            )
            all_done_after = (part.clock.now() - due).total_seconds()
            worker.stop()
            await working
            return all_done_after

    # The old pacing: one entry a second once past its due, ~150 s.
    assert asyncio.run(scenario()) < 30


def test_live_minutes_that_fell_behind_drain_as_a_backlog_beside_the_minute_due_now(
    own_keyspace: CassandraConnection,
) -> None:
    """The part's live minutes fall six minutes behind (a stall; a notifier outage that held
    four minutes open does the same), and six more while that backlog still drains. The
    minutes between hold entries read late, paced at 1 a second here: they must drain as
    a backlog beside the minute due now, whose ring rings on time each time, not queue
    behind them (with four of them open, it waited minutes)."""
    per_minute = 30

    async def scenario() -> list[tuple[float, float]]:
        await _with_room_left_in_the_minute(30)
        async with leased_part(own_keyspace, catch_up_rings_per_s=1.0, lease=_LONG_WORK) as part:
            minute = floor_minute(part.clock.now())
            for ahead in (1, 2, 3, 4, 8, 9, 10, 11):
                due = minute + timedelta(minutes=ahead, seconds=30)
                await _entries_without_rows(own_keyspace.session, due, per_minute)
            # Written before the stalls: the stalled clock is the dispatcher's alone, and an
            # entry's write time (the database's) would trail it.
            on_time = []
            for ahead in (6, 12):
                due = minute + timedelta(minutes=ahead, seconds=30)
                reminder = await part.due_reminder("u-on-time", due)
                await _entries_in_part_0(
                    own_keyspace.session, due, [("u-on-time", reminder.reminder_id)]
                )
                on_time.append(reminder)
            worker = await worker_from(part, own_keyspace.session, minute)
            working = asyncio.create_task(worker.run())
            await asyncio.sleep(1)  # the current minute open, live

            rung = []
            for rings, reminder in enumerate(on_time, start=1):
                assert reminder.due is not None
                part.clock.stalled += reminder.due - timedelta(seconds=5) - part.clock.now()
                await _until(lambda: len(part.notifier.accepted) == rings, 60)  # noqa: B023 (awaited here)
                rung.append(((part.clock.now() - reminder.due).total_seconds(), _decided(part)))
            worker.stop()
            await working
            return rung

    (first_lateness_s, first_decided), (second_lateness_s, second_decided) = asyncio.run(scenario())
    assert first_lateness_s < 5
    assert first_decided < 4 * per_minute  # still draining: the ring did not wait for it
    assert second_lateness_s < 5
    assert second_decided < 8 * per_minute


def test_a_part_whose_lease_ran_out_unrenewed_stops_and_counts_it_lost(
    own_keyspace: CassandraConnection,
) -> None:
    """Nothing renews this lease (as when storage answers no renewal in time): past its
    local deadline the part's work stops, and the loss is counted, not silent."""

    async def scenario() -> float:
        async with leased_part(own_keyspace, lease=timedelta(seconds=3)) as part:
            minute = floor_minute(datetime.now(UTC))
            worker = await worker_from(part, own_keyspace.session, minute)
            await asyncio.wait_for(worker.run(), timeout=20)
            return part.count("reminders_dispatch_leases_lost_total")

    assert asyncio.run(scenario()) == 1


def test_a_notifier_back_after_a_long_outage_is_reached_within_seconds() -> None:
    """gRPC's reconnect backoff grows to 2 minutes: rings held back by a notifier outage
    waited up to that long once it was back (80 s after a 200 s outage)."""

    async def scenario() -> tuple[float, int]:
        port = free_port()
        client = NotifierClient(f"127.0.0.1:{port}")
        now = datetime.now(UTC)
        ring = Ring("k/1", "u-back", "ring", now, now + timedelta(minutes=5), now)
        # 15 s: just past the attempt gRPC's own backoff (from 0.5 s, x1.6, jittered) makes
        # at ~13 s, its next ~8 s on; without the cap this waited 4.7 to 9 s (18 runs), where
        # after a 20 s outage an attempt at ~21 s often came within the bound.
        down_until = time.monotonic() + 15
        tries = 0
        while time.monotonic() < down_until:  # the dispatcher's retries meanwhile
            [answer] = (await client.send([ring])).values()
            assert answer.outcome is Outcome.RETRYABLE
            tries += 1
            await asyncio.sleep(0.5)
        notifier = Notifier()  # type: ignore[abstract]  # only SendBatch is served
        server = await serve_notifier(notifier, port)
        back = time.monotonic()
        try:
            while not notifier.accepted:
                await client.send([ring])
                await asyncio.sleep(0.1)
            return time.monotonic() - back, tries
        finally:
            await client.close()
            await server.stop(None)

    reached_after_s, tries = asyncio.run(scenario())
    assert tries > 10
    assert reached_after_s < MAX_RECONNECT_BACKOFF_MS / 1000 * 1.2 + 1
