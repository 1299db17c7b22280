"""The reminders table, the due buckets it feeds, and the create idempotency records.

Rules (DESIGN.md invariants 2 and 4):
- Every write to a `reminders` partition is an LWT, the per-user `active_count` included.
- Bucket first, row second: a write that yields a new due writes that due's bucket entry
  before the row, so a crash between leaves an orphan entry, never an unreachable row.
- An LWT whose outcome is unknown (a timeout) is settled by a SERIAL read: a write with
  its own `op_id` (a create, a user change) landed if the row carries it, did not if the
  row is at or below the version it wrote under another op id, and cannot be told (the
  caller hears "may have been applied") once later user changes replaced it; a
  dispatcher's claim or re-claim, if the row holds its claim token; a finalize, if the
  claim it cleared is gone and no user change came after it; a replan (a row at rest
  moved under new tz rules), if the row holds what it wrote (`_landed`).
- Rows are created with `UPDATE ... IF status = null` (not INSERT), so no row marker
  outlives the cells: a deleted row's cells carry the tombstone TTL and the whole row
  disappears past the retry horizon. The partition's count row (`statics.py`) alone is a
  row marker, written by the user's first create and removed by a purge.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cassandra.cluster import ResultSet, Session
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, PreparedStatement

from reminders_svc.config import Retention
from reminders_svc.domain.errors import UserDataBeingDeleted
from reminders_svc.domain.limits import LIST_SCAN_ROWS, over_the_cap
from reminders_svc.domain.reminder import Claim, Reminder, Status
from reminders_svc.storage import aio
from reminders_svc.storage.errors import WriteNotLanded, WriteOutcomeUnknown
from reminders_svc.storage.parts import PartCounts, bucket_minute, entry_ttl, part_of
from reminders_svc.storage.purge import PURGE_FENCE_FLOOR
from reminders_svc.storage.rows import MUTABLE_COLUMNS, SELECT_COLUMNS, from_row, to_columns
from reminders_svc.storage.session import prepare_serial
from reminders_svc.storage.statics import COUNT_ROW, WRITE_COUNT_ROW, StaticsRead

Executor = Callable[[Session, Any, Any], Awaitable[ResultSet]]

# Rows per query once rows may be skipped: a few round trips cover the scan bound.
_LIST_CHUNK_ROWS = 500


async def _default_executor(session: Session, statement: Any, params: Any) -> ResultSet:
    return await aio.execute(session, statement, params)


@dataclass(frozen=True)
class StoredReminder:
    """A row as read, with its partition's active count (the LWT conditions use both)."""

    reminder: Reminder
    active_count: int | None  # null until the user's first reminder


@dataclass(frozen=True)
class CreateRecord:
    payload_hash: bytes
    reminder_id: uuid.UUID


def _active(reminder: Reminder | None) -> int:
    return 0 if reminder is None or reminder.status is Status.DELETED else 1


def _expiry_compared(old: Reminder, new: Reminder) -> Claim | None:
    """The claim whose expiry as read goes into the LWT's compare, else None.

    - A re-claim (the claim handed to a new token): the expiry was judged passed on that
      read, and any renewal or release since has moved it, so the compare is race-free
      whatever the clocks of the holder and the taker (`claim_expires <= now` would trust
      the taker's clock against the holder's).
    - A user change taking the claim away: its expiry becomes the row's `handoff_until`
      (how long a delete says a ring may be in flight), so a renewal since the read, which
      came with another hand-off attempt, must make this write read the row again.
    """
    if old.claim is None:
        return None
    if new.claim is not None and new.claim.token != old.claim.token:
        return old.claim
    if new.claim is None and new.op_id != old.op_id:
        return old.claim
    return None


def _cell(new: Any, old: Any) -> Any:
    """The value to bind for a column going from `old` to `new`.

    A column null before and after is left unset rather than written null: a null write
    is a tombstone cell, which every read of the user's partition scans until compaction
    drops it (past gc_grace_seconds).
    """
    return UNSET_VALUE if new is None and old is None else new


