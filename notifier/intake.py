"""Taking notifications in: validate, record the key, queue for delivery; one answer each."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from notifier.delivery.queue import DeliveryQueue, QueuedNotification
from notifier.domain.model import ItemResult, Notification, Outcome, rejection
from notifier.metrics import NotifierMetrics
from notifier.storage.keys import KeyNotRecorded, KeyRecord, KeyStore
from reminders_svc.storage.errors import STORAGE_ERRORS

log = logging.getLogger(__name__)

# Storage cannot take the key now; the caller retries with the same key.
_RETRYABLE_ERRORS: tuple[type[Exception], ...] = (*STORAGE_ERRORS, KeyNotRecorded)


class Intake:
    def __init__(
        self,
        keys: KeyStore,
        queue: DeliveryQueue,
        metrics: NotifierMetrics,
        concurrency: int,
        clock: Callable[[], datetime],
    ) -> None:
        self._keys = keys
        self._queue = queue
        self._metrics = metrics
        # Shared by all calls: the bound holds for the process, not per batch.
        self._slots = asyncio.Semaphore(concurrency)
        self._clock = clock

    async def accept_batch(self, notifications: Sequence[Notification]) -> list[ItemResult]:
        """One result per item, in request order."""
        return list(await asyncio.gather(*(self.accept(n) for n in notifications)))

    async def accept(self, notification: Notification) -> ItemResult:
        async with self._slots:
            result = await self._answer(notification)
        self._metrics.items.labels(result.outcome.value).inc()
        return result

    async def _answer(self, notification: Notification) -> ItemResult:
        rejected = rejection(notification, self._clock())
        if rejected is not None:
            return rejected
        key = notification.idempotency_key
        try:
            record = await self._keys.record(notification)
        except _RETRYABLE_ERRORS as error:
            log.warning("recording %s failed: %s", key, type(error).__name__)
            return ItemResult(
                key, Outcome.RETRYABLE, f"storage unavailable ({type(error).__name__})"
            )
        if record is KeyRecord.ALREADY_RECORDED:
            return ItemResult(key, Outcome.DUPLICATE)
        self._queue.put(QueuedNotification(notification))
        return ItemResult(key, Outcome.ACCEPTED)
