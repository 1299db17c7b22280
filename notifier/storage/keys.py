"""Idempotency keys: recorded with an LWT before anything is pushed.

A key's row says "this alert was accepted". When the LWT times out (unknown outcome), a
SERIAL read settles it: the row's accept_id tells whether the write that landed was this
attempt's (DESIGN.md invariant 4: never re-apply blindly). When even that read fails
(storage gone), the caller is answered "retry" and the attempt's accept_id is kept, so
the caller's retry of that key claims the row if the write did land.
"""

from __future__ import annotations

import enum
import uuid
from collections import OrderedDict
from datetime import timedelta

from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from notifier.domain.model import Notification
from reminders_svc.storage.aio import execute, outcome_unknown


class KeyRecord(enum.Enum):
    # This attempt wrote the key: push it.
    RECORDED = "recorded"
    # Another attempt wrote it before: do not push again.
    ALREADY_RECORDED = "already_recorded"


# Keys whose last write may have landed unseen, kept at most this many (oldest dropped):
# a month of TTL'd rows is not something to mirror in memory.
MAX_UNSETTLED_KEYS = 100_000


class KeyNotRecorded(RuntimeError):
    """The key's write timed out and a SERIAL read found it did not land: retry later."""


class KeyStore:
    def __init__(self, session: Session, keyspace: str, ttl: timedelta) -> None:
        self._session = session
        self._ttl_s = int(ttl.total_seconds())
        self._insert = session.prepare(
            f"INSERT INTO {keyspace}.notification_keys"
            " (idempotency_key, user_id, accept_id, accepted_at)"
            " VALUES (?, ?, ?, toTimestamp(now())) IF NOT EXISTS USING TTL ?"
        )
        self._settle: PreparedStatement = session.prepare(
            f"SELECT accept_id FROM {keyspace}.notification_keys WHERE idempotency_key = ?"
        )
        self._settle.consistency_level = ConsistencyLevel.SERIAL
        # key -> the accept_ids of its attempts that failed here: a write that may have
        # landed unseen carries one of them.
        self._unsettled: OrderedDict[str, frozenset[uuid.UUID]] = OrderedDict()

    async def record(
        self, notification: Notification, accept_id: uuid.UUID | None = None
    ) -> KeyRecord:
        """Record the key if new. Raises a driver error when storage cannot say.

        `accept_id` names this attempt (by default that of the key's last attempt that
        failed here, else a fresh one): a row holding it, or the id of any attempt at the
        key that failed here, is this caller's own (written by a send whose reply was
        lost), not another's.
        """
        key = notification.idempotency_key
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

    async def _record(
        self, notification: Notification, accept_id: uuid.UUID, ours: frozenset[uuid.UUID]
    ) -> KeyRecord:
        params = (notification.idempotency_key, notification.user_id, accept_id, self._ttl_s)
        try:
            row = (await execute(self._session, self._insert, params)).one()
        except Exception as error:
            if not outcome_unknown(error):
                raise
            return await self._settled(notification.idempotency_key, ours)
        # A refused insert answers with the row that is there: ours if a re-send of this
        # very insert (or an earlier attempt's) landed.
        if row.applied or row.accept_id in ours:
            return KeyRecord.RECORDED
        return KeyRecord.ALREADY_RECORDED

    async def _settled(self, key: str, ours: frozenset[uuid.UUID]) -> KeyRecord:
        # A SERIAL read finishes any in-flight Paxos round, so "no row" is final.
        row = (await execute(self._session, self._settle, (key,))).one()
        if row is None:
            raise KeyNotRecorded(f"the key write timed out and did not land: {key!r}")
        return KeyRecord.RECORDED if row.accept_id in ours else KeyRecord.ALREADY_RECORDED