def _landed(settled: Reminder, before: Reminder | None, written: Reminder) -> bool:
    """Whether `written` (computed from `before`) landed, judged from the row as a SERIAL
    read settled it after an unknown outcome.

    Raises WriteOutcomeUnknown when the row cannot tell: a user change whose op id was
    replaced by later user changes may have landed before them, or not.
    """
    if before is None or written.op_id != before.op_id:
        # A create or a user change: its own op id.
        if settled.op_id == written.op_id:
            return True
        # Each user change moves the version by one. At the version this one wrote, another
        # change won the same compare; below it, none landed. Past it, changes came after
        # one that may have been this one: re-applying it could undo them (a pause made
        # after this resume landed would be resumed again).
        if before is not None and settled.version > written.version:
            raise WriteOutcomeUnknown(
                "a change of unknown outcome was followed by others before it was settled"
            )
        return False
    if written.claim is not None:
        # A claim or re-claim: tokens are never reused, and a user change that left the
        # claim standing (a snooze) does not hide it.
        return settled.claim is not None and settled.claim.token == written.claim.token
    if before.claim is None:
        # A replan: no op id or token of its own, and nobody else writes a row at rest
        # without one; it landed if the row holds what it wrote.
        moved = ("op_id", "version", "status", "occurrence", "due", "claim")
        return all(getattr(settled, name) == getattr(written, name) for name in moved)
    # A finalize: the claim it cleared is gone, and not by a user change (a new op id).
    cleared = before.claim.token
    still = settled.claim.token if settled.claim else None
    return settled.op_id == written.op_id and still != cleared


def _listed(row: Any, status: Status | None) -> bool:
    """Whether a row read by a listing shows in it (filtered by `status` if given)."""
    if row.status is None:
        return False  # the partition's static row, or a row past its tombstone TTL
    return row.status != Status.DELETED and status in (None, row.status)


