"""The dispatcher's clock, checked against the database's (DESIGN.md invariant 8).

Never early: a ring is handed off only when its due has passed by this clock, which is
the local clock corrected by the measured offset to Cassandra's `toTimestamp(now())`. An
offset beyond the bound (or no successful measurement recently) makes the dispatcher
not ready: it hands nothing off until the clocks agree again.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from cassandra.cluster import Session

from reminders_svc.storage import aio


class DbClock:
    def __init__(self, session: Session, max_offset: timedelta) -> None:
        self._session = session
        self._max_offset_s = max_offset.total_seconds()
        self.offset_s = 0.0
        self.uncertainty_s = float("inf")
        self._checked_at = -float("inf")

    async def measure(self) -> float:
        """Measure the offset (database minus local), with half the round trip as error."""
        before = time.time()
        row = (
            await aio.execute(self._session, "SELECT toTimestamp(now()) AS now FROM system.local")
        ).one()
        after = time.time()
        database = row.now.replace(tzinfo=UTC).timestamp()
        # Cassandra's timestamp has millisecond precision; add that to the error.
        self.uncertainty_s = (after - before) / 2 + 0.001
        self.offset_s = database - (before + after) / 2
        self._checked_at = time.monotonic()
        return self.offset_s

    def ready(self) -> bool:
        fresh = time.monotonic() - self._checked_at < 60
        return fresh and abs(self.offset_s) + self.uncertainty_s <= self._max_offset_s

    async def sleep_until(self, instant: datetime) -> None:
        delay = (instant - self.now()).total_seconds()
        if delay > 0:
            await asyncio.sleep(delay)

    def now(self) -> datetime:
        """The database's time as best known, rounded down (never ahead of it)."""
        corrected = time.time() + self.offset_s - min(self.uncertainty_s, 1.0)
        return datetime.fromtimestamp(corrected, UTC)
