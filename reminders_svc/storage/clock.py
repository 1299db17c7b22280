"""A process's clock checked against the database's (DESIGN.md invariants 3 and 8).

The dispatcher's: never early, a ring is handed off only when its due has passed by this
clock, which is Cassandra's `toTimestamp(now())` as measured by the tightest recent probe,
carried forward by the monotonic clock. Not by the wall clock: a step of it (NTP, a VM
resumed) between two measurements would move this clock ahead of the database's and ring
early. The wall clock's offset to the database is still measured: beyond the bound (or
with no successful measurement recently) the dispatcher is not ready and hands nothing off
until the clocks agree.

The API's: its host clock dates each write (the driver's timestamps) and every due it
computes; off the database's by more than the dispatchers' skew allowance, a bucket entry
can land in a minute they have already closed (invariant 3). It measures the offset with
its storage probe and is not ready while the clock is known off by more than that.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cassandra.cluster import Session

from reminders_svc.storage import aio

# How far ahead the test hook `wall_clock_ahead` puts a process's host clock: beyond any
# bound of the clock checks.
HOOKED_AHEAD_S = 30.0


def wall_clock_ahead() -> Callable[[], float]:
    """The host's wall clock HOOKED_AHEAD_S ahead (the test hook `wall_clock_ahead`)."""
    return lambda: time.time() + HOOKED_AHEAD_S


# How fast the monotonic clock may drift from the database's (NTP slews a clock by at most
# 500 ppm): an estimate's error grows by this much per second of age.
DRIFT_PER_S = 0.001
# An estimate older than this gives way to a newer one, however slow the newer probe was.
MAX_ESTIMATE_AGE_S = 60.0


@dataclass(frozen=True)
class _Estimate:
    """The database's time (epoch seconds) at monotonic time `mono`, give or take `error_s`."""

    database_s: float
    mono: float
    error_s: float

    def at(self, mono: float) -> float:
        return self.database_s + (mono - self.mono)

    def error_at(self, mono: float) -> float:
        return self.error_s + (mono - self.mono) * DRIFT_PER_S


class DbClock:
    def __init__(
        self,
        session: Session,
        max_offset: timedelta,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._session = session
        self._max_offset_s = max_offset.total_seconds()
        self._wall = wall
        self.offset_s = 0.0
        self.uncertainty_s = float("inf")
        self._checked_at = -float("inf")
        # Until a first measurement, the local wall clock's time, its error the bound.
        self._estimate = _Estimate(wall(), time.monotonic(), math.inf)

    async def measure(self, timeout_s: float | None = None) -> float:
        """Measure the offset (database minus local wall clock). The database's time is
        carried by the tightest recent estimate: a probe slowed by a busy database or a
        lagging event loop (half its round trip is its error) does not replace a fast one
        a few seconds old, whose error has grown only by the drift allowance. The wall
        clock is read afresh each time, so a step of it shows at once."""
        before_mono = time.monotonic()
        database = (await aio.database_now(self._session, timeout_s)).timestamp()
        after, after_mono = self._wall(), time.monotonic()
        # Cassandra's timestamp has millisecond precision; add that to the error.
        probe = _Estimate(
            database, (before_mono + after_mono) / 2, (after_mono - before_mono) / 2 + 0.001
        )
        kept = self._estimate
        if after_mono - kept.mono > MAX_ESTIMATE_AGE_S or probe.error_at(
            after_mono
        ) <= kept.error_at(after_mono):
            kept = self._estimate = probe
        self.uncertainty_s = kept.error_at(after_mono)
        self.offset_s = kept.at(after_mono) - after
        self._checked_at = after_mono
        return self.offset_s

    def ready(self) -> bool:
        fresh = time.monotonic() - self._checked_at < 60
        return fresh and abs(self.offset_s) + self.uncertainty_s <= self._max_offset_s

    def known_off(self) -> bool:
        """The host's clock is off by more than the bound whatever the last probe's error:
        not a slow probe (a busy database, a lagging event loop), a clock to fix."""
        return abs(self.offset_s) - self.uncertainty_s > self._max_offset_s

    async def sleep_until(self, instant: datetime) -> None:
        delay = (instant - self.now()).total_seconds()
        if delay > 0:
            await asyncio.sleep(delay)

    def now(self) -> datetime:
        """The database's time as best known, rounded down by the whole error of its
        estimate (never ahead of it, even when that error is past the bound and the clock
        not ready: a ring that checked readiness before the probe still reads it); before a
        measurement, the wall clock rounded down by the bound (and not ready anyway)."""
        mono = time.monotonic()
        error_s = self._estimate.error_at(mono)
        if not math.isfinite(error_s):
            error_s = self._max_offset_s
        return datetime.fromtimestamp(self._estimate.at(mono) - error_s, UTC)