class ReminderStore:
    def __init__(
        self,
        session: Session,
        retention: Retention,
        *,
        parts: PartCounts | None = None,
        executor: Executor = _default_executor,
        list_scan_rows: int = LIST_SCAN_ROWS,
    ) -> None:
        if list_scan_rows < 1:
            raise ValueError("list_scan_rows must be at least 1")  # else a listing never moves
        self._session = session
        self._list_scan_rows = list_scan_rows
        self._retention = retention
        self._parts = parts or PartCounts(session)
        self._execute = executor
        assignments = ", ".join(f"{column} = ?" for column in MUTABLE_COLUMNS)
        where = "WHERE user_id = ? AND reminder_id = ?"
        prepare = session.prepare
        self._select = prepare(f"SELECT {', '.join(SELECT_COLUMNS)} FROM reminders {where}")
        self._select_serial = prepare_serial(
            session, f"SELECT {', '.join(SELECT_COLUMNS)} FROM reminders {where}"
        )
        self._list = prepare(
            f"SELECT {', '.join(SELECT_COLUMNS)} FROM reminders"
            " WHERE user_id = ? AND reminder_id > ? LIMIT ?"
        )
        self._claim_expiry = prepare(
            f"UPDATE reminders SET claim_expires = ? {where}"
            " IF status = 'sending' AND claim_token = ?"
        )
        self._count_of = StaticsRead(session, "active_count")
        self._count_of_serial = StaticsRead(session, "active_count", serial=True)
        self._count_row = prepare(WRITE_COUNT_ROW)
        self._create = prepare(
            f"UPDATE reminders SET {assignments}, created_at = ? {where} IF status = null"
        )
        self._updates: dict[tuple[tuple[str, ...], bool], PreparedStatement] = {}
        self._count = prepare(
            "UPDATE reminders SET active_count = ? WHERE user_id = ? IF active_count = ?"
        )
        self._bucket = prepare(
            "INSERT INTO due_buckets (minute, part, written_at, reminder_id, user_id, due)"
            " VALUES (?, ?, now(), ?, ?, ?) USING TTL ?"
        )
        self._record_request = prepare(
            "INSERT INTO create_requests (user_id, request_id, payload_hash, reminder_id,"
            " created_at) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS USING TTL ?"
        )
        # The mark rewrites the cells a replay reads (hash, id) with the mark's fresh TTL:
        # a record reduced to its mark would read as a record of nothing. (created_at and
        # the row marker may expire first; nothing reads them.)
        self._mark_replay = prepare(
            "UPDATE create_requests USING TTL ? SET replayed_at = ?, payload_hash = ?,"
            " reminder_id = ? WHERE user_id = ? AND request_id = ? IF reminder_id = ?"
        )
        self._forget_request = prepare(
            "DELETE FROM create_requests WHERE user_id = ? AND request_id = ?"
            " IF reminder_id = ? AND replayed_at = null"
        )

    # -- reads ---------------------------------------------------------------------------

    async def get(self, user_id: str, reminder_id: uuid.UUID) -> StoredReminder | None:
        return await self._get(self._select, user_id, reminder_id)

    async def get_serial(self, user_id: str, reminder_id: uuid.UUID) -> StoredReminder | None:
        """Read through Paxos: completes any LWT in flight, so its outcome is settled."""
        return await self._get(self._select_serial, user_id, reminder_id)

    async def _get(
        self, statement: PreparedStatement, user_id: str, reminder_id: uuid.UUID
    ) -> StoredReminder | None:
        row = (await aio.execute(self._session, statement, (user_id, reminder_id))).one()
        if row is None or row.status is None:
            return None
        return StoredReminder(from_row(row), row.active_count)

    async def active_count(self, user_id: str, *, serial: bool = False) -> int | None:
        """The user's count of active reminders; `serial` reads it through Paxos (after a
        lost compare, so that a lagging replica's count does not lose the next one too)."""
        read = self._count_of_serial if serial else self._count_of
        row = await read(user_id)
        return None if row is None else row.active_count

    async def list_page(
        self, user_id: str, after: uuid.UUID | None, limit: int, status: Status | None
    ) -> tuple[list[Reminder], uuid.UUID | None]:
        """Up to `limit` reminders after `after` (by id), deleted ones never included.

        Returns the page and the id to continue after (None past the partition's last
        row). At most `list_scan_rows` rows are read: when that bound comes first, the page
        is short, possibly empty, and the id is the last row read, so the next call resumes
        the scan there (AIP-158 allows a short page with a token).
        """
        page: list[Reminder] = []
        cursor = after or uuid.UUID(int=0)
        left = self._list_scan_rows
        # An unfiltered listing's first query expects every row to show; with a filter,
        # or once rows were skipped, read in chunks sized for scanning.
        chunk = limit + 1 if status is None else _LIST_CHUNK_ROWS
        while left > 0:
            fetch = min(max(chunk, limit - len(page) + 1), left)
            rows = list(await aio.execute(self._session, self._list, (user_id, cursor, fetch)))
            for row in rows:
                if _listed(row, status):
                    if len(page) == limit:
                        return page, cursor  # one more shows: resume right before it
                    page.append(from_row(row))
                cursor = row.reminder_id
            if len(rows) < fetch:
                return page, None
            left -= fetch
            chunk = _LIST_CHUNK_ROWS
        return page, cursor

    async def create_record(self, user_id: str, request_id: str) -> CreateRecord | None:
        row = (
            await aio.execute(
                self._session,
                "SELECT payload_hash, reminder_id FROM create_requests"
                " WHERE user_id = %s AND request_id = %s",
                (user_id, request_id),
            )
        ).one()
        return None if row is None else CreateRecord(row.payload_hash, row.reminder_id)

    # -- writes --------------------------------------------------------------------------

    async def record_create_request(
        self, user_id: str, request_id: str, record: CreateRecord, now: datetime
    ) -> CreateRecord:
        """Record the request unless one exists; returns the record that stands."""
        ttl = int(self._retention.idempotency.total_seconds())
        params = (user_id, request_id, record.payload_hash, record.reminder_id, now, ttl)
        row = (await self._execute(self._session, self._record_request, params)).one()
        if row.applied:
            return record
        return CreateRecord(row.payload_hash, row.reminder_id)

    async def mark_create_replay(
        self, user_id: str, request_id: str, record: CreateRecord, now: datetime
    ) -> bool:
        """Mark `record` as being completed by a replay, before the replay writes its row;
        False if the record no longer stands (its request was refused and took it back).

        Once marked, the record stays (`forget_create_request` leaves it), so a row the
        replay makes is always found by the next replay.
        """
        ttl = int(self._retention.idempotency.total_seconds())
        marked = record.reminder_id
        params = (ttl, now, record.payload_hash, marked, user_id, request_id, marked)
        row = (await self._execute(self._session, self._mark_replay, params)).one()
        return bool(row.applied)

    async def forget_create_request(
        self, user_id: str, request_id: str, record: CreateRecord
    ) -> None:
        """Remove `record` if it still stands and no replay has marked it: a refused create
        must leave nothing behind (and its request_id reusable), unless a replay of it may
        be making its row."""
        params = (user_id, request_id, record.reminder_id)
        await self._execute(self._session, self._forget_request, params)

    async def write_bucket_entry(self, reminder: Reminder, now: datetime) -> None:
        assert reminder.due is not None
        minute = bucket_minute(reminder.due, now)
        part = part_of(reminder.user_id, await self._parts.parts_at(minute))
        ttl = entry_ttl(reminder.due, now, self._retention.bucket)
        params = (minute, part, reminder.reminder_id, reminder.user_id, reminder.due, ttl)
        await self._execute(self._session, self._bucket, params)

    async def create(self, reminder: Reminder, active_count: int | None, max_active: int) -> bool:
        """Insert a new row and count it, atomically. False if the id exists or the count moved.

        Raises QuotaExceeded when the user is at the cap.
        """
        if (active_count or 0) >= PURGE_FENCE_FLOOR:
            raise UserDataBeingDeleted()
        if (active_count or 0) >= max_active:
            raise over_the_cap(max_active)
        if reminder.due is not None:
            await self.write_bucket_entry(reminder, reminder.created_at)
        values = (_cell(value, None) for value in to_columns(reminder).values())
        batch = self._batch()
        batch.add(self._count, ((active_count or 0) + 1, reminder.user_id, active_count))
        if active_count is None:
            # The user's first reminder (or first since a purge): the partition's count row
            # (statics.py), kept until a purge. Only then: it costs every LWT ~10% more.
            batch.add(self._count_row, (reminder.user_id, COUNT_ROW))
        batch.add(
            self._create,
            (*values, reminder.created_at, reminder.user_id, reminder.reminder_id),
        )
        return await self._lwt(batch, None, reminder)

    async def replace(self, before: StoredReminder, after: Reminder, now: datetime) -> bool:
        """Write `after` if the row's state is still exactly as `before` was read. Bucket first.

        The compare covers version, status, claim token, due, occurrence and snooze: a
        dispatcher's claim-and-finalize in between changes no version but moves the due,
        and a replan (`reminders admin replan`) moves only the occurrence when a snooze
        is the due; a step computed from the older row must not land (a claim from before
        a replan wrote the old rules' occurrence back as the due: a ring an hour off, and
        another that day). A re-claim (a claim handed to a new
        token) also compares the claim's expiry as read: the holder's renewal moves it, so
        a claim renewed after the read that judged it expired is not taken over.
        """
        old = before.reminder
        # A new due needs its entry; so does a row made pending again at its own due (an
        # edit while sending that computes the same next ring): the entry for that due was
        # consumed by the claim, and its minute may be checkpointed already.
        pending_again = after.status is Status.PENDING and old.status is not Status.PENDING
        if after.due is not None and (after.due != old.due or pending_again):
            await self.write_bucket_entry(after, now)
        deleting = _active(after) == 0
        ttl = int(self._retention.tombstone.total_seconds()) if deleting else 0
        new_values = {**to_columns(after), "created_at": after.created_at}
        old_values = {**to_columns(old), "created_at": old.created_at}
        # Only what changed (a claim does not rewrite the text), always with the op id that
        # settles an unknown outcome; a delete rewrites every cell, so all carry its TTL
        # (a column null before and after has no cell: it stays unset, no tombstone).
        columns = (
            (*MUTABLE_COLUMNS, "created_at")
            if deleting
            else tuple(
                column
                for column in MUTABLE_COLUMNS
                if column == "op_id" or new_values[column] != old_values[column]
            )
        )
        compared_claim = _expiry_compared(old, after)
        update = await self._update_of(columns, compare_expiry=compared_claim is not None)
        update_params = (
            ttl,
            *(_cell(new_values[column], old_values[column]) for column in columns),
            old.user_id,
            old.reminder_id,
            old.version,
            old.status.value,
            old.claim.token if old.claim else None,
            old.due,
            old.occurrence,
            old.snooze_until,
            *((compared_claim.expires,) if compared_claim else ()),
        )
        delta = _active(after) - _active(old)
        if delta == 0:
            return await self._lwt(update.bind(update_params), old, after)
        batch = self._batch()
        count = before.active_count
        batch.add(self._count, ((count or 0) + delta, old.user_id, count))
        batch.add(update, update_params)
        return await self._lwt(batch, old, after)

    async def _update_of(
        self, columns: tuple[str, ...], *, compare_expiry: bool
    ) -> PreparedStatement:
        """The compare-and-set writing these columns, prepared once per column set (a few).

        Prepared in a worker thread: `prepare` blocks, and must not block the event loop
        (with `loop_reactor` the driver's I/O runs on it).
        """
        key = (columns, compare_expiry)
        statement = self._updates.get(key)
        if statement is None:
            assignments = ", ".join(f"{column} = ?" for column in columns)
            expiry = " AND claim_expires = ?" if compare_expiry else ""
            statement = await asyncio.to_thread(
                self._session.prepare,
                f"UPDATE reminders USING TTL ? SET {assignments}"
                " WHERE user_id = ? AND reminder_id = ?"
                " IF version = ? AND status = ? AND claim_token = ? AND due = ?"
                f" AND occurrence = ? AND snooze_until = ?{expiry}",
            )
            self._updates[key] = statement
        return statement

    def _batch(self) -> BatchStatement:
        return BatchStatement(batch_type=BatchType.UNLOGGED)

    async def _lwt(self, statement: Any, before: Reminder | None, written: Reminder) -> bool:
        async def settle() -> bool:
            settled = await self.get_serial(written.user_id, written.reminder_id)
            return settled is not None and _landed(settled.reminder, before, written)

        attempt = self._execute(self._session, statement, None)
        return await aio.applied_or_settled(self._session, attempt, settle)

    # -- the dispatcher's claim --------------------------------------------------------

    async def set_claim_expiry(
        self, user_id: str, reminder_id: uuid.UUID, token: uuid.UUID, expires: datetime
    ) -> bool:
        """Renew (or, with a past instant, release) a claim, only while it is still ours:
        False once it is not (a user's change took the row). WriteNotLanded when a write
        of unknown outcome did not land and the claim is still ours, unchanged: the ring
        is not the user's, so its caller must not give it up as if it were.

        Conditioned on the claim alone: a snooze or text edit that bumped the version does
        not take the ring over, so it must not stop the renewal either.
        """

        async def settle() -> bool:
            # An unknown outcome read through Paxos (invariant 4): a renewal that landed
            # after a release would hold the ring back for a whole lease. Timestamps are
            # kept to the millisecond.
            settled = await self.get_serial(user_id, reminder_id)
            claim = settled.reminder.claim if settled is not None else None
            if claim is None or claim.token != token:
                return False
            if abs(claim.expires - expires) < timedelta(milliseconds=1):
                return True
            raise WriteNotLanded("a claim's new expiry did not land; the claim stands as it was")

        params = (expires, user_id, reminder_id, token)
        attempt = self._execute(self._session, self._claim_expiry, params)
        return await aio.applied_or_settled(self._session, attempt, settle)
