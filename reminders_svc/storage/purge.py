"""An operator's purge of one user's reminders (DeleteUserData), fenced against creates.

The fence is the user's static `active_count`, set to `PURGE_FENCE` by LWT together with
`purge_id` (this purge) and `purge_at` (the database's time):
- every create under way loses its compare on the count it read, and a create that reads
  the fence is refused (`ReminderStore.create`), so no row slips in behind the listing;
  the fence's Paxos round completes any create accepted before it, so the listing sees
  its row;
- a user's delete meanwhile counts down from the fence (any count at or above
  `PURGE_FENCE_FLOOR` is one);
- only the fence's owner deletes rows (each delete compares `purge_id`) and lifts it
  (`IF purge_id`, removing the partition's count row with it, `statics.py`): a second
  purge of the user, say a caller's retry on another replica, is answered UNAVAILABLE
  while the first runs, and one that ran on after being taken over deletes nothing
  more, so no create made after the fence was lifted is purged;
- the owner refreshes `purge_at` as it goes; a fence left unrefreshed for
  `STALE_AFTER` (by the database's clock) belongs to a purge that died, and the next
  purge takes it over: a user is left fenced until a purge finishes, never for good;
- the create records are deleted `USING TIMESTAMP` of the database's time read just
  before a refresh that found the fence still held: a purge that stalled there and was
  taken over meanwhile cannot delete the record of a create made after the takeover's
  lift (at least `STALE_AFTER` later), which a replay would otherwise make twice;
- storage trouble does not end a purge at once: every LWT of unknown outcome is settled
  by a SERIAL read (invariant 4), and the run starts over under the same fence a few
  times, with backoff (rows gone are skipped), before it gives up.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType

from reminders_svc.concurrency import backoff_s
from reminders_svc.domain.errors import Unavailable
from reminders_svc.domain.reminder import may_be_in_flight
from reminders_svc.storage import aio
from reminders_svc.storage.errors import STORAGE_ERRORS, WriteOutcomeUnknown
from reminders_svc.storage.history import write_timestamp
from reminders_svc.storage.rows import utc
from reminders_svc.storage.session import prepare_serial
from reminders_svc.storage.statics import COUNT_ROW, StaticsRead

# The column is a 32-bit int; no cap comes near either.
PURGE_FENCE = 2_000_000_000
PURGE_FENCE_FLOOR = 1_000_000_000
STALE_AFTER = timedelta(minutes=2)
_REFRESH_EVERY_ROWS = 100
# A row's delete compares its status and claim as listed: a dispatcher's claim or finalize
# landing in between makes it read the row again, a few times at most.
_ATTEMPTS = 5
# Runs under one fence when storage fails mid-purge, and the first backoff between them
# (doubling): about a minute in all, inside the fence's STALE_AFTER.
_RUNS = 5
_FIRST_BACKOFF_S = 2.0


@dataclass(frozen=True)
class PurgedUser:
    reminders: int  # rows removed, tombstones of deleted reminders included
    requests: int  # create records removed
    # Rows whose ring was with the notifier (sending, or a claim cleared by a user's
    # change that may still be handing off): those rings may still reach the devices.
    rings_in_flight: int


@dataclass
class _Tally:
    """What the runs of one purge removed, added up across its runs."""

    reminders: int = 0
    requests: int = 0
    rings_in_flight: int = 0


@dataclass(frozen=True)
class _FenceState:
    count: int | None
    purge_id: uuid.UUID | None
    stale: bool


PURGE_UNDER_WAY = "PURGE_UNDER_WAY"


def _under_way() -> Unavailable:
    # A purge takes seconds for a typical user, minutes for one at the cap.
    return Unavailable(
        "another deletion of this user's data is under way; retry",
        reason=PURGE_UNDER_WAY,
        retry_after=timedelta(seconds=5),
    )


class UserPurge:
    def __init__(self, session: Session, still_pushed_for: timedelta) -> None:
        """`still_pushed_for`: how long after a cleared claim's expiry its ring may still
        be pushed (the API's setting of that name)."""
        self._session = session
        self._still_pushed_for = still_pushed_for
        prepare = session.prepare
        self._fence_state = StaticsRead(
            session, "active_count, purge_id, purge_at, toTimestamp(now()) AS read_at", serial=True
        )
        self._fence = prepare(
            "UPDATE reminders SET active_count = ?, purge_id = ?, purge_at = toTimestamp(now())"
            " WHERE user_id = ? IF active_count = ?"
        )
        self._take_over = prepare(
            "UPDATE reminders SET purge_id = ?, purge_at = toTimestamp(now())"
            " WHERE user_id = ? IF purge_id = ?"
        )
        self._refresh = prepare(
            "UPDATE reminders SET purge_at = toTimestamp(now()) WHERE user_id = ? IF purge_id = ?"
        )
        self._delete_as_read = prepare(
            "DELETE FROM reminders WHERE user_id = ? AND reminder_id = ?"
            " IF status = ? AND claim_token = ? AND purge_id = ?"
        )
        self._row = prepare_serial(
            session,
            "SELECT status, claim_token, handoff_until FROM reminders"
            " WHERE user_id = ? AND reminder_id = ?",
        )
        self._lift_fence_cells = prepare(
            "DELETE active_count, purge_id, purge_at FROM reminders WHERE user_id = ?"
            " IF purge_id = ?"
        )
        self._delete_count_row = prepare(
            "DELETE FROM reminders WHERE user_id = ? AND reminder_id = ?"
        )

    async def run(self, user_id: str, now: datetime) -> PurgedUser:
        """Remove every row of a user (each by LWT), then their create records.

        Safe to run again after a failure or a timeout: a fence of a purge that died is
        taken over, rows gone are skipped. Bucket entries are left to expire: they then
        point at nothing and dispatchers skip them.
        """
        purge_id = uuid.uuid4()
        tally = _Tally()
        for run in range(_RUNS - 1):
            try:
                return await self._run_once(user_id, purge_id, now, tally)
            except STORAGE_ERRORS:
                await asyncio.sleep(backoff_s(_FIRST_BACKOFF_S, run + 1))
        return await self._run_once(user_id, purge_id, now, tally)  # its failure is final

    async def _run_once(
        self, user_id: str, purge_id: uuid.UUID, now: datetime, tally: _Tally
    ) -> PurgedUser:
        await self._hold_fence(user_id, purge_id)
        listing = (
            "SELECT reminder_id, status, claim_token, handoff_until FROM reminders"
            " WHERE user_id = %s"
        )
        async for rows in aio.pages(self._session, listing, (user_id,)):
            for row in rows:
                if row.reminder_id in (None, COUNT_ROW):  # static cells, the count row: lifted
                    continue
                purged = await self._purge_row(user_id, purge_id, row, now)
                if purged is not None:
                    tally.reminders += 1
                    tally.rings_in_flight += purged
                    if tally.reminders % _REFRESH_EVERY_ROWS == 0:
                        await self._refresh_fence(user_id, purge_id)
        requests = await aio.count_all(
            self._session, "SELECT request_id FROM create_requests WHERE user_id = %s", (user_id,)
        )
        # Stamped no later than this purge last held its fence (see the module's doc).
        held_at = await aio.database_now(self._session)
        await self._refresh_fence(user_id, purge_id)
        await aio.execute(
            self._session,
            "DELETE FROM create_requests USING TIMESTAMP %s WHERE user_id = %s",
            (write_timestamp(held_at), user_id),
        )
        tally.requests += requests
        await self._lift_fence(user_id, purge_id)
        return PurgedUser(tally.reminders, tally.requests, tally.rings_in_flight)

    async def _hold_fence(self, user_id: str, purge_id: uuid.UUID) -> None:
        """Fence the user for this purge, or take over the fence of a purge that died."""
        for _ in range(_ATTEMPTS):
            state = await self._state(user_id)
            if state.purge_id == purge_id:
                # This purge's own, held since an earlier run storage cut short: refreshed
                # before going on, so the backoff's wait does not bring it nearer to being
                # taken over mid-run.
                await self._refresh_fence(user_id, purge_id)
                return
            if state.count is None or state.count < PURGE_FENCE_FLOOR:
                params: tuple[object, ...] = (PURGE_FENCE, purge_id, user_id, state.count)
                attempt = aio.execute(self._session, self._fence, params)
            elif state.stale:
                params = (purge_id, user_id, state.purge_id)
                attempt = aio.execute(self._session, self._take_over, params)
            else:
                raise _under_way()
            if await aio.applied_or_settled(
                self._session, attempt, lambda: self._holds(user_id, purge_id)
            ):
                return
        raise Unavailable.contention("this user's reminders")

    async def _state(self, user_id: str) -> _FenceState:
        row = await self._fence_state(user_id)
        if row is None:  # no partition at all: nothing stored for the user yet
            return _FenceState(None, None, stale=False)
        # Unrefreshed for STALE_AFTER by the database's clock, or without its owner's time
        # (torn): the purge that set it died.
        stale = row.purge_at is None or row.read_at - row.purge_at > STALE_AFTER
        return _FenceState(row.active_count, row.purge_id, stale)

    async def _holds(self, user_id: str, purge_id: uuid.UUID) -> bool:
        """Whether the fence is `purge_id`'s (read through Paxos)."""
        return (await self._state(user_id)).purge_id == purge_id

    async def _refresh_fence(self, user_id: str, purge_id: uuid.UUID) -> None:
        attempt = aio.execute(self._session, self._refresh, (user_id, purge_id))
        if not await aio.applied_or_settled(
            self._session, attempt, lambda: self._holds(user_id, purge_id)
        ):
            raise _under_way()  # taken over: that purge finishes the work

    async def _lift_fence(self, user_id: str, purge_id: uuid.UUID) -> None:
        async def lifted() -> bool:
            if await self._holds(user_id, purge_id):
                # It did not land (the read fixed that): the run starts over and lifts.
                raise WriteOutcomeUnknown("a purge's lift of its fence did not land")
            return True  # lifted, or taken over after it (nothing of this purge's left)

        # The count row goes with the fence, in one LWT: nothing of the user's is left.
        lift = BatchStatement(batch_type=BatchType.UNLOGGED)
        lift.add(self._lift_fence_cells, (user_id, purge_id))
        lift.add(self._delete_count_row, (user_id, COUNT_ROW))
        attempt = aio.execute(self._session, lift, None)
        if not await aio.applied_or_settled(self._session, attempt, lifted):
            raise _under_way()  # taken over: that purge finishes the work

    async def _purge_row(
        self, user_id: str, purge_id: uuid.UUID, listed: Any, now: datetime
    ) -> bool | None:
        """Delete one row if it is still as last read; whether its ring was in flight, or
        None if it was gone already."""
        row = listed
        key = (user_id, listed.reminder_id)
        for _ in range(_ATTEMPTS):
            if row is None or row.status is None:
                return None
            in_flight = may_be_in_flight(
                row.claim_token is not None, utc(row.handoff_until), now, self._still_pushed_for
            )
            as_read = (*key, row.status, row.claim_token, purge_id)
            if await aio.or_settled(
                self._session,
                self._delete_row(as_read, purge_id),
                lambda: self._gone(key),
            ):
                return in_flight
            # A claim or finalize landed since: read the row again (through Paxos).
            row = (await aio.execute(self._session, self._row, key)).one()
        raise Unavailable.contention("this user's reminders")

    async def _delete_row(self, as_read: tuple[object, ...], purge_id: uuid.UUID) -> bool:
        deleted = (await aio.execute(self._session, self._delete_as_read, as_read)).one()
        if not deleted.applied and deleted.purge_id != purge_id:
            raise _under_way()
        return bool(deleted.applied)

    async def _gone(self, key: tuple[object, ...]) -> bool:
        """Whether a row whose delete's outcome is unknown is gone (read through Paxos)."""
        row = (await aio.execute(self._session, self._row, key)).one()
        return row is None or row.status is None
