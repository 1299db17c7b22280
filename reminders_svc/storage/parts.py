"""Dispatch parts: which (minute, part) bucket a user's rings go to.

`part_of` hashes the user id with BLAKE2b, so it is stable across processes, machines
and releases (Python's `hash()` is salted per process). All of one user's rings in a
minute meet in one part, so one dispatcher runs that user's LWTs and they do not contend.

The number of parts P only grows; each P is stored with the minute it takes effect, so
a minute is always read with the P its entries were written with.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cassandra.cluster import Session

from reminders_svc.storage.aio import execute

_SCOPE = "dispatch"
DEFAULT_PARTS = 64


def part_of(user_id: str, parts: int) -> int:
    digest = hashlib.blake2b(user_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % parts


# A bucket's span: entries are grouped by the minute of their due.
MINUTE = timedelta(minutes=1)


def floor_minute(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(second=0, microsecond=0)


@dataclass(frozen=True)
class PartCount:
    from_minute: datetime
    parts: int


class PartCounts:
    """The P in force for a minute, cached briefly (P changes rarely and only ahead)."""

    def __init__(self, session: Session, refresh_s: float = 30.0) -> None:
        self._session = session
        self._refresh_s = refresh_s
        self._loaded_at = -float("inf")
        self._counts: tuple[PartCount, ...] = ()

    async def load(self) -> tuple[PartCount, ...]:
        if time.monotonic() - self._loaded_at > self._refresh_s:
            rows = await execute(
                self._session,
                "SELECT from_minute, parts FROM part_counts WHERE scope = %s",
                (_SCOPE,),
            )
            counts = tuple(
                PartCount(row.from_minute.replace(tzinfo=UTC), row.parts) for row in rows
            )
            self._counts = tuple(sorted(counts, key=lambda c: c.from_minute, reverse=True))
            self._loaded_at = time.monotonic()
        return self._counts

    async def parts_at(self, minute: datetime) -> int:
        for count in await self.load():
            if count.from_minute <= minute:
                return count.parts
        return DEFAULT_PARTS


def bucket_minute(due: datetime, now: datetime) -> datetime:
    """Entries go into max(minute(due), minute(now)): never into a minute already past."""
    return max(floor_minute(due), floor_minute(now))


# Cassandra refuses a longer TTL (20 years).
MAX_TTL_S = 630_720_000
# `USING TTL 0`: the entry never expires (overriding the table's default TTL).
NO_EXPIRY = 0


def entry_ttl(due: datetime, now: datetime, retention: timedelta) -> int:
    """Seconds an entry lives: until due, plus a retention longer than any outage. An
    entry that would outlive Cassandra's longest TTL is kept for good instead: cut short,
    it would expire before its due and the ring would be lost. Only a repeat's rare long
    gap needs it (Feb 29 on given weekdays: 2036, then 2056); the first ring, and the
    first rings' spacing, are held within 10 years (schedule.MAX_AHEAD)."""
    seconds = max(1, int((max(due, now) - now + retention).total_seconds()))
    return seconds if seconds <= MAX_TTL_S else NO_EXPIRY
