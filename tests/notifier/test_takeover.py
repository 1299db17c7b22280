"""Keys whose holder went away undelivered, on the real node through real notifiers: a
holder that died mid-delivery (its row left unsettled) and a notifier stopping with items
it could not deliver. Either way the key is delivered once, by whichever replica the
sender's retry reaches. And a live holder whose item waits long: it refreshes its hold
before pushing, and does not push a key another replica took over meanwhile."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
from cassandra.cluster import Session
from prometheus_client import CollectorRegistry

from genproto.notification.v1 import notification_pb2 as pb
from notifier.delivery.adapters import RecordingPushAdapter
from notifier.delivery.queue import DeliveryQueue
from notifier.delivery.workers import DeliveryPolicy, PushWorkers
from notifier.domain.model import Device, ItemResult, Notification, Outcome, Priority
from notifier.intake import Intake, IntakeLimits
from notifier.metrics import NotifierMetrics
from notifier.settings import NotifierSettings
from notifier.storage.devices import DeviceStore
from notifier.storage.keys import KeyClaim, KeyState, KeyStore
from reminders_svc.storage.session import connect
from tests.notifier.conftest import (
    ACCEPTED,
    DUPLICATE,
    RETRYABLE,
    HoldableRecordingAdapter,
    item,
    key_rows,
    leave_unsettled_key,
    one_worker_held,
    reminder_key,
    running_notifier,
)

TAKEOVERS = ("notifier_key_takeovers_total", frozenset[tuple[str, str]]())
HANDED_BACK = ("notifier_handed_back_total", frozenset({("reason", "stopping")}))


def test_a_key_a_dead_holder_left_unsettled_is_retryable_then_taken_over_and_pushed_once(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """What a notifier killed between recording a key and pushing it leaves behind: the
    key's row, unsettled. Within the takeover bound the holder might still push, so a
    retry is told to retry; past it, the retry takes the key over and pushes it."""
    # Ample for one connect, one write and one call on a loaded machine (at 2 s, counted
    # from before the notifier started, its startup could use the bound up).
    takeover_after = timedelta(seconds=5)
    settings = dataclasses.replace(notifier_settings, key_takeover_after=takeover_after)
    message = item(user)
    with running_notifier(settings) as notifier:
        # Left behind just now: the bound runs from here, the notifier already serving.
        accepted_at = leave_unsettled_key(settings, message.idempotency_key, user)
        [held] = notifier.send_batch(message)
        assert (held.outcome, held.reason) == (
            RETRYABLE,
            "another attempt is delivering this key",
        )
        assert notifier.delivered(key=message.idempotency_key) == []

        # Until the bound has passed since the row's accepted_at, as the notifier counts it.
        time.sleep(max(0.0, (accepted_at + takeover_after - datetime.now(UTC)).total_seconds()))
        time.sleep(0.1)
        [taken] = notifier.send_batch(message)
        assert taken.outcome == ACCEPTED
        assert notifier.metrics()[TAKEOVERS] == 1
        [again] = notifier.send_batch(message)
        assert again.outcome == DUPLICATE
        assert len(notifier.delivered(key=message.idempotency_key)) == 1


def test_a_notifier_stopping_hands_back_what_it_could_not_push_and_another_pushes_it_at_once(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Stopped with one item in a push that hangs and one queued, past its grace: neither
    is answered ACCEPTED, both count as handed back, and both keys are released, so
    another replica (with the default one-minute takeover bound) accepts and pushes them
    at once."""
    stopping = dataclasses.replace(
        notifier_settings, push_workers=1, shutdown_grace=timedelta(seconds=1)
    )
    hanging = HoldableRecordingAdapter(held=True)
    in_push, queued = item(user), item(user)
    with ThreadPoolExecutor(2) as callers:
        with running_notifier(stopping, hanging) as first:
            answers = [callers.submit(first.send_batch, in_push)]
            assert hanging.push_waiting.wait(10)
            answers.append(callers.submit(first.send_batch, queued))
            first.wait_queued(1)
        outcomes = [answered(a) for a in answers]
    hanging.release()
    assert first.metrics_after_stop()[HANDED_BACK] == 2
    # Cut off by the stop (the same to a sender) or answered "retry": never accepted.
    assert set(outcomes) <= {"CANCELLED", "UNAVAILABLE", "RETRYABLE"}
    assert hanging.delivered(user, "") == []

    with running_notifier(notifier_settings) as second:
        started = time.monotonic()
        results = second.send_batch(in_push, queued)
        assert [r.outcome for r in results] == [ACCEPTED, ACCEPTED]
        # Released: no takeover bound (a minute here) waited out, nor half of one.
        waited_out = notifier_settings.key_takeover_after.total_seconds()
        assert time.monotonic() - started < waited_out / 2
        assert sorted(p.idempotency_key for p in second.wait_delivered(2, user)) == sorted(
            [in_push.idempotency_key, queued.idempotency_key]
        )
        assert second.metrics()[TAKEOVERS] == 0


