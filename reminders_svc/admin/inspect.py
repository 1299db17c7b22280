"""`reminders admin inspect --minute M`: what a minute's buckets hold, and each row's state.

Shows ids, dues, status, version and claim; never the reminder's text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from dispatcher.buckets import Entry
from reminders_svc.admin.context import Admin, AdminError
from reminders_svc.admin.output import iso
from reminders_svc.storage.reminders_store import StoredReminder


@dataclass(frozen=True)
class EntryState:
    part: int
    written_at: str | None  # the coordinator's time of the entry's write
    user_id: str
    reminder_id: str
    entry_due: str | None
    status: str | None  # None: no such row (deleted past its retention, or never landed)
    due: str | None
    version: int | None
    claim_token: str | None
    claim_due: str | None
    claim_expires: str | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


async def inspect_minute(
    admin: Admin, minute: datetime, only_part: int | None, limit: int
) -> tuple[int, list[EntryState]]:
    """The P in force for `minute`, and up to `limit` entries with their rows' state."""
    parts = await admin.parts.parts_at(minute)
    if only_part is not None and only_part >= parts:
        raise AdminError(
            f"--part {only_part}: minute {iso(minute)} has P = {parts} (parts 0 to {parts - 1})"
        )
    found: list[EntryState] = []
    for part in range(parts) if only_part is None else (only_part,):
        for entry in await admin.reader.read(minute, part):
            if len(found) == limit:
                return parts, found
            stored = await admin.store.get(entry.user_id, entry.reminder_id)
            found.append(_state(part, entry, stored))
    return parts, found


def _state(part: int, entry: Entry, stored: StoredReminder | None) -> EntryState:
    row = stored.reminder if stored is not None else None
    claim = row.claim if row is not None else None
    return EntryState(
        part=part,
        written_at=iso(entry.written),
        user_id=entry.user_id,
        reminder_id=str(entry.reminder_id),
        entry_due=iso(entry.due),
        status=row.status.value if row is not None else None,
        due=iso(row.due) if row is not None else None,
        version=row.version if row is not None else None,
        claim_token=str(claim.token) if claim is not None else None,
        claim_due=iso(claim.due) if claim is not None else None,
        claim_expires=iso(claim.expires) if claim is not None else None,
    )
