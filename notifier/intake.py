"""Taking notifications in: validate, record the key, deliver, settle the key; one answer
each, given once the delivery ended.

"Accepted" means pushed (handed to the push service), not queued: a notifier that dies
with items in its queue has answered none of them, so their senders retry, and the keys
it held are taken over once stale (storage/keys.py). Attempts at one key in this process
share one delivery: the first is answered from it, the others as its repeats.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from notifier.delivery.queue import DeliveryQueue, QueueClosed, QueuedNotification
from notifier.domain.model import (
    EXPIRED_REASON,
    HELD_ELSEWHERE_REASON,
    HandBack,
    ItemResult,
    Notification,
    Outcome,
    Priority,
    Settlement,
    delivery_result,
    rejection,
)
from notifier.metrics import NotifierMetrics
from notifier.storage.keys import KeyHold, KeyNotRecorded, KeyState, KeyStore
from reminders_svc.storage.errors import STORAGE_ERRORS

log = logging.getLogger(__name__)

# A settlement (or release) write that failed is sent again this many times in all,
# after 0.25 s, then 0.5 s: a blip of storage must not leave a pushed key unsettled.
_SETTLE_ATTEMPTS = 3
_SETTLE_BACKOFF_S = 0.25

# The answer for a key another user's item was recorded under.
OTHER_USER_REASON = "idempotency_key already used for another user"
# The answer for an item whose delivery goes on past the caller's deadline.
STILL_DELIVERING_REASON = "still being delivered; send again"

# Storage cannot take the key now; the caller retries with the same key.
_RETRYABLE_ERRORS: tuple[type[Exception], ...] = (*STORAGE_ERRORS, KeyNotRecorded)


def _unexpected(notification: Notification, error: BaseException) -> ItemResult:
    if not isinstance(error, Exception):
        raise error  # cancelled: the call itself is going away
    log.error(
        "item %s failed unexpectedly",
        notification.idempotency_key,
        exc_info=(type(error), error, error.__traceback__),
    )
    return ItemResult(notification.idempotency_key, Outcome.RETRYABLE, "internal error")


def _answered(notification: Notification, answer: asyncio.Future[ItemResult]) -> ItemResult:
    """What to answer for an item now: its result, or "retry" while it is delivered (what
    it ends as reaches the sender's retry instead)."""
    if not answer.done():
        return ItemResult(notification.idempotency_key, Outcome.RETRYABLE, STILL_DELIVERING_REASON)
    error = answer.exception()
    return answer.result() if error is None else _unexpected(notification, error)


def _unavailable(key: str, doing: str, error: Exception) -> ItemResult:
    log.warning("%s %s failed: %s", doing, key, type(error).__name__)
    return ItemResult(key, Outcome.RETRYABLE, f"storage unavailable ({type(error).__name__})")


@dataclass(frozen=True)
class _Running:
    """A key's delivery running in this process, and the user it is for."""

    user_id: str
    task: asyncio.Task[ItemResult]


@dataclass(frozen=True)
class IntakeLimits:
    """Bounds of one process, each per priority, so that a bulk sender never uses up
    what urgent items need."""

    # Keys being recorded at once, over all calls.
    recording_slots: int
    # Deliveries under way at once (recording, queued, pushing, waiting for a retry);
    # past it a new item is answered "retry" (overloaded) with nothing recorded, so a
    # sender faster than the pushes meets backpressure instead of an ever longer queue.
    max_pending: int


class Intake:
    def __init__(
        self,
        keys: KeyStore,
        queue: DeliveryQueue,
        metrics: NotifierMetrics,
        limits: IntakeLimits,
        clock: Callable[[], datetime],
    ) -> None:
        self._keys = keys
        self._queue = queue
        self._metrics = metrics
        # Shared by all calls (the bound holds for the process, not per batch).
        self._slots = {priority: asyncio.Semaphore(limits.recording_slots) for priority in Priority}
        self._max_pending = limits.max_pending
        self._pending = dict.fromkeys(Priority, 0)
        self._clock = clock
        # key -> the delivery of that key running here, answered by its first attempt.
        self._running: dict[str, _Running] = {}

    async def accept_batch(
        self, notifications: Sequence[Notification], answer_within_s: float | None = None
    ) -> list[ItemResult]:
        """One result per item, in request order, within `answer_within_s` (the caller's
        deadline, less the reply's way back). An item still being delivered then (pushes
        the push service throttles, retried with backoff) is answered "retry" on its own
        and its delivery goes on (the sender's retry joins it, or reads its settled key):
        one slow item must not hold its batch's answers past the caller's deadline, which
        would have every item retried though pushed. An item that fails unexpectedly is
        answered "retry" on its own too."""
        answers = [asyncio.ensure_future(self.accept(n)) for n in notifications]
        try:
            await asyncio.wait(answers, timeout=answer_within_s)
        except asyncio.CancelledError:
            for answer in answers:
                answer.cancel()  # the call is gone; the deliveries go on (their own tasks)
            raise
        results = [_answered(n, a) for n, a in zip(notifications, answers, strict=True)]
        for answer in answers:
            # Answered already: waiting on would keep a task per retry of a slow key (a
            # sender retrying it every few seconds for as long as its delivery lasts).
            # The deliveries go on: each is its own task, started before any await.
            answer.cancel()
        for result in results:
            self.count(result)
        return results

    async def accept(self, notification: Notification) -> ItemResult:
        """The answer for one item (not counted: `accept_batch` counts what it answers)."""
        rejected = rejection(notification)
        running_here = notification.idempotency_key in self._running
        if rejected is not None:
            result = rejected
        elif running_here:
            # A repeat of a key being delivered is answered as that delivery's repeat, even
            # once expired: the key is not refused, it is already under way.
            result = await self._delivery_of(notification)
        elif notification.expired_at(self._clock()):
            result = await self._expired(notification)
        elif self._pending[notification.priority] >= self._max_pending:
            result = self._overloaded(notification)
        else:
            result = await self._delivery_of(notification)
        return result

    def count(self, result: ItemResult) -> None:
        """Count an answer: every one this intake gives, and those given without it (an
        item the server could not read)."""
        self._metrics.items.labels(result.outcome.value).inc()

    async def _delivery_of(self, notification: Notification) -> ItemResult:
        """The answer of the key's delivery in this process, started here unless an
        earlier attempt at the key runs it (then this one is its repeat)."""
        key = notification.idempotency_key
        priority = notification.priority
        running = self._running.get(key)
        if running is not None and running.user_id != notification.user_id:
            return ItemResult(key, Outcome.REJECTED, OTHER_USER_REASON)
        first = running is None
        if running is None:
            # Its own task: a caller that gives up (deadline, disconnect) does not cut a
            # delivery short, and the key is settled whoever is still waiting.
            task = asyncio.create_task(self._delivered(notification), name=f"deliver {key}")
            running = self._running[key] = _Running(notification.user_id, task)
            self._pending[priority] += 1

            def ended(_: asyncio.Task[ItemResult]) -> None:
                self._running.pop(key, None)
                self._pending[priority] -= 1

            task.add_done_callback(ended)
        result = await asyncio.shield(running.task)
        if first:
            return result
        if result.outcome is Outcome.ACCEPTED:
            return ItemResult(key, Outcome.DUPLICATE)
        if result == ItemResult(key, Outcome.REJECTED, EXPIRED_REASON) and not (
            notification.expired_at(self._clock())
        ):
            # The delivery it joined expired in the queue; this attempt has not: the key
            # was released for it (HandBack.EXPIRED), so its retry is pushed.
            return delivery_result(key, HandBack.EXPIRED, first=False)
        return result

    def _overloaded(self, notification: Notification) -> ItemResult:
        priority = notification.priority
        self._metrics.overloaded.labels(priority.value).inc()
        return ItemResult(
            notification.idempotency_key,
            Outcome.RETRYABLE,
            f"overloaded: {self._pending[priority]} {priority.value} deliveries under way",
        )

    async def _expired(self, notification: Notification) -> ItemResult:
        """Too late to push; but a retry of a key an earlier attempt delivered is answered
        as its repeat, not "rejected" (the sender would record a ring that happened as
        refused), and one another attempt is still delivering is answered "retry" (that
        attempt may yet push it)."""
        key = notification.idempotency_key
        try:
            async with self._slots[notification.priority]:  # a SERIAL read: bounded too
                found = await self._keys.look(key, notification.user_id)
        except STORAGE_ERRORS as error:
            return _unavailable(key, "reading", error)
        if found is None:
            return ItemResult(key, Outcome.REJECTED, EXPIRED_REASON)
        if found.state is KeyState.OTHER_USER:
            return ItemResult(key, Outcome.REJECTED, OTHER_USER_REASON)
        if found.settled_as is None:  # HELD_ELSEWHERE
            return ItemResult(key, Outcome.RETRYABLE, HELD_ELSEWHERE_REASON)
        return delivery_result(key, found.settled_as, first=False)

    async def drained(self) -> None:
        """Every delivery taken in has been answered (the workers must be stopping or
        running, so that each ends)."""
        await asyncio.gather(*(r.task for r in self._running.values()), return_exceptions=True)

    async def _delivered(self, notification: Notification) -> ItemResult:
        """`_deliver`'s answer, an unexpected error included (logged here, once): its
        attempts may all have stopped waiting for it."""
        try:
            return await self._deliver(notification)
        except Exception as error:
            return _unexpected(notification, error)

    async def _deliver(self, notification: Notification) -> ItemResult:
        key = notification.idempotency_key
        async with self._slots[notification.priority]:
            if self._queue.closed:
                # Stopping: an item waiting for a slot records no key, which the process
                # might exit before releasing (another notifier would wait out its hold).
                return delivery_result(key, HandBack.STOPPING, first=True)
            # At or before the hold's accepted_at is written: its age is never underestimated.
            recording_since = time.monotonic()
            try:
                claim = await self._keys.record(notification)
            except _RETRYABLE_ERRORS as error:
                return _unavailable(key, "recording", error)
        if claim.state is KeyState.SETTLED:
            assert claim.settled_as is not None  # SETTLED: how it was
            return delivery_result(key, claim.settled_as, first=False)
        if claim.state is KeyState.OTHER_USER:
            return ItemResult(key, Outcome.REJECTED, OTHER_USER_REASON)
        if claim.state is KeyState.HELD_ELSEWHERE:
            return ItemResult(key, Outcome.RETRYABLE, HELD_ELSEWHERE_REASON)
        holder = claim.accept_id
        assert holder is not None  # RECORDED: this attempt's own id
        if claim.taken_over:
            self._metrics.key_takeovers.inc()
            log.warning("took over %s from an attempt that never settled it", key)
        hold = KeyHold(holder, recording_since if claim.fresh else None)
        ended: asyncio.Future[Settlement | HandBack] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put(QueuedNotification(notification, ended, hold))
        except QueueClosed:
            # Recorded as the workers stopped (a call past the server's grace): handed
            # back, so its key is released now rather than taken over once stale.
            ended.set_result(HandBack.STOPPING)
        end = await ended
        await self._settle(notification, hold, end)
        return delivery_result(key, end, first=True)

    async def _settle(
        self, notification: Notification, hold: KeyHold, end: Settlement | HandBack
    ) -> None:
        key = notification.idempotency_key
        if end is HandBack.KEY_TAKEN_OVER:
            return  # the key is another attempt's now: neither settled nor released here
        for attempt in range(_SETTLE_ATTEMPTS):
            try:
                if isinstance(end, HandBack):
                    await self._keys.release(key, hold.accept_id)
                else:
                    await self._keys.settle(key, notification.user_id, end)
                return
            except STORAGE_ERRORS as error:
                # Both writes are safe to send again (a release applies to its own hold
                # only). Still unsettled at the end, the key is answered from memory here
                # and taken over elsewhere once stale: at worst a second push of it.
                log.warning("settling %s failed: %s", key, type(error).__name__)
            except Exception:
                # Not storage's unavailability (a grant revoked, a bug): the answer stands,
                # or a push made would be answered "retry" and, its key unsettled, pushed
                # again by whichever replica the retry reached once the hold went stale.
                log.exception("settling %s failed", key)
                return
            if attempt + 1 < _SETTLE_ATTEMPTS:
                await asyncio.sleep(_SETTLE_BACKOFF_S * 2**attempt)
