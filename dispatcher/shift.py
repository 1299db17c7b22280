"""A part's shift: its lease, and the stop that ends the work on it (SIGTERM, a hand-over).

Everything working a part (its minutes, their rings) waits through its shift, so a stop
ends those waits at once: no new minute is read and no new ring claimed, rings already
with the notifier finish, and claims not handed off are let go (DESIGN.md invariant 9).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import datetime

from dispatcher.leases import Lease
from reminders_svc.storage.clock import DbClock

# A lease lost sets no event: a wait on anything but the shift's own stop looks at the
# shift at least this often.
LOOK_EVERY_S = 0.5


class Shift:
    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self._stop = asyncio.Event()
        self._stopped_at: float | None = None  # time.monotonic()

    def stop(self) -> None:
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stopped_for_s(self) -> float:
        """Seconds since `stop()`, 0 while not stopping."""
        return 0.0 if self._stopped_at is None else time.monotonic() - self._stopped_at

    def on(self) -> bool:
        """Work may go on: the lease is held and no stop was asked for."""
        return self.lease.held() and not self.stopping

    async def sleep(self, seconds: float) -> bool:
        """Sleep, cut short by a stop; True when slept in full and the shift is still on."""
        if seconds > 0 and not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), seconds)
        return self.on()

    async def sleep_until(self, clock: DbClock, instant: datetime) -> bool:
        return await self.sleep((instant - clock.now()).total_seconds())
