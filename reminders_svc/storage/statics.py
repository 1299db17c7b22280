"""A user's static cells in `reminders` (the active count, a purge's fence), read through
the partition's count row.

A `LIMIT 1` read of static columns returns them with the partition's first live row, and
reaches it past every expired row before it. A deleted reminder's cells expire after the
tombstone TTL and stay as tombstones until compaction runs past gc_grace, so a user who
churns through thousands of reminders (an integration making and deleting one per event)
made each such read count tens of thousands of tombstones, up to Cassandra's failure
threshold (100,000): their creates, and a purge of their data, failed. A user's first
create (the count null) writes the count row (a row marker alone, at an id no reminder
has); a read restricted to it reads no other row. A partition without one (none at all,
or one whose first create came before count rows, 2026-12-07) is read as before.
"""

from __future__ import annotations

import uuid
from typing import Any

from cassandra.cluster import Session

from reminders_svc.storage import aio
from reminders_svc.storage.session import prepare_serial

# A uuid of version 0: no reminder id (uuid4) is it, and it sorts before them all, so a
# listing from the lowest id (`reminder_id > COUNT_ROW`) never shows it either.
COUNT_ROW = uuid.UUID(int=0)
WRITE_COUNT_ROW = "INSERT INTO reminders (user_id, reminder_id) VALUES (?, ?)"


class StaticsRead:
    """Reads `columns` (static ones, or functions) of a user's partition: through its count
    row, else its first row. `serial`: through Paxos."""

    def __init__(self, session: Session, columns: str, *, serial: bool = False) -> None:
        self._session = session
        counted = f"SELECT reminder_id, {columns} FROM reminders WHERE user_id = ? AND"
        first = f"SELECT {columns} FROM reminders WHERE user_id = ? LIMIT 1"
        if serial:
            self._count_row = prepare_serial(session, f"{counted} reminder_id = ?")
            self._first_row = prepare_serial(session, first)
        else:
            self._count_row = session.prepare(f"{counted} reminder_id = ?")
            self._first_row = session.prepare(first)

    async def __call__(self, user_id: str) -> Any | None:
        """The row of the partition's static cells; None when the partition is empty."""
        row = (await aio.execute(self._session, self._count_row, (user_id, COUNT_ROW))).one()
        if row is None:
            row = (await aio.execute(self._session, self._first_row, (user_id,))).one()
        return row
