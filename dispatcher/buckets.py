"""Reading due-bucket entries of one (minute, part), all or only those written lately."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from cassandra.cluster import Session
from cassandra.util import datetime_from_uuid1, min_uuid_from_time

from reminders_svc.storage import aio


@dataclass(frozen=True)
class Entry:
    user_id: str
    reminder_id: uuid.UUID
    due: datetime
    # The entry's clustering key (the table's `written_at`): a timeuuid naming this write,
    # unique per write and ordered by its coordinator's clock (`written` is that time).
    write_id: uuid.UUID
    # When this dispatcher's read found it (the misfire policy judges a ring by that, not
    # by when its turn came); None: when its ring starts.
    found_at: datetime | None = None

    @property
    def written(self) -> datetime:
        """When the entry was written, by its coordinator's clock."""
        written: datetime = datetime_from_uuid1(self.write_id)  # naive UTC; untyped
        return written.replace(tzinfo=UTC)


class BucketReader:
    def __init__(self, session: Session) -> None:
        self._session = session
        self._all = session.prepare(
            "SELECT written_at, reminder_id, user_id, due FROM due_buckets"
            " WHERE minute = ? AND part = ?"
        )
        self._since = session.prepare(
            "SELECT written_at, reminder_id, user_id, due FROM due_buckets"
            " WHERE minute = ? AND part = ? AND written_at > ?"
        )

    async def read(
        self, minute: datetime, part: int, written_since: datetime | None = None
    ) -> list[Entry]:
        """All entries, or those written after `written_since` (by the coordinator's clock)."""
        if written_since is None:
            rows = await aio.execute_all(self._session, self._all, (minute, part))
        else:
            since = min_uuid_from_time(written_since.timestamp())
            rows = await aio.execute_all(self._session, self._since, (minute, part, since))
        return [
            Entry(row.user_id, row.reminder_id, row.due.replace(tzinfo=UTC), row.written_at)
            for row in rows
        ]
