"""Idempotency keys: recorded with an LWT before anything is pushed, settled after.

A key's row names the attempt delivering it (accept_id) and, once that delivery ended,
how it ended (settled_as). Every attempt at a key is judged by the row alone, so any
replica answers alike:
- no row: this attempt records it and delivers;
- settled: delivered (or given up on) before: answered from the settlement;
- unsettled, held by this attempt (a re-sent insert of its own that landed): deliver;
- unsettled, held by another attempt for less than `takeover_after`: that attempt may
  still deliver it: "retry later";
- unsettled for longer: its holder died or never heard its write land (a crash, a
  timeout on both the write and the read that settles it): this attempt takes the key
  over with an LWT on the old holder's accept_id and accepted_at, and delivers. A holder
  that was only slow pushes too: the key is the push's collapse id, so the device shows
  one alert.

How long a key has been held is told by the database's clock, which wrote accepted_at,
never by this host's: a replica whose clock ran ahead by more than the bound would take
over every live holder's key, one behind would wait for ever on a dead holder's. A holder
whose item waits long to be pushed refreshes accepted_at first (`refresh`), so no other
attempt takes the key over from a live holder that has yet to push it.

An LWT that times out (unknown outcome) is settled by a SERIAL read (DESIGN.md invariant
4: never re-apply blindly). When even that read fails, the caller is answered "retry"
and the attempt's accept_id is kept here, so this replica's retry of the key claims the
row at once if the write did land (elsewhere it waits out `takeover_after`).
"""

from __future__ import annotations

import contextlib
import enum
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from notifier.domain.model import Notification, Settlement
from reminders_svc.storage.aio import execute, or_settled
from reminders_svc.storage.errors import STORAGE_ERRORS
from reminders_svc.storage.rows import utc
from reminders_svc.storage.session import prepare_serial


class KeyState(enum.Enum):
    # This attempt holds the key: deliver it, then settle it.
    RECORDED = "recorded"
    # Delivered, or given up on, by an earlier attempt: `KeyClaim.settled_as` says how.
    SETTLED = "settled"
    # Another attempt holds it and may still deliver it: answer "retry later".
    HELD_ELSEWHERE = "held_elsewhere"
    # Recorded for another user: a sender's bug (a key names one alert of one user),
    # refused rather than answered as that user's duplicate with nothing pushed.
    OTHER_USER = "other_user"


@dataclass(frozen=True)
class KeyClaim:
    state: KeyState
    # The attempt holding the key (this one's when RECORDED; None for a settled key
    # whose holder's cells are gone, see _KeyRow).
    accept_id: uuid.UUID | None
    settled_as: Settlement | None = None
    taken_over: bool = False
    # RECORDED by this call's own write (an insert or a takeover that applied): the hold
    # is no older than the call. False for a hold found written (an earlier attempt's
    # write that landed unheard, or an unknown outcome settled by a read): its age is not
    # known here.
    fresh: bool = False


@dataclass(frozen=True)
class KeyHold:
    """This process's hold on a key it delivers: its attempt's id, and the time.monotonic()
    at or before which the row's accepted_at was last written (None: not known)."""

    accept_id: uuid.UUID
    since: float | None


@dataclass(frozen=True)
class _KeyRow:
    """A key's row as found. Its holder may be missing (None) while the row stands: a
    holder's plain settle written after a later holder's release cleared it (the first,
    slow push did happen: the row reads settled), a release with no settle after it (the
    key is free), or settle cells outliving the insert's by their later TTL."""

    accept_id: uuid.UUID | None
    accepted_at: datetime | None
    settled_as: Settlement | None
    # The database's time when the row was read (None: it came with an LWT's answer).
    read_at: datetime | None = None
    # None with the holder's other cells gone (see above).
    user_id: str | None = None

    @classmethod
    def of(cls, row: Any) -> _KeyRow:
        settled_as = Settlement(row.settled_as) if row.settled_as else None
        read_at = getattr(row, "read_at", None)
        return cls(row.accept_id, utc(row.accepted_at), settled_as, utc(read_at), row.user_id)

    def of_other_user(self, user_id: str) -> bool:
        return self.user_id is not None and self.user_id != user_id

    def abandoned(self, bound: timedelta) -> bool:
        """Unclaimed, or held for `bound` or longer by the database's clock (a row read
        without that clock's time cannot tell: not abandoned)."""
        if self.accept_id is None or self.accepted_at is None:
            return True
        return self.read_at is not None and self.read_at - self.accepted_at >= bound