def test_an_item_waiting_past_half_the_takeover_bound_refreshes_its_hold_before_its_push(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """An item queued behind others (a busy minute, a stalled push) longer than half the
    takeover bound refreshes its hold just before its push, so that no other replica
    takes the key over from a live holder and pushes it too. An item pushed at once
    writes nothing more."""
    takeover_after = timedelta(seconds=4)
    settings = dataclasses.replace(notifier_settings, key_takeover_after=takeover_after)
    waiting = item(user)
    with one_worker_held(settings, user) as held:
        answer = held.send_queued(waiting)
        time.sleep(takeover_after.total_seconds() / 2 + 0.5)
        held.adapter.release()
        [result] = answer.result(timeout=10)
        assert result.outcome == ACCEPTED
    pushed_at_once, waited = key_rows(
        settings,
        [f"bulk-0/{user}", waiting.idempotency_key],
        "writetime(user_id) AS recorded, writetime(accepted_at) AS held",
    )
    assert pushed_at_once.held == pushed_at_once.recorded
    refreshed_after_s = (waited.held - waited.recorded) / 1e6  # write times are in microseconds
    assert refreshed_after_s >= takeover_after.total_seconds() / 2


def _answer_in_process(
    settings: NotifierSettings,
    notification: Notification,
    *,
    keys_type: type[KeyStore] = KeyStore,
    devices_type: type[DeviceStore] = DeviceStore,
) -> ItemResult:
    """The answer to `notification` of a notifier run in this process (`_in_process`)."""

    async def scenario() -> ItemResult:
        with connect(settings.cassandra) as connection:
            _, workers, intake = _in_process(
                connection.session, settings, keys_type, devices_type=devices_type
            )
            workers.start()
            try:
                return await asyncio.wait_for(intake.accept(notification), timeout=30)
            finally:
                await workers.stop(grace_s=5)

    return asyncio.run(scenario())


class _SettleRefused(KeyStore):
    """A key store whose settle fails on an error not of storage's unavailability."""

    async def settle(self, *args: Any) -> None:
        raise RuntimeError("permission to write notification_keys revoked")


def test_a_push_whose_key_cannot_be_settled_for_another_reason_is_still_answered_accepted(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Pushed, then its settle failed on something other than storage being unavailable:
    it was answered "retry" (internal error), and the retry pushed it again elsewhere."""
    notification = Notification(reminder_key(), user, Priority.URGENT, "title", "body")

    answer = _answer_in_process(notifier_settings, notification, keys_type=_SettleRefused)
    assert answer.outcome is Outcome.ACCEPTED


class _SlowLookup(DeviceStore):
    """A device registry answering after 2.5 s (storage under load)."""

    async def list(self, user_id: str) -> tuple[Device, ...]:
        await asyncio.sleep(2.5)
        return await super().list(user_id)


def test_an_item_whose_device_lookup_outlasts_half_the_takeover_bound_refreshes_its_hold(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """The hold was checked before the lookup only: a lookup slow enough (a request
    timeout is 12 s) carried a push past the bound, where another replica could take the
    key over from this live holder and push it too."""
    takeover_after = timedelta(seconds=4)
    settings = dataclasses.replace(
        notifier_settings, key_takeover_after=takeover_after, push_timeout=timedelta(seconds=1)
    )
    notification = Notification(reminder_key(), user, Priority.URGENT, "title", "body")

    answer = _answer_in_process(settings, notification, devices_type=_SlowLookup)
    assert answer.outcome is Outcome.ACCEPTED
    [row] = key_rows(
        settings,
        [notification.idempotency_key],
        "writetime(user_id) AS recorded, writetime(accepted_at) AS held",
    )
    refreshed_after_s = (row.held - row.recorded) / 1e6  # write times are in microseconds
    assert refreshed_after_s >= takeover_after.total_seconds() / 2


def test_an_item_whose_key_another_replica_took_over_while_it_waited_is_not_pushed(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Replica A records an item and queues it behind a push that hangs; past the takeover
    bound, the sender's retry reaches replica B, which takes the key over and pushes it.
    When A's turn comes it finds its hold gone: it does not push (one push in all), leaves
    the key as B settled it, and answers "retry", whose retry hears the key was delivered
    (not "duplicate" at once: B might still have failed to push it)."""
    takeover_after = timedelta(seconds=2)
    settings = dataclasses.replace(notifier_settings, key_takeover_after=takeover_after)
    message = item(user)
    key = message.idempotency_key
    lost = ("notifier_handed_back_total", frozenset({("reason", "key_taken_over")}))
    with one_worker_held(settings, user) as replica_a, running_notifier(settings) as replica_b:
        answer_a = replica_a.send_queued(message)
        deadline = time.monotonic() + takeover_after.total_seconds() + 10
        while (taken := replica_b.send_batch(message)[0]).outcome == RETRYABLE:
            assert time.monotonic() < deadline, "never taken over"
            time.sleep(0.2)
        assert taken.outcome == ACCEPTED

        replica_a.adapter.release()
        [result] = answer_a.result(timeout=10)
        assert (result.outcome, result.reason) == (
            RETRYABLE,
            "another attempt is delivering this key",
        )
        assert replica_a.adapter.delivered(user, key) == []
        assert len(replica_b.delivered(key=key)) == 1
        assert replica_a.notifier.metrics()[lost] == 1
        [again] = replica_a.notifier.send_batch(message)
        assert again.outcome == DUPLICATE


def answered(answer: Future[list[pb.SendResult]]) -> str:
    """The outcome of a one-item call, or the status code that ended it."""
    try:
        [result] = answer.result(timeout=30)
    except grpc.RpcError as error:
        return str(error.code().name)
    return pb.SendResult.Outcome.Name(result.outcome).removeprefix("OUTCOME_")


Keys = TypeVar("Keys", bound=KeyStore)


def _in_process(
    session: Session,
    settings: NotifierSettings,
    keys_type: type[Keys],
    slots: int = 4,
    devices_type: type[DeviceStore] = DeviceStore,
) -> tuple[Keys, PushWorkers, Intake]:
    """A notifier's key store, push workers (recording, implicit devices) and intake,
    without its gRPC server; the workers not started."""
    cassandra = settings.cassandra

    def now() -> datetime:
        return datetime.now(UTC)

    keys = keys_type(session, cassandra.keyspace, settings.key_ttl, settings.key_takeover_after)
    queue = DeliveryQueue()
    metrics = NotifierMetrics(CollectorRegistry())
    workers = PushWorkers(
        queue,
        RecordingPushAdapter(capacity=100),
        devices_type(session, cassandra.keyspace),
        keys,
        DeliveryPolicy(2, 3, timedelta(seconds=0.05), auto_device=True),
        metrics,
        now,
    )
    return keys, workers, Intake(keys, queue, metrics, IntakeLimits(slots, 1000), now)


def test_an_item_recorded_after_the_workers_stopped_is_answered_retry_and_its_key_released(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """A call still recording its key when the push workers stop (it outlived the
    server's grace) is answered "retry" at once, and its key is free for the next
    attempt: no answer waits for ever on a queue no worker reads, and no key waits out
    the takeover bound."""
    cassandra = notifier_settings.cassandra
    notification = Notification(reminder_key(), user, Priority.URGENT, "title", "body")

    async def scenario() -> tuple[ItemResult, KeyClaim]:
        with connect(cassandra) as connection:
            keys, workers, intake = _in_process(connection.session, notifier_settings, KeyStore)
            workers.start()
            await workers.stop(grace_s=1)
            answer = await asyncio.wait_for(intake.accept(notification), timeout=10)
            return answer, await keys.record(notification)

    answer, next_attempt = asyncio.run(scenario())

    assert answer.outcome is Outcome.RETRYABLE
    assert next_attempt.state is KeyState.RECORDED


class _BulkKeysHeld(KeyStore):
    """Key writes of bulk items wait for `bulk_may_go`; urgent ones go through."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.bulk_may_go = asyncio.Event()
        self.bulk_waiting = 0

    async def record(
        self, notification: Notification, accept_id: uuid.UUID | None = None
    ) -> KeyClaim:
        if notification.priority is Priority.BULK:
            self.bulk_waiting += 1
            await self.bulk_may_go.wait()
        return await super().record(notification, accept_id)


def test_urgent_items_are_recorded_and_pushed_while_bulk_key_writes_hold_every_bulk_slot(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """A bulk sender filling every key-recording slot (a slow keyspace, a burst) does not
    hold up a reminder: slots are pooled per priority."""
    cassandra = notifier_settings.cassandra
    slots = 4

    async def scenario() -> tuple[ItemResult, int]:
        with connect(cassandra) as connection:
            keys, workers, intake = _in_process(
                connection.session, notifier_settings, _BulkKeysHeld, slots
            )
            workers.start()
            bulk = [
                Notification(reminder_key(), user, Priority.BULK, "news", "body")
                for _ in range(slots + 2)
            ]
            bulk_answers = asyncio.gather(*(intake.accept(n) for n in bulk))
            # Until every bulk slot is held (a loaded machine takes its time to get there).
            deadline = asyncio.get_running_loop().time() + 10
            while keys.bulk_waiting < slots:
                assert asyncio.get_running_loop().time() < deadline, (
                    f"only {keys.bulk_waiting} of {slots} bulk key writes ever started"
                )
                await asyncio.sleep(0.01)
            urgent = Notification(reminder_key(), user, Priority.URGENT, "title", "body")
            answer = await asyncio.wait_for(intake.accept(urgent), timeout=5)
            bulk_held = keys.bulk_waiting
            keys.bulk_may_go.set()
            await bulk_answers
            await workers.stop(grace_s=5)
            return answer, bulk_held

    answer, bulk_held = asyncio.run(scenario())

    assert answer.outcome is Outcome.ACCEPTED
    assert bulk_held == slots  # every bulk slot held, the rest of the bulk waiting for one


def test_an_expired_copy_of_a_key_another_attempt_still_holds_is_answered_retry(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Its holder (another replica, the item in its queue) may still push it: answered
    "rejected", the sender finalized the ring as refused and then it went out."""
    message = item(user)
    with running_notifier(notifier_settings) as notifier:
        leave_unsettled_key(notifier_settings, message.idempotency_key, user)
        late = item(user, message.idempotency_key, expire_in=-timedelta(seconds=1))
        [answer] = notifier.send_batch(late)

    assert (answer.outcome, answer.reason) == (
        RETRYABLE,
        "another attempt is delivering this key",
    )
