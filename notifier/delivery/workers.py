"""Push workers: take recorded notifications in priority order and fan each out to the
user's devices through the push adapter, retrying with backoff what asks for a retry.
Each item's `ended` future is resolved once its delivery ended (or handed back
undelivered: a stop past its grace, push retries used up, its key taken over, a bug),
and never before."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from notifier.delivery.queue import DeliveryQueue, QueuedNotification
from notifier.domain.model import Device, HandBack, Notification, Settlement, implicit_device
from notifier.domain.push import PushAdapter, PushResult, push_message
from notifier.metrics import NotifierMetrics, Undeliverable
from notifier.storage.devices import DeviceStore
from notifier.storage.keys import KeyStore
from reminders_svc.concurrency import backoff_s
from reminders_svc.storage.errors import STORAGE_ERRORS

log = logging.getLogger(__name__)

# A lookup (or a hold's refresh) that failed for storage is tried again at least this
# often, so deliveries resume within seconds of the database coming back.
MAX_STORAGE_RETRY_DELAY_S = 5.0


@dataclass(frozen=True)
class DeliveryPolicy:
    workers: int
    max_attempts: int
    retry_backoff: timedelta
    # Users without devices get "auto:<user_id>" (development and tests only).
    auto_device: bool
    # Fault injection (tests): SIGKILL this process as its first push is about to go out.
    crash_before_push: bool = False
    # How long after its due a notification no device took (every push asked for a
    # retry, attempt after attempt) is still handed back for its sender to send again;
    # past it, it is given up (rejected). Senders set a fresh expiry on each attempt, so
    # that alone would hand it back for ever.
    give_up_after: timedelta = timedelta(hours=1)
    # One push to one device: an adapter that does not answer (a dead HTTP/2 stream)
    # is abandoned past this and the push counted a retry.
    push_timeout: timedelta = timedelta(seconds=10)


class PushWorkers:
    def __init__(
        self,
        queue: DeliveryQueue,
        adapter: PushAdapter,
        devices: DeviceStore,
        keys: KeyStore,
        policy: DeliveryPolicy,
        metrics: NotifierMetrics,
        clock: Callable[[], datetime],
    ) -> None:
        self._queue = queue
        self._adapter = adapter
        self._devices = devices
        self._keys = keys
        self._policy = policy
        self._metrics = metrics
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._work(), name=f"push-worker-{number}")
            for number in range(self._policy.workers)
        ]

    async def stop(self, grace_s: float) -> None:
        """Let the queue drain within the grace, then stop; what is left, and what an
        accepting call puts after that, is handed back undelivered (its callers are
        answered "retry", its keys released)."""
        try:
            await asyncio.wait_for(self._queue.drained(), timeout=grace_s)
        except TimeoutError:
            log.error("shutdown grace over with notifications still queued")
        # Closed before the workers go: an item put from here on, which no worker would
        # take, is refused at once instead of waiting for ever in the queue.
        left = self._queue.close()
        if left:
            log.error("%d queued notifications handed back undelivered", len(left))
        for item in left:
            self._end(item, HandBack.STOPPING)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                await self._deliver(item)
            except Exception:
                # A bug must not kill the worker; the key is in the message, texts are not.
                log.exception("delivering %s failed", item.notification.idempotency_key)
                self._end(item, HandBack.ERROR)
            except BaseException:
                self._end(item, HandBack.STOPPING)  # cancelled mid-push
                raise
            finally:
                self._queue.done()

    async def _deliver(self, item: QueuedNotification) -> None:
        notification = item.notification
        # The hold first: an item whose key another attempt took over must settle nothing
        # (not even expired, or no device), the key's settlement being that attempt's.
        held = await self._still_held(item)
        if held is None:
            return
        item = held
        if self._expired(item):
            return
        devices = item.devices
        if devices is None:
            try:
                devices = await self._devices_of(notification.user_id)
            except STORAGE_ERRORS as error:
                log.warning("device lookup failed (%s); retrying", type(error).__name__)
                self._retry_for_storage(item)
                return
        if not devices:
            self._no_device(item)
            return
        # Again: a slow lookup (storage under load, up to a request timeout) must not carry
        # it past its expiry, nor its hold so near the takeover bound that another replica
        # takes the key over while this one pushes (settings keep a push under half of it).
        if self._expired(item):
            return
        held = await self._still_held(item)
        if held is None:
            return
        item = held
        if self._policy.crash_before_push:
            log.warning("fault crash_before_push: killing this process")
            os.kill(os.getpid(), signal.SIGKILL)
        reached_now: list[Device] = []

        async def push(device: Device) -> PushResult:
            result = await self._push(notification, device)
            if result is PushResult.OK:
                reached_now.append(device)
            return result

        try:
            results = await asyncio.gather(*(push(d) for d in devices))
        except BaseException:
            # Cut off mid-round (a stop past its grace, a bug) after a device took it:
            # delivered, not handed back to be pushed to that device again.
            if reached_now:
                self._end(item, Settlement.PUSHED)
            raise
        again = tuple(
            device
            for device, result in zip(devices, results, strict=True)
            if result is PushResult.RETRY
        )
        reached = item.reached or PushResult.OK in results
        refused = item.refused or PushResult.REFUSED in results
        if again:
            self._retry(dataclasses.replace(item, reached=reached, refused=refused), again)
        elif not reached and refused:
            # Refused for good where it was not gone: no retry can carry it.
            self._metrics.count_undeliverable(Undeliverable.REFUSED)
            log.warning(
                "giving up on %s: the push service refused it", item.notification.idempotency_key
            )
            self._end(item, Settlement.UNDELIVERABLE)
        elif not reached:  # every device gone (the app uninstalled everywhere)
            self._no_device(item)
        else:
            self._end(item, Settlement.PUSHED)

    def _no_device(self, item: QueuedNotification) -> None:
        """Accepted with nowhere to push it: nothing to retry."""
        self._metrics.count_undeliverable(Undeliverable.NO_DEVICE)
        log.info("no device for %s", item.notification.idempotency_key)
        self._end(item, Settlement.NO_DEVICE)

    def _expired(self, item: QueuedNotification) -> bool:
        """Ends the item if its expiry has passed (never pushed late): handed back, its key
        released, so the sender's next attempt (with an expiry of its own) pushes it; as
        pushed if an earlier attempt reached one of the user's devices (the ring went out:
        its sender must not record a refusal)."""
        notification = item.notification
        if not notification.expired_at(self._clock()):
            return False
        if not item.reached:
            self._metrics.expired_in_queue.labels(notification.priority.value).inc()
        self._end(item, HandBack.EXPIRED)  # pushed, if it reached a device (`_end`)
        return True

    async def _still_held(self, item: QueuedNotification) -> QueuedNotification | None:
        """The item to push now, its hold on the key refreshed if it grew old waiting (a
        long queue, lookups retried through a storage blip), so that no other attempt
        takes the key over and pushes it too. None: not to be pushed now, either because
        the key was taken over meanwhile (the item ends here; the other attempt pushes it)
        or because storage did not answer (tried again later). Recent holds, a normal
        ring's, pay nothing."""
        if not self._keys.refresh_due(item.hold):
            return item
        key = item.notification.idempotency_key
        try:
            refreshed = await self._keys.refresh(key, item.hold)
        except STORAGE_ERRORS as error:
            log.warning(
                "refreshing the hold on %s failed (%s); retrying", key, type(error).__name__
            )
            self._retry_for_storage(item)
            return None
        if refreshed is None:
            log.warning("%s was taken over while it waited; not pushed here", key)
            self._end(item, HandBack.KEY_TAKEN_OVER)
            return None
        return dataclasses.replace(item, hold=refreshed)

    async def _devices_of(self, user_id: str) -> tuple[Device, ...]:
        registered = await self._devices.list(user_id)
        if not registered and self._policy.auto_device:
            return (implicit_device(user_id),)
        return registered

    async def _push(self, notification: Notification, device: Device) -> PushResult:
        try:
            result = await asyncio.wait_for(
                self._adapter.push(push_message(notification, device)),
                self._policy.push_timeout.total_seconds(),
            )
        except TimeoutError:
            log.warning(
                "push adapter %s did not answer within %s; retrying",
                self._adapter.name,
                self._policy.push_timeout,
            )
            result = PushResult.RETRY
        except Exception:
            log.exception("push adapter %s failed; retrying", self._adapter.name)
            result = PushResult.RETRY
        self._metrics.count_push(self._adapter.name, result)
        if result is PushResult.OK and notification.due_time is not None:
            # Clamped: the dispatcher hands off by the database's clock, and this host's
            # may be a little behind it; a negative observation would corrupt the sum.
            lateness = max(0.0, (self._clock() - notification.due_time).total_seconds())
            self._metrics.push_lateness.labels(notification.priority.value).observe(lateness)
        if result is PushResult.DEVICE_GONE and not device.is_implicit:
            try:
                await self._devices.forget_listed(notification.user_id, device)
            except STORAGE_ERRORS as error:
                log.warning("could not forget a gone device (%s)", type(error).__name__)
        return result

    def _retry(self, item: QueuedNotification, devices: tuple[Device, ...]) -> None:
        """Push again to `devices` after a backoff. Once the attempts are used up:
        - pushed to one of the user's devices at least: delivered (the ring reached them);
        - else, within `give_up_after` of its due or of its first hand-off (the later; a
          ring handed off in a catch-up is long past its due), handed back rather than
          given up, so a
          push service throttling or failing for a few seconds does not lose a ring: its
          caller is answered "retry" and sends it again later under the same key;
        - else given up: rejected, and its key settled so."""
        key = item.notification.idempotency_key
        if item.attempt < self._policy.max_attempts:
            again = dataclasses.replace(item, attempt=item.attempt + 1, devices=devices)
            self._queue.put_after(again, self._backoff(item.attempt))
        elif item.reached:
            self._end(item, Settlement.PUSHED)
        elif self._expired(item):
            return
        elif self._within_hand_back(item.notification):
            log.warning("handing %s back after %d push attempts asked to retry", key, item.attempt)
            self._end(item, HandBack.PUSH_RETRIES_EXHAUSTED)
        else:
            self._metrics.count_undeliverable(Undeliverable.ATTEMPTS_EXHAUSTED)
            log.warning("giving up on %s: no device took it since its due", key)
            self._end(item, Settlement.UNDELIVERABLE)

    def _within_hand_back(self, notification: Notification) -> bool:
        since = notification.retry_since()
        return since is not None and self._clock() - since < self._policy.give_up_after

    def _retry_for_storage(self, item: QueuedNotification) -> None:
        """Storage did not answer: an outage, not a failed push. Try again for as long as
        it lasts (the item's expiry bounds that) without using up its push attempts: an
        accepted notification must not be lost to an outage of a few seconds."""
        failures = item.storage_failures + 1
        again = dataclasses.replace(item, storage_failures=failures)
        self._queue.put_after(again, self._backoff(failures, MAX_STORAGE_RETRY_DELAY_S))

    def _backoff(self, retry: int, cap_s: float = math.inf) -> float:
        """Seconds before the `retry`th retry, from the policy's first backoff."""
        return backoff_s(self._policy.retry_backoff.total_seconds(), retry, cap_s)

    def _end(self, item: QueuedNotification, end: Settlement | HandBack) -> None:
        """End the item's delivery, once; a HandBack hands it back undelivered (its caller
        is answered "retry"), whether it was queued or mid-push. An item that reached one
        of the user's devices is delivered, however its delivery ends (expired, stopping,
        an error: handed back, its key released, the sender's retry would push it to
        every device again), unless another attempt took its key over."""
        if item.ended.done():
            return
        if item.reached and end is not HandBack.KEY_TAKEN_OVER:
            end = Settlement.PUSHED
        item.ended.set_result(end)
        if isinstance(end, HandBack):
            self._metrics.handed_back.labels(end.value).inc()
