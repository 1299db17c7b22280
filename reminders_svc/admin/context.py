"""What every admin command works with: one session, the store, parts, buckets, the clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from cassandra.cluster import Session

from dispatcher.buckets import BucketReader
from dispatcher.leases import PartLeases
from reminders_svc.config import CassandraSettings, Retention
from reminders_svc.storage.clock import DbClock
from reminders_svc.storage.migrations import require_current_schema
from reminders_svc.storage.parts import PartCounts
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import connect

# The admin's own name where the lease code wants one; it never takes a lease.
_ADMIN_OWNER = "reminders-admin"


class AdminError(RuntimeError):
    """An operator's request refused or impossible; the message says why and what to do."""


@dataclass
class Admin:
    session: Session
    store: ReminderStore
    parts: PartCounts
    leases: PartLeases
    reader: BucketReader
    clock: DbClock

    def now(self) -> datetime:
        """The database's time (commands compare dues with what dispatchers see)."""
        return self.clock.now()


@contextlib.asynccontextmanager
async def open_admin(settings: CassandraSettings) -> AsyncIterator[Admin]:
    connection = await asyncio.to_thread(connect, settings)
    try:
        session = connection.session
        await asyncio.to_thread(require_current_schema, session, settings.keyspace)
        # Clock bound only matters for dispatchers' readiness; the admin just reads it.
        clock = DbClock(session, timedelta(seconds=1))
        await clock.measure()
        # refresh_s=0: an operator must see part counts as stored, not as cached.
        parts = PartCounts(session, refresh_s=0.0)
        yield Admin(
            session=session,
            store=ReminderStore(session, Retention.from_env(), parts=parts),
            parts=parts,
            leases=PartLeases(session, _ADMIN_OWNER, timedelta(seconds=15)),
            reader=BucketReader(session),
            clock=clock,
        )
    finally:
        await asyncio.to_thread(connection.close)
