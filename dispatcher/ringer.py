"""One ring, from a bucket entry to a finalized row (DESIGN.md state machine, invariants 1,
5, 6, 8 and 9).

`Ringer.start(entry, horizon, shift, late=...)`, called at the entry's due: a late entry (a
backlog's, read long past its due) is paced first; then the ring starts once fewer than
`_STARTED_PER_SLOT` x `max_in_flight` rings of this dispatcher are under way, so memory
stays bounded however many entries a minute holds (a task per entry costs ~4 KB; a
minute's waiting entries are kept as data).

`Ringer.ring(entry, horizon, shift)`:
1. at max(entry due, now), once the notifier's channel is connected (while the notifier
   cannot be reached nothing is claimed: rings due meanwhile wait, unclaimed, and go when
   it is back), take one of `max_in_flight` slots, and the reminder's own
   (one of its entries in hand at a time), read the row fresh and `decide` (the row
   decides; a skip is made final only on a read through Paxos, which completes a user's
   change left half-done); both are held to the finalize, neither while waiting for a
   later due the row holds;
2. claim it by LWT at due, never at prefetch (or take over an expired claim, same due); a
   claim that loses to a user's change reads the row again, and the row decides again
   (under `skip_missed`, a ring older than the grace when its entry was found is instead
   moved on by one LWT, never claimed);
3. hand it off in a batch (SendBatch), only while the part's lease is held, retrying with
   backoff and jitter while the notifier answers retryable (each attempt with an expiry
   of its own; a backoff ends early when the notifier, unreachable, is back), renewing
   the claim before each retry and stopping if that fails;
4. finalize by LWT; if it loses, re-read: the claim still ours (only a snooze or a text
   edit landed) -> recompute and retry, with backoff, as long as the part is ours; the
   claim gone -> the user's change wins.
A ring not resolved when its shift ends (a stop, the part lost) lets its claim go (expiry
now), so it is re-claimed at once, under the same key, by whoever works the part next;
unless its batch is with the notifier: then the claim stands until it expires (the push
may still happen, and a delete meanwhile must say a ring may be in flight).

One user's LWTs never run concurrently (a lock per user), so they do not contend; the
hand-off itself runs outside that lock so one user's many rings still batch together.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from dispatcher.buckets import Entry
from dispatcher.handoff import Answer, NotifierClient, Outcome, Ring
from dispatcher.metrics import DispatcherMetrics
from dispatcher.ratelimit import RateLimiter
from dispatcher.settings import DispatcherSettings, MisfirePolicy
from dispatcher.shift import LOOK_EVERY_S, Shift
from reminders_svc.concurrency import UserLocks, backoff_s, to_the_end
from reminders_svc.domain import dispatch
from reminders_svc.domain.delivery import Answer as HistoryAnswer
from reminders_svc.domain.delivery import Delivery
from reminders_svc.domain.reminder import Reminder
from reminders_svc.storage.clock import DbClock
from reminders_svc.storage.errors import STORAGE_ERRORS
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.parts import MINUTE, bucket_minute
from reminders_svc.storage.reminders_store import ReminderStore, StoredReminder

log = logging.getLogger(__name__)

# Rings under way (started, not yet resolved) per `max_in_flight` slot: enough that rings
# waiting for a later due, a pace or a reminder's earlier entry leave the slots busy.
_STARTED_PER_SLOT = 4
# What the history records for a ring the skip_missed policy did not hand off.
_MISSED = Answer(Outcome.REJECTED, "missed: older than the misfire grace")
_HISTORY = {
    Outcome.ACCEPTED: HistoryAnswer.ACCEPTED,
    Outcome.DUPLICATE: HistoryAnswer.DUPLICATE,
    Outcome.REJECTED: HistoryAnswer.REJECTED,
    # Only recorded when retrying stopped because the claim was lost: given up.
    Outcome.RETRYABLE: HistoryAnswer.ABANDONED,
}


def _crash_if(faults: frozenset[str], name: str) -> None:
    """Test hooks (DispatcherSettings.faults): off unless REMINDERS_DISPATCH_FAULTS names them."""
    if name in faults:
        log.warning("fault hook %s: killing this process", name)
        os.kill(os.getpid(), signal.SIGKILL)


def _freeze_if(faults: frozenset[str], name: str) -> None:
    """Stop this process (as a long GC pause or a frozen VM would) until sent SIGCONT."""
    if name in faults:
        log.warning("fault hook %s: stopping this process", name)
        os.kill(os.getpid(), signal.SIGSTOP)


def _tombstone(stored: StoredReminder | None, skip: dispatch.Decision) -> bool:
    """A skip for a row the user deleted: final as read, as nothing brings it back."""
    return (
        stored is not None
        and isinstance(skip, dispatch.Skip)
        and skip.reason is dispatch.SkipReason.DELETED
    )


class _Backoff:
    """Delays for successive retries (`backoff_s`): doubling from `first` up to `cap`."""

    def __init__(self, first: float, cap: float) -> None:
        self._first = first
        self._cap = cap
        self._attempts = 0

    def next(self) -> float:
        self._attempts += 1
        return backoff_s(self._first, self._attempts, self._cap)


@dataclass
class _Pending:
    ring: Ring
    answer: asyncio.Future[Answer]
    shift: Shift


# The answer to a ring whose shift ended while it waited for its batch: never sent.
_NOT_SENT = Answer(Outcome.RETRYABLE, "not sent: its part's shift ended")


class HandoffBatcher:
    """Collects rings already claimed and sends them in batches, a few at a time."""

    def __init__(
        self,
        client: NotifierClient,
        batch_size: int,
        linger_s: float = 0.02,
        faults: frozenset[str] = frozenset(),
    ) -> None:
        self._client = client
        self._faults = faults
        self._batch_size = batch_size
        self._linger_s = linger_s
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        # Keys of the batches cut for sending and not yet answered (a Counter: two batches
        # may carry one key, a retry after a timed-out call).
        self._keys_sending: collections.Counter[str] = collections.Counter()

    async def send(self, ring: Ring, shift: Shift) -> Answer:
        """The notifier's answer. A caller cancelled while its ring waits in the queue takes
        it out (never sent); once its batch is sent, the call goes on (`sending`). A ring
        whose shift is off when its batch is cut (the process paused past its lease while
        the ring waited) is not sent: `_NOT_SENT`."""
        pending = _Pending(ring, asyncio.get_running_loop().create_future(), shift)
        self._queue.append(pending)
        if len(self._queue) >= self._batch_size:
            self._flush()
        elif self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_later())
        try:
            return await pending.answer
        except asyncio.CancelledError:
            self._queue = [queued for queued in self._queue if queued is not pending]
            raise

    def connection_failing(self) -> bool:
        return self._client.connection_failing()

    async def until_connected(self, wait_s: float) -> bool:
        return await self._client.until_connected(wait_s)

    async def until_taking(self, wait_s: float) -> bool:
        return await self._client.until_taking(wait_s)

    def sending(self, key: str) -> bool:
        """Whether a batch holding the ring of `key` is cut for sending or with the
        notifier: its ring may still go out."""
        return self._keys_sending[key] > 0

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._linger_s)
        self._flusher = None
        self._flush()

    def _flush(self) -> None:
        # A waiter cancelled in this same turn of the loop is still queued: it is left out
        # (its caller lets its claim go, so its ring must not go out).
        live = []
        for pending in self._queue:
            if pending.answer.cancelled():
                continue
            # Looked at as the batch is cut, the last moment before the ring goes out: a
            # part lost while its rings waited (a pause past the lease) hands none off.
            if not pending.shift.on():
                pending.answer.set_result(_NOT_SENT)
                continue
            live.append(pending)
        batch, self._queue = live[: self._batch_size], live[self._batch_size :]
        if batch:
            # Marked as sending when cut, not when the task first runs: a caller cancelled
            # meanwhile must see its ring as on its way.
            self._keys_sending.update(pending.ring.key for pending in batch)
            task = asyncio.create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Pending]) -> None:
        rings = [p.ring for p in batch]
        try:
            answers = await self._client.send(rings)
        except Exception as error:
            # Whatever failed, no ring of the batch waits for an answer that never comes:
            # each is retried (same key) with backoff, like a failed call.
            log.exception("a hand-off batch failed")
            reason = f"hand-off failed: {type(error).__name__}"
            answers = {ring.key: Answer(Outcome.RETRYABLE, reason) for ring in rings}
        finally:
            self._keys_sending -= collections.Counter(ring.key for ring in rings)  # drops zeros
        _crash_if(self._faults, "crash_after_send")
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
        self._room = asyncio.Semaphore(settings.max_in_flight * _STARTED_PER_SLOT)
        self._catch_up = RateLimiter(settings.catch_up_rings_per_s)
        self.claimed_since: dict[uuid.UUID, datetime] = {}  # claim times, for the gauge

    async def start(
        self, entry: Entry, horizon: datetime, shift: Shift, *, late: bool
    ) -> asyncio.Task[bool | datetime] | None:
        """The entry's ring, started once it is its turn: paced if the entry is `late` (a
        backlog's, read long past its due: paced before its row is read, so a backlog's
        reads are paced too; live ones never, however long they wait their turn), then
        once this dispatcher has room for one more ring. None when the shift ended first."""
        if late and not await self._catch_up.take(shift):
            return None
        while shift.on():
            try:
                async with asyncio.timeout(LOOK_EVERY_S):
                    await self._room.acquire()
            except TimeoutError:
                continue
            task = asyncio.create_task(self.ring(entry, horizon, shift))
            task.add_done_callback(lambda _: self._room.release())
            return task
        return None

    async def ring(self, entry: Entry, horizon: datetime, shift: Shift) -> bool | datetime:
        """Handle one bucket entry to the end. True when nothing is left unresolved; False
        when the shift ended first (its claim, if any, is then let go, or left to expire
        when storage does not answer; its minute is not finished); an instant when the row
        was skipped on a read that a user's write may still overtake: the entry is to be
        looked at again then (see `_recheck_at`)."""
        if not await shift.sleep_until(self._clock, entry.due):
            return False
        while shift.on():
            try:
                return await self._ring(entry, horizon, shift)
            except STORAGE_ERRORS as error:
                # Storage trouble: nothing was decided that the row does not record;
                # look again shortly (the row decides), as long as the part is ours.
                log.warning("ring of an entry failed (%s); retrying", type(error).__name__)
                await shift.sleep(random.uniform(0.5, 2.0))
            except Exception:
                # A row this dispatcher cannot handle (a zone its tz database lacks, a value
                # a newer release wrote): set aside, so that one row does not stop its whole
                # part minute after minute. Its claim, if taken, was let go; the row is left
                # as it is, counted and logged by id (never its text), and
                # `reminders admin replay` rings it once the cause is fixed.
                self._metrics.rings_set_aside.inc()
                log.exception(
                    "reminder %s: set aside, its row could not be handled", entry.reminder_id
                )
                return True
        return False

    @contextlib.asynccontextmanager
    async def _in_hand(self, reminder_id: uuid.UUID) -> AsyncIterator[None]:
        """One entry of a reminder in hand at a time, from its read to its finalize: a
        second waits for the first, then the row decides again (it may be due again, e.g.
        snoozed meanwhile). Not held while an entry waits for a later due, so an entry
        that a newer edit made due sooner is not held up behind it."""
        while True:
            earlier = self._in_flight.get(reminder_id)
            if earlier is None:
                break
            await asyncio.shield(earlier)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._in_flight[reminder_id] = done
        try:
            yield
        finally:
            del self._in_flight[reminder_id]
            done.set_result(None)

    async def _ring(self, entry: Entry, horizon: datetime, shift: Shift) -> bool | datetime:
        due = entry.due
        read = self._store.get
        began = self._clock.now()
        while shift.on():
            if not self._clock.ready():
                # Never early: no hand-off on an unchecked clock. The service re-measures it.
                await shift.sleep(1.0)
                continue
            if not await self._batcher.until_taking(LOOK_EVERY_S):
                # No claim while the notifier cannot be reached or takes nothing (its
                # calls all answered "retry": `RefusalBreaker`): a claimed ring would be
                # retried, its claim renewed by an LWT each time, for the whole outage (an
                # hour's rings, thousands of LWTs a second), and would stand in the way of
                # its user's changes. Unclaimed, it waits here (its minute open, nothing
                # written) and goes as soon as the notifier is back.
                continue
            # One slot from the fresh read to the finalize: at most max_in_flight rings in
            # hand, taken in due order, each read just before its claim (a minute of 20,000
            # entries no longer fires 20,000 reads at once).
            async with self._in_hand(entry.reminder_id), self._capacity:
                if not shift.on():
                    return False
                if not self._clock.ready():
                    continue  # a probe while this waited for its slot: wait out of it
                read_at, stored, now, decision = await self._look(read, entry, horizon)
                if (
                    read != self._store.get_serial
                    and isinstance(decision, dispatch.Skip)
                    and self._recheck_at(stored, decision, read_at, horizon, entry.written) is None
                    and not _tombstone(stored, decision)
                ):
                    # Final only on a read through Paxos: a user's LWT accepted whose commit
                    # did not reach a quorum (and whose settle read failed too) shows on no
                    # plain read until something completes it, so a skip made final on one
                    # would lose the ring it brings (a create, a resume, a snooze of a done
                    # one-off). This read completes it. Tombstones are final as read.
                    read_at, stored, now, decision = await self._look(
                        self._store.get_serial, entry, horizon
                    )
                if isinstance(decision, dispatch.Skip):
                    again = self._recheck_at(stored, decision, read_at, horizon, entry.written)
                    if again is not None:
                        self._metrics.skips_deferred.inc()
                        return again
                    self._metrics.skips.labels(decision.reason.value).inc()
                    return True
                if isinstance(decision, dispatch.Claimable) and self._missed(
                    stored, now, entry.found_at or began
                ):
                    assert stored is not None
                    skipped = await self._skip_missed(stored, now, shift)
                    if skipped is None:
                        read = self._store.get_serial  # as after a claim lost
                        continue
                    return skipped
                if not isinstance(decision, dispatch.WaitUntil):
                    assert stored is not None
                    claimed = await self._claim(stored, decision, now, shift)
                    if claimed is None:
                        # The row changed under the claim: read it through Paxos (what the
                        # claim lost to is settled then) and let it decide again.
                        read = self._store.get_serial
                        continue
                    first = not isinstance(decision, dispatch.Reclaimable)
                    return await self._deliver(claimed, now, shift, first)
            due = decision.instant
            if not await shift.sleep_until(self._clock, due):
                return False
        return False

    async def _look(
        self,
        read: Callable[[str, uuid.UUID], Awaitable[StoredReminder | None]],
        entry: Entry,
        horizon: datetime,
    ) -> tuple[datetime, StoredReminder | None, datetime, dispatch.Decision]:
        """The row read afresh, and what it decides: with when the read went out, as a
        skip is final only on a read sent after the writes it must see landed (judged by
        when the read went out, not by when a slow replica answered), and now."""
        read_at = self._clock.now()
        stored = await read(entry.user_id, entry.reminder_id)
        now = self._clock.now()
        decision = dispatch.decide(stored.reminder if stored else None, now, horizon, entry.written)
        return read_at, stored, now, decision

    def _recheck_at(
        self,
        stored: StoredReminder | None,
        skip: dispatch.Skip,
        read_at: datetime,
        horizon: datetime,
        entry_written: datetime | None,
    ) -> datetime | None:
        """When a skip must be looked at again: a user's write whose bucket entry this is
        lands on the row up to the write deadline after the entry, so a row read before the
        minute's final read (its end plus the grace) may not show it yet: not yet created,
        still paused or done, its due not yet moved into the minute. Such a skip is decided
        again at the final read's time, when the row shows every write of the minute
        (DESIGN.md invariant 3); None when the skip is final (read at or after that time, or
        a tombstone, which nothing brings back)."""
        final_read_at = horizon + self._settings.grace
        tombstone = _tombstone(stored, skip)
        # The write that made the entry lands within G of it (the write deadline plus the
        # skew): past that, the row shows it, and an older entry's skip is final at once.
        landed = entry_written is not None and read_at >= entry_written + self._settings.grace
        return None if tombstone or landed or read_at >= final_read_at else final_read_at

    async def _claim(
        self, stored: StoredReminder, decision: dispatch.Decision, now: datetime, shift: Shift
    ) -> Reminder | None:
        """The row as claimed; None when the shift ended or a user's change landed first."""
        row = stored.reminder
        token = uuid.uuid4()
        claim_lease = self._settings.claim_lease
        if isinstance(decision, dispatch.Reclaimable):
            after = dispatch.reclaimed(row, token, now, claim_lease)
        else:
            after = dispatch.claimed(row, token, now, claim_lease)
        claim: asyncio.Future[bool] | None = None
        try:
            async with self._users.hold(row.user_id):
                if not shift.on():
                    return None
                claim = asyncio.ensure_future(self._store.replace(stored, after, now))
                applied = await asyncio.shield(claim)
        except asyncio.CancelledError:
            if claim is not None:
                # Cancelled mid-claim (the part lost, the shutdown grace over): the LWT
                # goes on and may land. Let it go if it does, or the next owner of the part
                # waits out the whole claim lease before it can ring it.
                await to_the_end(self._let_go_if_landed(claim, after))
            raise
        except STORAGE_ERRORS:
            # Unknown whether it landed (its settling read failed too): if it did, this
            # ring, tried again, would find its own claim standing and wait out the whole
            # claim lease. Let it go: by its token, which touches no claim but this one.
            await self._let_go(after)
            raise
        if not applied:
            self._metrics.claims_lost.inc()
            return None
        assert after.claim is not None
        _crash_if(self._settings.faults, "crash_after_claim")
        _freeze_if(self._settings.faults, "freeze_after_claim")
        if isinstance(decision, dispatch.Reclaimable):
            self._metrics.reclaims.inc()  # its due was claimed before: its lateness counted
        else:
            # When the claim landed, not when it was decided: a wait for the user's lock
            # and the LWT's own rounds are claim lateness, not the notifier's hand-off's.
            lateness = self._clock.now() - after.claim.due
            self._metrics.claim_lateness.observe(max(0.0, lateness.total_seconds()))
        return after

    async def _deliver(
        self, claimed_row: Reminder, claimed_at: datetime, shift: Shift, first: bool
    ) -> bool:
        """Hand the claimed ring off and finalize it; True once resolved. A claim left
        unresolved (the shift ended first, or storage trouble) is let go, so it is
        re-claimed at once, here or by the part's next owner, under the same key. `first`:
        claimed from pending, not taken over from an expired claim."""
        reminder_id = claimed_row.reminder_id
        self.claimed_since[reminder_id] = claimed_at
        resolved = False
        try:
            answer = await self._hand_off(claimed_row, shift)
            if answer is None:
                return False
            if answer.outcome is Outcome.RETRYABLE:
                resolved = True  # the claim was taken while retrying: the user's change wins
                await self._record(
                    self._delivery(claimed_row, claimed_at, None, answer, None),
                    keep_earlier=True,  # nothing handed off: an earlier record stands
                )
                if await self._store.get_serial(claimed_row.user_id, reminder_id) is None:
                    await self._forget(claimed_row)
            else:
                resolved = await self._finish(claimed_row, answer, claimed_at, shift, first)
            return resolved
        finally:
            self.claimed_since.pop(reminder_id, None)
            if not resolved:
                if self._batcher.sending(dispatch.idempotency_key(claimed_row)):
                    # Cancelled while its batch is with the notifier: the ring may still go
                    # out, so the claim stands until it expires. Let go now, a user's pause
                    # or edit would clear it with a hand-off window already passed, and a
                    # delete would answer "not in flight" before the push (refinement 27).
                    log.info(
                        "reminder %s: a hand-off under way; its claim left to expire", reminder_id
                    )
                else:
                    await to_the_end(self._let_go(claimed_row))

    @contextlib.asynccontextmanager
    async def _slot_given_up(self) -> AsyncIterator[None]:
        """This ring's slot for others while it waits to retry: one user's rings the
        notifier keeps answering "retry" (a push service throttling a device, for up to an
        hour) held every slot, their backoffs included, and no other ring was claimed."""
        self._capacity.release()
        try:
            yield
        finally:
            # Taken back even if cancelled meanwhile: the `async with` holding the slot
            # releases it on the way out, and must not release one it does not hold.
            await asyncio.shield(self._capacity.acquire())

    async def _hand_off(self, row: Reminder, shift: Shift) -> Answer | None:
        """The notifier's final answer; RETRYABLE when the claim was taken while retrying;
        None when the shift ended before a final answer. A renewal that storage did not
        confirm (an error, or WriteNotLanded) raises: the claim may still be ours, so the
        ring is not given up but let go and claimed again, under the same key."""
        assert row.claim is not None
        due = row.claim.due
        key = dispatch.idempotency_key(row)
        backoff = _Backoff(0.5, 30.0)
        first_sent = self._clock.now()
        # Checked before every hand-off, as before every checkpoint: a dispatcher paused
        # past its lease hands nothing off for a part it lost, nor does one stopping.
        while shift.on():
            # Each attempt's expiry counts from the attempt: a ring held back by a notifier
            # outage is late (the misfire policy's business), never expired by it.
            ring = Ring(
                key=key,
                user_id=row.user_id,
                text=row.text,
                due=due,
                expires=self._clock.now() + self._settings.ring_expiry,
                first_sent=first_sent,
            )
            answer = await self._batcher.send(ring, shift)
            if answer.outcome is not Outcome.RETRYABLE:
                return answer
            if not shift.on():
                return None  # not sent, or answered "retry" after the shift ended
            self._metrics.notifier_errors.inc()
            async with self._slot_given_up():
                if not await self._pause_to_retry(shift, backoff.next()):
                    return None
            # To its end even if cancelled: the release that follows a cancel must not
            # race it on the partition, nor be overtaken by it (the claim standing again
            # for a whole lease against the part's next owner).
            renewal = self._set_claim_expiry(row, self._clock.now() + self._settings.claim_lease)
            if not await to_the_end(renewal):
                # The claim is gone (read so, not merely unconfirmed): the user took over
                # (edit, pause, delete); stop, the row is theirs now. The notifier's key
                # dedupes a re-send.
                self._metrics.claims_lost.inc()
                return Answer(Outcome.RETRYABLE, "claim lost while retrying")
        return None

    async def _pause_to_retry(self, shift: Shift, delay_s: float) -> bool:
        """`delay_s` of backoff, cut short once a notifier that could not be reached when it
        began is connected again: the rings claimed before the outage go first when it is
        over, not up to a backoff's 30 s after the rings due since. True while the shift is
        on."""
        if not self._batcher.connection_failing():
            return await shift.sleep(delay_s)
        until = time.monotonic() + delay_s
        while shift.on() and (left_s := until - time.monotonic()) > 0:
            if await self._batcher.until_connected(min(left_s, LOOK_EVERY_S)):
                break
        return shift.on()

    def _missed(self, stored: StoredReminder | None, now: datetime, found_at: datetime) -> bool:
        """Under skip_missed, whether the ring a claim would hand off was older than the
        misfire grace when its entry was found: a ring found in time is not missed however
        long a busy minute keeps it waiting for its turn."""
        if self._settings.misfire_policy is not MisfirePolicy.SKIP_MISSED or stored is None:
            return False
        late = found_at - dispatch.missed_due(stored.reminder, now)
        return late > self._settings.misfire_grace

    async def _skip_missed(
        self, stored: StoredReminder, now: datetime, shift: Shift
    ) -> bool | None:
        """Re-arm (or end) a ring found missed without handing it off: its claim and its
        finalize in one LWT, so no claim is left standing that a crash or a storage error
        would leave to a takeover, which hands it off. True once it landed; None when a
        user's change landed first; False when the shift ended first."""
        row = stored.reminder
        passed = dispatch.claimed(row, uuid.uuid4(), now, self._settings.claim_lease)
        after = dispatch.finalized(passed, now)
        async with self._users.hold(row.user_id):
            if not shift.on():
                return False
            landed = await self._store.replace(stored, after, now)
        if not landed:
            self._metrics.claims_lost.inc()
            return None
        await self._entry_again_if_its_minute_closed(after, now)
        self._metrics.skips.labels(dispatch.SkipReason.MISSED.value).inc()
        # After the row: a crash in between loses this record, never the skip.
        await self._record(self._delivery(passed, now, None, _MISSED, None), keep_earlier=True)
        # A purge since the skip landed removed the history before this record: it would
        # outlive the purge. Its row delete landed before that removal, so this read sees it.
        if await self._store.get(row.user_id, row.reminder_id) is None:
            await self._forget(passed)
        return True

    async def _finish(
        self,
        claimed_row: Reminder,
        answer: Answer,
        claimed_at: datetime,
        shift: Shift,
        first: bool,
    ) -> bool:
        assert claimed_row.claim is not None
        now = self._clock.now()
        lateness = now - claimed_row.claim.due
        self._metrics.handoff_lateness.observe(max(0.0, lateness.total_seconds()))
        self._metrics.rings.labels(answer.outcome.value).inc()
        delivery = self._delivery(claimed_row, claimed_at, now, answer, lateness)
        await self._record(delivery, keep_earlier=not first)
        return await self._finalize(claimed_row, shift)

    async def _record(self, delivery: Delivery, *, keep_earlier: bool) -> None:
        """The ring's history, retried until it lands (either form writes the same again):
        failing, it failed the ring after its hand-off, which was then let go, handed off
        again, and recorded as the notifier's "duplicate"; or, after a skip or a claim
        lost, never recorded, the ring tried again finding nothing to do. A conditional
        record (`keep_earlier`) takes the user's turn, as every LWT of one partition does
        here (ballots on one partition contend)."""

        async def write() -> None:
            if not keep_earlier:
                await self._history.record(delivery, written_at=self._clock.now())
                return
            async with self._users.hold(delivery.user_id):
                await self._history.record(
                    delivery, written_at=self._clock.now(), keep_earlier=True
                )

        await self._until_done(write, f"recording reminder {delivery.reminder_id}'s ring")

    async def _finalize(self, claimed_row: Reminder, shift: Shift) -> bool:
        """Finalize by LWT until it lands or the claim is gone (the user's change wins):
        True then. False only when the part's lease ended first: the minute must not be
        checkpointed past a claim still standing (DESIGN.md invariant 9).

        Each attempt reads the clock afresh: a new due (a snooze that landed meanwhile, now
        past) has its entry written into the minute of now, which must not be one whose
        final read the slow writes and retries before it have outlasted (invariant 3)."""
        assert claimed_row.claim is not None
        token = claimed_row.claim.token
        # First try against the row as this dispatcher claimed it (the usual case: nobody
        # touched it since); only a lost compare needs a SERIAL re-read.
        stored: StoredReminder | None = StoredReminder(claimed_row, None)
        backoff = _Backoff(0.02, 1.0)
        while True:
            if stored is None:
                self._metrics.claims_lost.inc()
                await self._forget(claimed_row)
                return True
            claim = stored.reminder.claim
            if claim is None or claim.token != token:
                self._metrics.claims_lost.inc()  # edited, paused or deleted: the user wins
                return True
            current = stored.reminder
            async with self._users.hold(current.user_id):
                now = self._clock.now()
                after = dispatch.finalized(current, now)
                landed = await self._store.replace(stored, after, now)
            if landed:
                await self._entry_again_if_its_minute_closed(after, now)
                return True
            # Lost to a change that left the claim standing (a snooze, a text edit): read it
            # and try again. A stop does not cut this short (the ring went out); the
            # shutdown grace does, by cancelling.
            await asyncio.sleep(backoff.next())
            stored = await self._store.get_serial(claimed_row.user_id, claimed_row.reminder_id)
            if stored is not None and not shift.lease.held():
                return False

    async def _entry_again_if_its_minute_closed(self, row: Reminder, began: datetime) -> None:
        """A finalize that landed after the final read of the minute its entry went into
        (for a due already past, the minute it began in) may have been read there still
        sending, and skipped as stale: with no entry in a minute still to be read, the ring
        would be lost. Its entry is then written again, into the minute of now (a spare
        entry is harmless: the row decides, and one claim lands). Statements are bounded far
        under G, so this takes a storage stall (architecture.md, refinement 31)."""
        if row.due is None:
            return
        closes_at = bucket_minute(row.due, began) + MINUTE + self._settings.grace
        if self._clock.now() < closes_at - self._settings.skew:
            return
        self._metrics.entries_rewritten.inc()
        # The row has landed, and without this entry nothing would read it again.
        await self._until_done(
            lambda: self._store.write_bucket_entry(row, self._clock.now()),
            f"writing reminder {row.reminder_id}'s entry again",
        )

    async def _until_done(self, write: Callable[[], Awaitable[None]], what: str) -> None:
        """`write` retried on storage errors until it lands (the shutdown grace cancels it):
        for a write that nothing would make again once this ring is over."""
        backoff = _Backoff(0.5, 10.0)
        while True:
            try:
                await write()
                return
            except STORAGE_ERRORS as error:
                log.warning("%s failed (%s); retrying", what, type(error).__name__)
                await asyncio.sleep(backoff.next())

    async def _forget(self, row: Reminder) -> None:
        """The row is gone while its ring was under way: an operator purged the user's data
        (a user's delete leaves a tombstone row). The purge removes the user's history
        after the rows; this ring's record, written before its row was found gone, may be
        later than that and is removed here, so none outlives the purge (refinement 29).
        Retried until done: the ring, tried again, would find no row and forget nothing."""
        assert row.claim is not None
        due = row.claim.due
        await self._until_done(
            lambda: self._history.forget(row.user_id, row.reminder_id, due),
            f"removing the record of purged reminder {row.reminder_id}'s ring",
        )

    async def _set_claim_expiry(self, row: Reminder, expires: datetime) -> bool:
        """Renew or release the claim while it is still this one, under the user's lock like
        every other LWT on the user's partition."""
        assert row.claim is not None
        async with self._users.hold(row.user_id):
            return await self._store.set_claim_expiry(
                row.user_id, row.reminder_id, row.claim.token, expires
            )

    async def _let_go(self, row: Reminder) -> None:
        """Release a claim not resolved: it expires now, so the ring is re-claimed at once
        (same due, same key) rather than after the claim lease."""
        try:
            await self._set_claim_expiry(row, self._clock.now())
        except STORAGE_ERRORS as error:
            log.warning(
                "letting a claim go failed (%s); it expires by itself", type(error).__name__
            )

    async def _let_go_if_landed(self, claim: asyncio.Future[bool], claimed: Reminder) -> None:
        try:
            landed = await claim
        except STORAGE_ERRORS:
            landed = True  # not known: let go by its token, a no-op if it did not land
        if landed:
            await self._let_go(claimed)

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