# Keys whose last write may have landed unseen, kept at most this many (oldest dropped):
# a month of TTL'd rows is not something to mirror in memory.
MAX_UNSETTLED_KEYS = 100_000


@dataclass(frozen=True)
class _Ended:
    """A key's settlement that writing failed, and whose key it is."""

    user_id: str
    settled_as: Settlement


class KeyNotRecorded(RuntimeError):
    """The key's write timed out and a SERIAL read found it did not land: retry later."""


class KeyStore:
    def __init__(
        self,
        session: Session,
        keyspace: str,
        ttl: timedelta,
        takeover_after: timedelta,
    ) -> None:
        self._session = session
        self._ttl_s = int(ttl.total_seconds())
        self._takeover_after = takeover_after
        # A hold this old is refreshed before its push: half the bound is left for the
        # push itself (its retries take ~15 s) before another attempt may take the key.
        self._refresh_after_s = takeover_after.total_seconds() / 2
        table = f"{keyspace}.notification_keys"
        self._insert = session.prepare(
            f"INSERT INTO {table} (idempotency_key, user_id, accept_id, accepted_at)"
            " VALUES (?, ?, ?, toTimestamp(now())) IF NOT EXISTS USING TTL ?"
        )
        # On the holder's accepted_at as judged too: a hold refreshed since that read is
        # live, and is not taken.
        self._take_over = session.prepare(
            f"UPDATE {table} USING TTL ? SET accept_id = ?, accepted_at = toTimestamp(now())"
            " WHERE idempotency_key = ? IF accept_id = ? AND accepted_at = ? AND settled_at = null"
        )
        self._refresh = session.prepare(
            f"UPDATE {table} USING TTL ? SET accepted_at = toTimestamp(now())"
            " WHERE idempotency_key = ? IF accept_id = ? AND settled_at = null"
        )
        # A plain write: only the holder writes these columns, and a late one racing a
        # takeover costs at most a second push under the same collapse id.
        self._settle = session.prepare(
            f"UPDATE {table} USING TTL ? SET settled_at = toTimestamp(now()), settled_as = ?"
            " WHERE idempotency_key = ?"
        )
        # The holder's cells cleared, not the row deleted: a row tombstone, stamped by
        # Paxos, would hide the next holder's settle (a plain write stamped by its host's
        # clock) whenever that clock runs behind by more than the time between the two,
        # and the key, pushed and settled, would read held and be pushed again. The row
        # left without a holder is taken at once by the next attempt (`_judge`).
        self._release = session.prepare(
            f"UPDATE {table} SET accept_id = null, accepted_at = null"
            " WHERE idempotency_key = ? IF accept_id = ?"
        )
        # With the database's time, by which a holder's accepted_at was written. A SERIAL
        # read finishes any in-flight Paxos round, so what it finds is final.
        self._read: PreparedStatement = prepare_serial(
            session,
            f"SELECT accept_id, accepted_at, settled_as, user_id, toTimestamp(now()) AS read_at"
            f" FROM {table} WHERE idempotency_key = ?",
        )
        # key -> the accept_ids of its attempts that failed here: a write that may have
        # landed unseen carries one of them.
        self._unsettled: OrderedDict[str, frozenset[uuid.UUID]] = OrderedDict()
        # key -> how its delivery here ended, when writing that failed: a retry reaching
        # this replica is answered from it (and the write tried again), not told "another
        # attempt is delivering" and then, once the hold is stale, pushed a second time.
        self._settled_unwritten: OrderedDict[str, _Ended] = OrderedDict()

    async def record(
        self, notification: Notification, accept_id: uuid.UUID | None = None
    ) -> KeyClaim:
        """Record the key, or take it over from a stale holder, or say who has it. Raises
        a driver error (or KeyNotRecorded) when storage cannot say.

        `accept_id` names this attempt (by default that of the key's last attempt that
        failed here, else a fresh one): a row holding it, or the id of any attempt at the
        key that failed here, is this caller's own (written by a send whose reply was
        lost), not another's.
        """
        key = notification.idempotency_key
        if (ended := self._remembered(key, notification.user_id)) is not None:
            if ended.state is KeyState.SETTLED:
                assert ended.settled_as is not None
                with contextlib.suppress(*STORAGE_ERRORS):  # still unwritten: from memory
                    await self.settle(key, notification.user_id, ended.settled_as)
            return ended
        # Taken, not shared: of concurrent attempts at a key only one may claim its row.
        earlier = self._unsettled.pop(key, frozenset())
        accept_id = accept_id or next(iter(earlier), None) or uuid.uuid4()
        ours = earlier | {accept_id}
        try:
            return await self._record(notification, accept_id, ours)
        except BaseException:
            # Failed or cancelled: the write may still have landed with one of these.
            self._unsettled[key] = self._unsettled.get(key, frozenset()) | ours
            if len(self._unsettled) > MAX_UNSETTLED_KEYS:
                self._unsettled.popitem(last=False)
            raise

    async def settle(self, key: str, user_id: str, settlement: Settlement) -> None:
        """Mark `user_id`'s delivery of the key ended: later attempts are answered from
        `settlement` (from memory, on this replica, while writing it fails)."""
        try:
            await self._write_settlement(key, settlement)
        except BaseException:
            self._settled_unwritten[key] = _Ended(user_id, settlement)
            if len(self._settled_unwritten) > MAX_UNSETTLED_KEYS:
                self._settled_unwritten.popitem(last=False)
            raise
        self._settled_unwritten.pop(key, None)

    async def _write_settlement(self, key: str, settlement: Settlement) -> None:
        await execute(self._session, self._settle, (self._ttl_s, settlement.value, key))

    async def release(self, key: str, accept_id: uuid.UUID) -> None:
        """Give the key up undelivered (shutting down), so a retry elsewhere takes it at
        once instead of waiting out `takeover_after`."""
        await execute(self._session, self._release, (key, accept_id))

    def refresh_due(self, hold: KeyHold) -> bool:
        """Whether `hold` is old enough (or of unknown age) to be refreshed before a push."""
        return hold.since is None or time.monotonic() - hold.since >= self._refresh_after_s

    async def refresh(self, key: str, hold: KeyHold) -> KeyHold | None:
        """Renew `hold` (accepted_at from now), so that no other attempt takes the key over
        while this one still has to push it; None when the key is no longer this attempt's
        (taken over, and perhaps settled, by another). Raises a driver error when storage
        does not answer: the refresh is safe to send again (it applies only to its own
        hold, and moves nothing but the time)."""
        since = time.monotonic()
        params = (self._ttl_s, key, hold.accept_id)
        applied = (await execute(self._session, self._refresh, params)).one().applied
        return KeyHold(hold.accept_id, since) if applied else None

    async def look(self, key: str, user_id: str) -> KeyClaim | None:
        """The key as `user_id`'s attempt would find it, writing nothing: SETTLED,
        HELD_ELSEWHERE (a live holder may still push it), OTHER_USER, or None (never
        recorded, released, or held past the takeover bound)."""
        if (ended := self._remembered(key, user_id)) is not None:
            return ended
        row = (await execute(self._session, self._read, (key,))).one()
        if row is None:
            return None
        found = _KeyRow.of(row)
        if found.of_other_user(user_id):
            return KeyClaim(KeyState.OTHER_USER, found.accept_id)
        return self._judge(found, frozenset())

    def _remembered(self, key: str, user_id: str) -> KeyClaim | None:
        """The key's settlement that writing failed, as `user_id`'s attempt finds it."""
        ended = self._settled_unwritten.get(key)
        if ended is None:
            return None
        if ended.user_id != user_id:
            return KeyClaim(KeyState.OTHER_USER, None)
        return KeyClaim(KeyState.SETTLED, None, ended.settled_as)

    async def _record(
        self, notification: Notification, accept_id: uuid.UUID, ours: frozenset[uuid.UUID]
    ) -> KeyClaim:
        try:
            return await self._record_once(notification, accept_id, ours)
        except KeyNotRecorded:
            # A row refused our write and was gone when read: its holder released it (a
            # notifier stopping) in between. Recorded afresh, not answered "unavailable".
            return await self._record_once(notification, accept_id, ours)

    async def _record_once(
        self, notification: Notification, accept_id: uuid.UUID, ours: frozenset[uuid.UUID]
    ) -> KeyClaim:
        key = notification.idempotency_key
        insert = (key, notification.user_id, accept_id, self._ttl_s)
        found = await self._lwt(self._insert, insert, key)
        if found is None:
            return KeyClaim(KeyState.RECORDED, accept_id, fresh=True)
        if found.of_other_user(notification.user_id):
            return KeyClaim(KeyState.OTHER_USER, found.accept_id)
        claim = self._judge(found, ours)
        if claim is not None and claim.state is KeyState.HELD_ELSEWHERE:
            # Read again with the database's time: the holder's age is judged by it.
            found = await self._read_row(key)
            claim = self._judge(found, ours)
        if claim is not None:
            return claim
        # Held too long by another attempt, unsettled, or released: take it from that hold
        # (a released row's holder is null; taking that is no takeover of a live one's).
        take_over = (self._ttl_s, accept_id, key, found.accept_id, found.accepted_at)
        taken_over = found.accept_id is not None
        now_found = await self._lwt(self._take_over, take_over, key)
        if now_found is None:
            return KeyClaim(KeyState.RECORDED, accept_id, taken_over=taken_over, fresh=True)
        claim = self._judge(now_found, ours)
        if claim is not None and claim.state is KeyState.RECORDED:
            return KeyClaim(KeyState.RECORDED, accept_id, taken_over=taken_over)
        # Settled, refreshed by its holder, or taken over by another attempt just now.
        return claim or KeyClaim(KeyState.HELD_ELSEWHERE, now_found.accept_id)

    async def _lwt(
        self, statement: PreparedStatement, params: tuple[Any, ...], key: str
    ) -> _KeyRow | None:
        """None when the LWT applied; else the key's row. A refused INSERT answers with the
        row there; a refused UPDATE only with the columns it compared, so the row is read;
        an unknown outcome is settled by that same SERIAL read."""

        async def answered() -> _KeyRow | None:
            result = (await execute(self._session, statement, params)).one()
            if result.applied:
                return None
            if hasattr(result, "settled_as"):
                return _KeyRow.of(result)
            return await self._read_row(key)

        return await or_settled(self._session, answered(), lambda: self._read_row(key))

    async def _read_row(self, key: str) -> _KeyRow:
        row = (await execute(self._session, self._read, (key,))).one()
        if row is None:
            raise KeyNotRecorded(f"the key write did not land: {key!r}")
        return _KeyRow.of(row)

    def _judge(self, found: _KeyRow, ours: frozenset[uuid.UUID]) -> KeyClaim | None:
        """What the row means for this attempt; None: nobody holds it, or another attempt
        has held it unsettled past the bound: take it."""
        if found.settled_as is not None:
            return KeyClaim(KeyState.SETTLED, found.accept_id, found.settled_as)
        if found.accept_id in ours:
            return KeyClaim(KeyState.RECORDED, found.accept_id)
        if found.abandoned(self._takeover_after):
            return None
        return KeyClaim(KeyState.HELD_ELSEWHERE, found.accept_id)
