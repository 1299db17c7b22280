"""Idempotency keys: recorded with an LWT before anything is pushed.

A key's row says "this alert was accepted". When the LWT times out (unknown outcome), a
SERIAL read settles it: the row's accept_id tells whether the write that landed was this
attempt's (DESIGN.md invariant 4: never re-apply blindly).
"""

from __future__ import annotations

import enum
import uuid
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

    async def record(
        self, notification: Notification, accept_id: uuid.UUID | None = None
    ) -> KeyRecord:
        """Record the key if new. Raises a driver error when storage cannot say.

        `accept_id` names this attempt (a fresh one by default): a row holding it is this
        attempt's own, written by a send whose reply was lost and re-sent, not another's.
        """
        accept_id = accept_id or uuid.uuid4()
        params = (notification.idempotency_key, notification.user_id, accept_id, self._ttl_s)
        try:
            row = (await execute(self._session, self._insert, params)).one()
        except Exception as error:
            if not outcome_unknown(error):
                raise
            return await self._settled(notification.idempotency_key, accept_id)
        # A refused insert answers with the row that is there: ours if a re-send of this
        # very insert found the first one landed.
        if row.applied or row.accept_id == accept_id:
            return KeyRecord.RECORDED
        return KeyRecord.ALREADY_RECORDED

    async def _settled(self, key: str, accept_id: uuid.UUID) -> KeyRecord:
        # A SERIAL read finishes any in-flight Paxos round, so "no row" is final.
        row = (await execute(self._session, self._settle, (key,))).one()
        if row is None:
            raise KeyNotRecorded(f"the key write timed out and did not land: {key!r}")
        return KeyRecord.RECORDED if row.accept_id == accept_id else KeyRecord.ALREADY_RECORDED
