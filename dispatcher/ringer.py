"""One ring, from a bucket entry to a finalized row (DESIGN.md state machine, invariants 1,
5, 6, 8 and 9).

`Ringer.ring(entry, horizon, lease)`:
1. at max(entry due, now), take one of `max_in_flight` slots (late entries paced first),
   read the row fresh and `decide` (the row decides); the slot is held to the finalize;
2. claim it by LWT at due, never at prefetch (or take over an expired claim, same due);
3. hand it off in a batch (SendBatch), retrying with backoff and jitter while the notifier
   answers retryable, renewing the claim before each retry and stopping if that fails;
4. finalize by LWT; if it loses, re-read: the claim still ours (only a snooze or a text
   edit landed) -> recompute and retry; the claim gone -> the user's change wins.

One user's LWTs never run concurrently (a lock per user), so they do not contend; the
hand-off itself runs outside that lock so one user's many rings still batch together.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from cassandra import DriverException
from cassandra.protocol import ErrorMessage

from dispatcher.buckets import Entry
from dispatcher.clock import DbClock
from dispatcher.handoff import Answer, NotifierClient, Outcome, Ring
from dispatcher.leases import Lease
from dispatcher.metrics import DispatcherMetrics
from dispatcher.ratelimit import RateLimiter
from dispatcher.settings import DispatcherSettings, MisfirePolicy
from reminders_svc.concurrency import UserLocks
from reminders_svc.domain import dispatch
from reminders_svc.domain.delivery import Answer as HistoryAnswer
from reminders_svc.domain.delivery import Delivery
from reminders_svc.domain.reminder import Reminder
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.reminders_store import ReminderStore, StoredReminder

log = logging.getLogger(__name__)

_HISTORY = {
    Outcome.ACCEPTED: HistoryAnswer.ACCEPTED,
    Outcome.DUPLICATE: HistoryAnswer.DUPLICATE,
    Outcome.REJECTED: HistoryAnswer.REJECTED,
    # Only recorded when retrying stopped because the claim was lost: given up.
    Outcome.RETRYABLE: HistoryAnswer.ABANDONED,
}


def fault(name: str) -> bool:
    """Test hooks, off unless REMINDERS_DISPATCH_FAULTS names them (comma-separated)."""
    return name in os.environ.get("REMINDERS_DISPATCH_FAULTS", "").split(",")


def _crash_if(name: str) -> None:
    if fault(name):
        log.warning("fault hook %s: killing this process", name)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class _Pending:
    ring: Ring
    answer: asyncio.Future[Answer]


class HandoffBatcher:
    """Collects rings already claimed and sends them in batches, a few at a time."""

    def __init__(self, client: NotifierClient, batch_size: int, linger_s: float = 0.02) -> None:
        self._client = client
        self._batch_size = batch_size
        self._linger_s = linger_s
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def send(self, ring: Ring) -> Answer:
        pending = _Pending(ring, asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        if len(self._queue) >= self._batch_size:
            self._flush()
        elif self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_later())
        return await pending.answer

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._linger_s)
        self._flusher = None
        self._flush()

    def _flush(self) -> None:
        batch, self._queue = self._queue[: self._batch_size], self._queue[self._batch_size :]
        if batch:
            task = asyncio.create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        answers = await self._client.send([p.ring for p in batch])
        _crash_if("crash_after_send")
        for pending in batch:
            if not pending.answer.done():
                pending.answer.set_result(answers[pending.ring.key])


class Ringer:
    def __init__(
        self,
        store: ReminderStore,
        history: DeliveryHistory,
        batcher: HandoffBatcher,
        clock: DbClock,
        settings: DispatcherSettings,
        metrics: DispatcherMetrics,
    ) -> None:
        self._store = store
        self._history = history
        self._batcher = batcher
        self._clock = clock
        self._settings = settings
        self._metrics = metrics
        self._users = UserLocks()
        self._in_flight: dict[uuid.UUID, asyncio.Future[None]] = {}
        self._capacity = asyncio.Semaphore(settings.max_in_flight)
        self._catch_up = RateLimiter(settings.catch_up_rings_per_s)
        self.claimed_since: dict[uuid.UUID, datetime] = {}  # for the oldest-claim gauge

    async def ring(self, entry: Entry, horizon: datetime, lease: Lease) -> None:
        """Handle one bucket entry to the end; returns when nothing is left unresolved."""
        await self._clock.sleep_until(entry.due)
        while True:
            # A second entry for a reminder already in hand waits for the first, then the
            # row decides again (it may be due again, e.g. snoozed meanwhile).
            earlier = self._in_flight.get(entry.reminder_id)
            if earlier is None:
                break
            await asyncio.shield(earlier)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._in_flight[entry.reminder_id] = done
        try:
            while lease.held():
                try:
                    await self._ring(entry, horizon, lease)
                    break
                except (DriverException, ErrorMessage, OSError) as error:
                    # Storage trouble: nothing was decided that the row does not record;
                    # look again shortly (the row decides), as long as the part is ours.
                    log.warning("ring of an entry failed (%s); retrying", type(error).__name__)
                    await asyncio.sleep(random.uniform(0.5, 2.0))
        finally:
            del self._in_flight[entry.reminder_id]
            done.set_result(None)

    async def _ring(self, entry: Entry, horizon: datetime, lease: Lease) -> None:
        due = entry.due
        while lease.held():
            while not self._clock.ready():  # noqa: ASYNC110
                # Never early: no hand-off on an unchecked clock. The service re-measures it.
                await asyncio.sleep(1.0)
            if self._clock.now() - due > self._settings.late_after:
                await self._catch_up.wait()  # an entry from a backlog: paced, live ones are not
            # One slot from the fresh read to the finalize: at most max_in_flight rings in
            # hand, taken in due order, each read just before its claim (a minute of 20,000
            # entries no longer fires 20,000 reads at once).
            async with self._capacity:
                stored = await self._store.get(entry.user_id, entry.reminder_id)
                now = self._clock.now()
                decision = dispatch.decide(stored.reminder if stored else None, now, horizon)
                if isinstance(decision, dispatch.Skip):
                    self._metrics.skips.labels(decision.reason.value).inc()
                    return
                if not isinstance(decision, dispatch.WaitUntil):
                    assert stored is not None
                    await self._claim_and_hand_off(stored, decision, lease)
                    return
            due = decision.instant
            await self._clock.sleep_until(due)

    async def _claim_and_hand_off(
        self, stored: StoredReminder, decision: dispatch.Decision, lease: Lease
    ) -> None:
        row = stored.reminder
        now = self._clock.now()
        token = uuid.uuid4()
        claim_lease = self._settings.claim_lease
        if isinstance(decision, dispatch.Reclaimable):
            after = dispatch.reclaimed(row, token, now, claim_lease)
        else:
            after = dispatch.claimed(row, token, now, claim_lease)
        async with self._users.hold(row.user_id):
            if not lease.held() or not await self._store.replace(stored, after, now):
                return  # the row changed under us (or the part moved on): its entry decides
        assert after.claim is not None
        _crash_if("crash_after_claim")
        if isinstance(decision, dispatch.Reclaimable):
            self._metrics.reclaims.inc()
        self._metrics.claim_lateness.observe(max(0.0, (now - after.claim.due).total_seconds()))
        self.claimed_since[row.reminder_id] = after.claim.due
        try:
            try:
                answer = await self._hand_off(after, lease)
            except asyncio.CancelledError:
                # Shutting down: let the claim go now, so the next owner re-claims the ring
                # at once (same due, same key) instead of after the claim lease.
                await asyncio.shield(
                    self._store.set_claim_expiry(
                        row.user_id, row.reminder_id, token, self._clock.now() - claim_lease
                    )
                )
                raise
            if answer is None:
                abandoned = Answer(Outcome.RETRYABLE, "claim lost while retrying")
                await self._history.record(self._delivery(after, now, None, abandoned, None))
            else:
                await self._finish(after, answer, claimed_at=now)
        finally:
            self.claimed_since.pop(row.reminder_id, None)

    async def _hand_off(self, row: Reminder, lease: Lease) -> Answer | None:
        """The notifier's final answer, or None when the claim was lost or let go."""
        assert row.claim is not None
        due = row.claim.due
        now = self._clock.now()
        late_by = now - due
        if (
            self._settings.misfire_policy is MisfirePolicy.SKIP_MISSED
            and late_by > self._settings.misfire_grace
        ):
            return Answer(Outcome.REJECTED, "missed: older than the misfire grace")
        ring = Ring(
            key=dispatch.idempotency_key(row),
            user_id=row.user_id,
            text=row.text,
            due=due,
            expires=max(due, now) + self._settings.ring_expiry,
        )
        delay = 0.5
        while True:
            answer = await self._batcher.send(ring)
            if answer.outcome is not Outcome.RETRYABLE:
                return answer
            self._metrics.notifier_errors.inc()
            await asyncio.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, 30.0)
            expires = self._clock.now() + self._settings.claim_lease
            renewed = lease.held() and await self._store.set_claim_expiry(
                row.user_id, row.reminder_id, row.claim.token, expires
            )
            if not renewed:
                # The user took over (or the part moved on): stop; whoever holds the ring
                # now decides. The notifier's key dedupes a re-send.
                self._metrics.claims_lost.inc()
                return None

    async def _finish(self, claimed_row: Reminder, answer: Answer, claimed_at: datetime) -> None:
        assert claimed_row.claim is not None
        now = self._clock.now()
        lateness = now - claimed_row.claim.due
        self._metrics.handoff_lateness.observe(max(0.0, lateness.total_seconds()))
        self._metrics.rings.labels(answer.outcome.value).inc()
        await self._history.record(self._delivery(claimed_row, claimed_at, now, answer, lateness))
        async with self._users.hold(claimed_row.user_id):
            await self._finalize(claimed_row, now)

    async def _finalize(self, claimed_row: Reminder, now: datetime) -> None:
        assert claimed_row.claim is not None
        token = claimed_row.claim.token
        # First try against the row as this dispatcher claimed it (the usual case: nobody
        # touched it since); only a lost compare needs a SERIAL re-read.
        stored: StoredReminder | None = StoredReminder(claimed_row, None)
        for attempt in range(10):
            if attempt:
                stored = await self._store.get_serial(claimed_row.user_id, claimed_row.reminder_id)
            current = stored.reminder if stored else None
            if (
                stored is None
                or current is None
                or current.claim is None
                or (current.claim.token != token)
            ):
                self._metrics.claims_lost.inc()  # edited, paused or deleted: the user wins
                return
            if await self._store.replace(stored, dispatch.finalized(current, now), now):
                return
        log.warning("finalize of a ring kept losing; its claim will expire and be retaken")

    def _delivery(
        self,
        row: Reminder,
        claimed_at: datetime,
        handed_off_at: datetime | None,
        answer: Answer | None,
        lateness: timedelta | None,
    ) -> Delivery:
        assert row.claim is not None
        return Delivery(
            user_id=row.user_id,
            reminder_id=row.reminder_id,
            claim_due=row.claim.due,
            claim_token=row.claim.token,
            claimed_at=claimed_at,
            handed_off_at=handed_off_at,
            answer=_HISTORY.get(answer.outcome) if answer else None,
            reason=answer.reason if answer and answer.reason else None,
            late=lateness is not None and lateness > self._settings.late_after,
        )
