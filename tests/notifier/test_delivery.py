"""The notifier's promises on the real Cassandra through a real gRPC server: one push per
key, answered once pushed, expired items never pushed, a push service asking for retries
never losing a ring, urgent ahead of bulk, devices, the drop_reply fault."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import grpc
import pytest

from dispatcher.settings import MAX_BATCH_SIZE
from genproto.notification.v1 import notification_pb2 as pb
from notifier.delivery.adapters import RecordingPushAdapter
from notifier.domain.model import MAX_DEVICES_PER_USER, Device
from notifier.domain.push import PushMessage, PushResult
from notifier.intake import STILL_DELIVERING_REASON
from notifier.settings import Faults, NotifierSettings
from notifier.storage.devices import DeviceStore
from reminders_svc.config import Retention
from reminders_svc.storage.session import connect
from tests.grpc_errors import assert_refused
from tests.notifier.conftest import (
    ACCEPTED,
    DUPLICATE,
    REJECTED,
    RETRYABLE,
    Client,
    item,
    key_rows,
    one_worker_held,
    reminder_key,
    running_notifier,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def test_accepted_then_duplicate_and_pushed_once(notifier: Client, user: str) -> None:
    key = reminder_key()
    [first] = notifier.send_batch(item(user, key))
    assert (first.idempotency_key, first.outcome) == (key, ACCEPTED)
    [again] = notifier.send_batch(item(user, key, title="edited"))
    assert again.outcome == DUPLICATE

    [pushed] = notifier.wait_delivered(1, user)
    time.sleep(0.3)  # a second push, if any, would have landed by now
    assert len(notifier.delivered(user)) == 1
    assert (pushed.idempotency_key, pushed.title, pushed.body) == (key, "Call mom", "It is 18:00")
    assert pushed.device_token == f"auto:{user}"
    assert pushed.priority == pb.PRIORITY_URGENT
    assert pushed.push_time.ToDatetime() >= pushed.due_time.ToDatetime()


def test_a_key_is_kept_for_its_ttl_past_any_catch_up_of_the_default_retention(
    notifier: Client, notifier_settings: NotifierSettings, user: str
) -> None:
    """A ring re-sent within REMINDERS_NOTIFIER_KEY_TTL_DAYS (30) of its first send is
    answered from its key; the default bucket retention (7 days) bounds any catch-up."""
    key = reminder_key()
    assert [r.outcome for r in notifier.send_batch(item(user, key))] == [ACCEPTED]

    [row] = key_rows(notifier_settings, [key], "TTL(accept_id) AS held, TTL(settled_as) AS settled")
    ttl_s = notifier_settings.key_ttl.total_seconds()
    assert ttl_s - 60 < row.held <= ttl_s
    assert ttl_s - 60 < row.settled <= ttl_s
    assert notifier_settings.key_ttl > Retention().bucket


def test_a_key_sent_for_another_user_is_refused_not_answered_as_a_duplicate(
    notifier: Client, user: str
) -> None:
    """A sender's bug (one key for two users' alerts) was answered "duplicate" for the
    second user, who was never pushed: the sender recorded a ring that did not happen."""
    first = item(user)
    other = item(f"{user}-other", first.idempotency_key)
    in_one_batch = item(user, f"{first.idempotency_key}-b")
    also_other = item(f"{user}-other", in_one_batch.idempotency_key)

    answers = notifier.send_batch(first) + notifier.send_batch(other)
    answers += notifier.send_batch(in_one_batch, also_other)  # the second joins the first

    assert [(a.outcome, a.reason) for a in answers] == [
        (ACCEPTED, ""),
        (REJECTED, "idempotency_key already used for another user"),
        (ACCEPTED, ""),
        (REJECTED, "idempotency_key already used for another user"),
    ]
    time.sleep(0.3)
    assert notifier.delivered(f"{user}-other") == []


def test_single_send_answers_like_a_batch(notifier: Client, user: str) -> None:
    message = item(user)
    reply = notifier.stub.Send(pb.SendRequest(notification=message), timeout=10)
    assert reply.result.outcome == ACCEPTED
    again = notifier.stub.Send(pb.SendRequest(notification=message), timeout=10)
    assert again.result.outcome == DUPLICATE


def test_concurrent_batches_with_one_key_accept_it_once(notifier: Client, user: str) -> None:
    key = reminder_key()
    callers = 8
    with ThreadPoolExecutor(callers) as pool:
        replies = list(pool.map(lambda _: notifier.send_batch(item(user, key)), range(callers)))
    outcomes = sorted(result.outcome for [result] in replies)
    assert outcomes == [ACCEPTED] + [DUPLICATE] * (callers - 1)
    notifier.wait_delivered(1, user)
    time.sleep(0.3)
    assert len(notifier.delivered(key=key)) == 1


def test_results_in_request_order_with_rejections(notifier: Client, user: str) -> None:
    good = [item(user) for _ in range(20)]
    expired = item(user, expire_in=-timedelta(seconds=1))
    no_key = item(user, key="")
    no_user = item("", key=reminder_key())
    batch = [*good[:10], expired, no_key, no_user, *good[10:]]
    results = notifier.send_batch(*batch)
    assert [r.idempotency_key for r in results] == [m.idempotency_key for m in batch]
    outcomes = [(r.outcome, r.reason) for r in results]
    assert outcomes[10:13] == [
        (REJECTED, "expired"),
        (REJECTED, "idempotency_key is required"),
        (REJECTED, "user_id: required"),
    ]
    assert {outcome for outcome, _ in outcomes[:10] + outcomes[13:]} == {ACCEPTED}
    notifier.wait_delivered(20, user)
    time.sleep(0.3)
    assert expired.idempotency_key not in {p.idempotency_key for p in notifier.delivered(user)}
    # A rejected expired key was not recorded: it is rejected again, not a duplicate.
    [again] = notifier.send_batch(expired)
    assert (again.outcome, again.reason) == (REJECTED, "expired")


def test_an_item_failing_unexpectedly_is_answered_retry_and_its_batch_as_usual(
    notifier: Client, notifier_settings: NotifierSettings, user: str
) -> None:
    """A key row this notifier cannot read (a settlement written by a newer version,
    during a rolling deploy) fails that one item, never the rest of its batch."""
    unreadable = reminder_key()
    cassandra = notifier_settings.cassandra
    with connect(cassandra) as connection:
        connection.session.execute(
            f"UPDATE {cassandra.keyspace}.notification_keys"
            " SET settled_as = 'from-a-newer-version' WHERE idempotency_key = %s",
            (unreadable,),
        )
    batch = [item(user), item(user, unreadable), item(user)]

    results = notifier.send_batch(*batch)

    assert [(r.outcome, r.reason) for r in results] == [
        (ACCEPTED, ""),
        (RETRYABLE, "internal error"),
        (ACCEPTED, ""),
    ]
    alone = notifier.stub.Send(pb.SendRequest(notification=item(user, unreadable)), timeout=10)
    assert (alone.result.outcome, alone.result.reason) == (RETRYABLE, "internal error")


def test_batch_size_is_1_to_500_the_dispatchers_largest(notifier: Client, user: str) -> None:
    assert MAX_BATCH_SIZE == 500
    for size in (0, MAX_BATCH_SIZE + 1):
        with pytest.raises(grpc.RpcError) as refused:
            notifier.send_batch(*(item(user) for _ in range(size)))
        assert_refused(refused.value, INVALID, "notifications", "INVALID_FIELD", "notification.v1")
    batch = [item(user) for _ in range(MAX_BATCH_SIZE)]
    assert len(notifier.send_batch(*batch)) == MAX_BATCH_SIZE


def test_an_item_is_answered_once_pushed_not_once_queued(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """ "Accepted" means handed to the push service: a notifier that died with the item
    queued would have answered nothing, and its sender would send it again."""
    with one_worker_held(notifier_settings, user) as held:
        answer = held.send_queued(item(user))
        time.sleep(0.5)
        assert not answer.done()
        held.adapter.release()
        [result] = answer.result(timeout=10)
        assert result.outcome == ACCEPTED
        assert held.notifier.delivered(key=result.idempotency_key)


def test_urgent_items_go_before_bulk_items_queued_earlier(
    notifier_settings: NotifierSettings, user: str
) -> None:
    with one_worker_held(notifier_settings, user) as held:
        bulk = [item(user, f"bulk-{n}/{user}", priority=pb.PRIORITY_BULK) for n in (1, 2, 3)]
        urgent = [item(user, f"urgent-{n}/{user}") for n in (1, 2, 3)]
        answers = [held.send_queued(message) for message in (*bulk, *urgent)]
        held.adapter.release()
        assert [a.result(timeout=10)[0].outcome for a in answers] == [ACCEPTED] * 6
        pushed = [p.idempotency_key for p in held.notifier.wait_delivered(7, user)]
    assert [key.split("/")[0] for key in pushed] == [
        "bulk-0",  # already being pushed when the others came
        "urgent-1",
        "urgent-2",
        "urgent-3",
        "bulk-1",
        "bulk-2",
        "bulk-3",
    ]


def test_past_max_pending_new_items_are_answered_retry_with_nothing_recorded(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Backpressure: a notifier with as many deliveries under way as it allows answers
    new items "retry" at once, records nothing of them, and takes them once there is
    room; each priority has its own bound, so a bulk flood never refuses a reminder."""
    bounded = dataclasses.replace(notifier_settings, max_pending=2)
    with one_worker_held(bounded, user) as held:  # one bulk item under way
        urgent = [item(user, f"urgent-{n}/{user}") for n in (1, 2)]
        queued = [held.send_queued(message) for message in urgent]
        refused_urgent = item(user, f"urgent-3/{user}")
        [result] = held.notifier.send_batch(refused_urgent)
        assert (result.outcome, result.reason) == (
            RETRYABLE,
            "overloaded: 2 urgent deliveries under way",
        )
        queued.append(held.send_queued(item(user, f"bulk-1/{user}", priority=pb.PRIORITY_BULK)))
        refused_bulk = item(user, f"bulk-2/{user}", priority=pb.PRIORITY_BULK)
        assert [r.outcome for r in held.notifier.send_batch(refused_bulk)] == [RETRYABLE]
        # A repeat of a key under way joins its delivery: not a new one, so not refused.
        repeat = held.send(urgent[0])
        refused = [refused_urgent.idempotency_key, refused_bulk.idempotency_key]
        assert key_rows(notifier_settings, refused, "accept_id") == [None, None]

        held.adapter.release()
        assert [a.result(timeout=10)[0].outcome for a in queued] == [ACCEPTED] * 3
        assert repeat.result(timeout=10)[0].outcome == DUPLICATE
        assert [r.outcome for r in held.notifier.send_batch(refused_urgent)] == [ACCEPTED]
        overloaded = held.notifier.metrics()
        for priority in ("urgent", "bulk"):
            assert (
                overloaded[("notifier_overloaded_total", frozenset({("priority", priority)}))] == 1
            )


def test_item_expiring_while_queued_is_rejected_and_its_next_attempt_pushed(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Its expiry passes in the queue (or through a storage outage): the attempt that sent
    it is answered "expired", never pushed late. It was settled "expired" for good, so the
    sender's next attempt, with an expiry of its own (a ring re-claimed after an outage of
    over an hour), was refused too and the one-off never rang. An attempt that joined the
    expired delivery with a fresh expiry is told to send again, and that send is pushed."""
    with one_worker_held(notifier_settings, user) as held:
        # Room to be recorded and queued before it expires, on a slow machine too.
        late = item(user, expire_in=timedelta(seconds=4))
        answer = held.send_queued(late)
        joined = held.send(item(user, late.idempotency_key, expire_in=timedelta(minutes=60)))
        expired = late.expire_time.ToDatetime(tzinfo=UTC) + timedelta(seconds=0.5)
        time.sleep(max(0.0, (expired - datetime.now(UTC)).total_seconds()))
        held.adapter.release()
        [result] = answer.result(timeout=10)
        assert (result.outcome, result.reason) == (REJECTED, "expired")
        [joiner] = joined.result(timeout=10)
        assert joiner.outcome == RETRYABLE
        dropped = ("notifier_expired_in_queue_total", frozenset({("priority", "urgent")}))
        assert held.notifier.metrics()[dropped] == 1
        held.notifier.wait_delivered(1, user)
        assert late.idempotency_key not in {
            p.idempotency_key for p in held.notifier.delivered(user)
        }

        again = item(user, late.idempotency_key, expire_in=timedelta(minutes=60))
        assert [r.outcome for r in held.notifier.send_batch(again)] == [ACCEPTED]
        assert len(held.notifier.delivered(key=late.idempotency_key)) == 1


def test_an_item_whose_device_lookup_outlasts_its_expiry_is_not_pushed(
    notifier_settings: NotifierSettings, user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storage under load slowed the lookup past the item's expiry: pushed late."""
    # Room to be recorded and queued before it expires, on a slow machine too.
    late = item(user, expire_in=timedelta(seconds=4))
    expired = late.expire_time.ToDatetime(tzinfo=UTC) + timedelta(seconds=0.5)
    real_list = DeviceStore.list

    async def slow_list(self: DeviceStore, user_id: str) -> tuple[Device, ...]:
        devices = await real_list(self, user_id)
        await asyncio.sleep(max(0.0, (expired - datetime.now(UTC)).total_seconds()))
        return devices

    monkeypatch.setattr(DeviceStore, "list", slow_list)
    with running_notifier(notifier_settings) as notifier:
        [answer] = notifier.send_batch(late)
        pushed = notifier.delivered(user)

    assert (answer.outcome, answer.reason) == (REJECTED, "expired")
    assert pushed == []


class PushServiceAskingToRetry(RecordingPushAdapter):
    """Answers "retry" (throttled, a 5xx) while `failing`, then pushes as usual."""

    def __init__(self) -> None:
        super().__init__(capacity=100)
        self.failing = True
        self.retries_asked = 0

    async def push(self, message: PushMessage) -> PushResult:
        if self.failing:
            self.retries_asked += 1
            return PushResult.RETRY
        return await super().push(message)


def test_an_item_the_push_service_keeps_asking_to_retry_is_handed_back_and_pushed_when_resent(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """A push service throttling or failing for longer than the push attempts last (~15 s
    by default) used to get the item given up on: answered rejected and settled so, the
    one-off never rang, and every retry of its key got the stored rejection. Now it is
    handed back (answered "retry", its key released), and the sender's retry, once the
    push service answers, is pushed."""
    settings = dataclasses.replace(notifier_settings, push_max_attempts=3)
    push_service = PushServiceAskingToRetry()
    message = item(user)
    exhausted = ("notifier_handed_back_total", frozenset({("reason", "push_retries_exhausted")}))
    with running_notifier(settings, push_service) as notifier:
        [handed_back] = notifier.send_batch(message)
        assert (handed_back.outcome, handed_back.reason) == (
            RETRYABLE,
            "not delivered (the push service asked to retry every attempt); send again",
        )
        assert push_service.retries_asked == settings.push_max_attempts
        [released] = key_rows(settings, [message.idempotency_key], "accept_id, settled_as")
        assert (released.accept_id, released.settled_as) == (None, None)  # free, unsettled
        assert notifier.metrics()[exhausted] == 1

        push_service.failing = False
        [pushed] = notifier.send_batch(message)
        assert pushed.outcome == ACCEPTED
        assert len(notifier.delivered(key=message.idempotency_key)) == 1


class PushServiceThrottlingOneDevice(RecordingPushAdapter):
    """Answers "retry" for one device token, always; pushes to the others."""

    def __init__(self, throttled: str) -> None:
        super().__init__(capacity=100)
        self.throttled = throttled

    async def push(self, message: PushMessage) -> PushResult:
        if message.device_token == self.throttled:
            return await self.push_to_throttled()
        return await super().push(message)

    async def push_to_throttled(self) -> PushResult:
        return PushResult.RETRY


def test_an_item_that_reached_one_device_is_delivered_though_another_keeps_asking_to_retry(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Handed back, it would be pushed again to every device, again and again, while the
    push service throttles one token: it reached the user, so it is delivered."""
    settings = dataclasses.replace(notifier_settings, push_max_attempts=2)
    push_service = PushServiceThrottlingOneDevice(throttled=f"fcm-{user}")
    message = item(user)
    with running_notifier(settings, push_service) as notifier:
        phone, _ = _register_phone_and_throttled_tablet(notifier, user)
        [answer] = notifier.send_batch(message)
        [again] = notifier.send_batch(message)
        pushed = notifier.delivered(key=message.idempotency_key)

    assert (answer.outcome, again.outcome) == (ACCEPTED, DUPLICATE)
    assert [p.device_token for p in pushed] == [phone]


def test_a_batch_is_answered_within_its_deadline_though_one_item_is_still_being_retried(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """One item whose push the push service keeps throttling (retried with backoff for
    longer than the caller waits) held its whole batch's answer past the caller's deadline:
    every ring in it was retried though pushed. Each item is answered by the deadline; the
    throttled one "retry", its delivery going on."""
    settings = dataclasses.replace(
        notifier_settings, push_max_attempts=4, push_retry_backoff=timedelta(seconds=5)
    )
    throttled_user, fine_user = user, f"{user}-fine"
    push_service = PushServiceThrottlingOneDevice(throttled=f"fcm-{throttled_user}")
    with running_notifier(settings, push_service) as notifier:
        device = pb.Device(device_token=f"fcm-{throttled_user}", platform=pb.Device.PLATFORM_FCM)
        notifier.stub.RegisterDevice(
            pb.RegisterDeviceRequest(user_id=throttled_user, device=device)
        )
        throttled, fine = item(throttled_user), item(fine_user)
        started = time.monotonic()
        # 6 s: the fine item has 5.5 s to be recorded and pushed on a loaded machine.
        answers = notifier.send_batch(throttled, fine, timeout_s=6)
        answered_in_s = time.monotonic() - started

    assert [(a.idempotency_key, a.outcome) for a in answers] == [
        (throttled.idempotency_key, RETRYABLE),
        (fine.idempotency_key, ACCEPTED),
    ]
    assert answered_in_s < 6


def test_retries_of_a_key_still_being_delivered_leave_nothing_waiting_behind(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Each retry of a key whose delivery outlasted the caller's deadline was answered
    "retry" and then kept a task waiting on that delivery for as long as it lasted (up to
    the item's expiry): a sender retrying every few seconds piled them up, outside the
    bound on deliveries under way."""
    with one_worker_held(notifier_settings, user) as held:
        stuck = item(user, f"bulk-0/{user}", priority=pb.PRIORITY_BULK)  # the held push's key
        before = held.notifier.tasks()
        for _ in range(20):
            [answer] = held.notifier.send_batch(stuck, timeout_s=0.6)
            assert (answer.outcome, answer.reason) == (RETRYABLE, STILL_DELIVERING_REASON)
        left = held.notifier.tasks() - before

    assert left < 5


def _register_phone_and_throttled_tablet(notifier: Client, user: str) -> tuple[str, str]:
    phone, tablet = f"apns-{user}", f"fcm-{user}"
    for token, platform in ((phone, pb.Device.PLATFORM_APNS), (tablet, pb.Device.PLATFORM_FCM)):
        device = pb.Device(device_token=token, platform=platform)
        notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user, device=device))
    return phone, tablet


def test_an_item_that_reached_one_device_and_expired_before_its_retry_is_delivered(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """The phone took it, the tablet asked to retry, and the expiry passed before the
    retry: it was settled "expired" and answered rejected, so its sender recorded a
    refusal for a ring that reached the phone."""
    settings = dataclasses.replace(
        notifier_settings, push_max_attempts=3, push_retry_backoff=timedelta(seconds=2)
    )
    message = item(user, expire_in=timedelta(seconds=1))
    with running_notifier(settings, PushServiceThrottlingOneDevice(f"fcm-{user}")) as notifier:
        phone, _ = _register_phone_and_throttled_tablet(notifier, user)
        [answer] = notifier.send_batch(message)
        pushed = notifier.delivered(key=message.idempotency_key)

    assert answer.outcome == ACCEPTED
    assert [p.device_token for p in pushed] == [phone]


class PushServiceHangingOnOneDevice(PushServiceThrottlingOneDevice):
    """Never answers a push to one device token (a dead HTTP/2 stream); pushes the rest."""

    async def push_to_throttled(self) -> PushResult:
        await asyncio.Event().wait()
        raise AssertionError("never answered")


@pytest.mark.parametrize("tablet", ["asks-to-retry", "never-answers"])
def test_a_notifier_stopping_with_an_item_that_reached_one_device_settles_it_pushed(
    notifier_settings: NotifierSettings, user: str, tablet: str
) -> None:
    """Stopped with the phone already pushed, while the item waits to retry the tablet or
    while the tablet's push is still under way: it was handed back and its key released,
    so the sender's retry on another replica pushed the phone a second time."""
    settings = dataclasses.replace(
        notifier_settings,
        push_max_attempts=3,
        push_retry_backoff=timedelta(seconds=60),
        push_timeout=timedelta(seconds=60),
        shutdown_grace=timedelta(seconds=1),
    )
    message = item(user, expire_in=timedelta(minutes=5))
    adapter = (
        PushServiceThrottlingOneDevice
        if tablet == "asks-to-retry"
        else PushServiceHangingOnOneDevice
    )
    push_service = adapter(f"fcm-{user}")
    with ThreadPoolExecutor(1) as caller, running_notifier(settings, push_service) as first:
        phone, _ = _register_phone_and_throttled_tablet(first, user)
        caller.submit(first.send_batch, message)  # its answer cut off by the stop
        assert [p.device_token for p in first.wait_delivered(1, user)] == [phone]
        time.sleep(0.5)  # the tablet's push answered "retry" (it waits a minute), or hangs

    with running_notifier(notifier_settings) as second:
        [again] = second.send_batch(message)
        assert second.delivered(key=message.idempotency_key) == []

    assert again.outcome == DUPLICATE


def test_a_push_that_never_answers_is_abandoned_and_others_go_out(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """An adapter hung on one device held its push worker for ever: with every worker
    so held, urgent items of other users stopped too."""
    settings = dataclasses.replace(
        notifier_settings,
        push_workers=1,
        push_max_attempts=2,
        push_retry_backoff=timedelta(seconds=0.1),
        push_timeout=timedelta(seconds=0.5),
    )
    hung, other = f"apns-{user}", f"{user}-other"
    stuck, fine = item(user), item(other)
    with running_notifier(settings, PushServiceHangingOnOneDevice(hung)) as notifier:
        device = pb.Device(device_token=hung, platform=pb.Device.PLATFORM_APNS)
        notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user, device=device))
        with ThreadPoolExecutor(1) as caller:
            held = caller.submit(notifier.send_batch, stuck)
            time.sleep(0.2)  # its push under way on the only worker
            [answer] = notifier.send_batch(fine)
            [handed_back] = held.result(timeout=30)

    assert answer.outcome == ACCEPTED
    assert handed_back.outcome == RETRYABLE  # never pushed: its sender sends it again


class PushServiceRefusing(RecordingPushAdapter):
    """Refuses every push for good (an APNs 400, FCM INVALID_ARGUMENT)."""

    def __init__(self) -> None:
        super().__init__(capacity=100)
        self.refused = 0

    async def push(self, message: PushMessage) -> PushResult:
        self.refused += 1
        return PushResult.REFUSED


def test_an_item_the_push_service_refuses_for_good_is_given_up_at_once(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """A message the push service will never take had to be answered "retry": retried
    and handed back for an hour, holding its minute's checkpoint all along."""
    push_service = PushServiceRefusing()
    message = item(user)
    with running_notifier(notifier_settings, push_service) as notifier:
        [answer] = notifier.send_batch(message)
        [again] = notifier.send_batch(message)
        refused = ("notifier_undeliverable_total", frozenset({("reason", "refused")}))
        assert notifier.metrics()[refused] == 1

    assert answer.outcome == REJECTED
    assert again.outcome == REJECTED  # answered from the key's settlement
    assert push_service.refused == 1  # one push: not retried


class PushServiceRefusingThePhoneThenLosingTheTablet(PushServiceThrottlingOneDevice):
    """Refuses the phone's pushes for good; asks to retry the tablet's first push, then
    answers that the tablet is gone."""

    def __init__(self, phone: str, tablet: str) -> None:
        super().__init__(throttled=tablet)
        self.phone = phone
        self.tablet_pushes = 0

    async def push(self, message: PushMessage) -> PushResult:
        if message.device_token == self.phone:
            return PushResult.REFUSED
        return await super().push(message)

    async def push_to_throttled(self) -> PushResult:
        self.tablet_pushes += 1
        return PushResult.RETRY if self.tablet_pushes == 1 else PushResult.DEVICE_GONE


def test_an_item_one_device_refused_is_rejected_though_the_other_went_away_on_a_retry(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """The refusal was forgotten between rounds: the retry round saw only the tablet
    gone, and the item was answered ACCEPTED, settled as "no device", though the phone
    is still registered and no device got the ring."""
    phone, tablet = f"apns-{user}", f"fcm-{user}"
    push_service = PushServiceRefusingThePhoneThenLosingTheTablet(phone, tablet)
    refused = ("notifier_undeliverable_total", frozenset({("reason", "refused")}))
    message = item(user)
    with running_notifier(notifier_settings, push_service) as notifier:
        _register_phone_and_throttled_tablet(notifier, user)
        [answer] = notifier.send_batch(message)
        counted = notifier.metrics()[refused]
        left = notifier.stub.ListDevices(pb.ListDevicesRequest(user_id=user)).devices

    assert answer.outcome == REJECTED
    assert push_service.tablet_pushes == 2
    assert counted == 1
    assert [d.device_token for d in left] == [phone]


class PushServiceForgettingEveryDevice(RecordingPushAdapter):
    """Answers every push "device gone" (the app uninstalled everywhere)."""

    async def push(self, message: PushMessage) -> PushResult:
        return PushResult.DEVICE_GONE


def test_an_item_whose_every_device_is_gone_is_settled_as_having_none(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """It was settled as pushed: counted nowhere as undeliverable, though no one got it."""
    no_device = ("notifier_undeliverable_total", frozenset({("reason", "no_device")}))
    message = item(user)
    with running_notifier(notifier_settings, PushServiceForgettingEveryDevice(100)) as notifier:
        device = pb.Device(device_token=f"phone-{user}", platform=pb.Device.PLATFORM_FCM)
        notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user, device=device))
        [answer] = notifier.send_batch(message)
        [again] = notifier.send_batch(message)
        counted = notifier.metrics()[no_device]

    assert answer.outcome == ACCEPTED  # nowhere to push it: nothing to retry
    assert again.outcome == DUPLICATE
    assert counted == 1


def test_an_item_no_device_took_for_too_long_past_its_due_is_given_up(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Senders set a fresh expiry on each attempt: the bound on handing back counts from
    the due (or the first hand-off, when later), or a token the push service always
    throttles would come back for ever."""
    settings = dataclasses.replace(
        notifier_settings, push_max_attempts=2, push_give_up_after=timedelta(minutes=1)
    )
    message = item(user)
    message.due_time.FromDatetime(datetime.now(UTC) - timedelta(minutes=2))
    with running_notifier(settings, PushServiceAskingToRetry()) as notifier:
        [answer] = notifier.send_batch(message)
        [again] = notifier.send_batch(message)

    assert (answer.outcome, answer.reason) == (
        REJECTED,
        "the push service refused every attempt",
    )
    assert again.outcome == REJECTED  # answered from the key's settlement


def test_an_item_handed_off_late_gets_the_whole_bound_from_its_first_hand_off(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """A ring handed off in a catch-up, long past its due, whose pushes the push service
    asks to retry (throttling the recovery's burst): counted from the due, the bound had
    passed before the first push, and the one-off was given up after one round of
    attempts and never rang. Counted from its first hand-off, it is handed back, and
    pushed once the push service answers."""
    settings = dataclasses.replace(
        notifier_settings, push_max_attempts=2, push_give_up_after=timedelta(minutes=1)
    )
    push_service = PushServiceAskingToRetry()
    message = item(user)
    now = datetime.now(UTC)
    message.due_time.FromDatetime(now - timedelta(hours=2))
    message.first_send_time.FromDatetime(now)
    with running_notifier(settings, push_service) as notifier:
        [handed_back] = notifier.send_batch(message)
        push_service.failing = False
        [pushed] = notifier.send_batch(message)
        delivered = notifier.delivered(key=message.idempotency_key)

    assert (handed_back.outcome, pushed.outcome) == (RETRYABLE, ACCEPTED)
    assert len(delivered) == 1


def test_a_delivered_key_sent_again_past_its_expiry_is_a_duplicate_not_a_rejection(
    notifier: Client, user: str
) -> None:
    """A sender whose reply was lost retries late: what it records must be the push
    that happened, not a refusal."""
    first = item(user)
    assert [r.outcome for r in notifier.send_batch(first)] == [ACCEPTED]
    notifier.wait_delivered(1, user)
    late = item(user, first.idempotency_key, expire_in=-timedelta(seconds=1))

    assert [r.outcome for r in notifier.send_batch(late)] == [DUPLICATE]
    assert len(notifier.delivered(key=first.idempotency_key)) == 1


def test_a_key_of_another_user_sent_past_its_expiry_is_refused_not_a_duplicate(
    notifier: Client, user: str
) -> None:
    """An expired item is answered from the key's row: it was answered "duplicate" for
    the other user, who was never pushed (the sender recorded a ring that never was)."""
    first = item(user)
    assert [r.outcome for r in notifier.send_batch(first)] == [ACCEPTED]
    late = item(f"{user}-other", first.idempotency_key, expire_in=-timedelta(seconds=1))

    [answer] = notifier.send_batch(late)

    assert (answer.outcome, answer.reason) == (
        REJECTED,
        "idempotency_key already used for another user",
    )


def test_a_key_sent_again_past_its_expiry_while_its_delivery_runs_is_a_duplicate(
    notifier: Client, user: str
) -> None:
    """The same in one batch: the late copy waits for the delivery under way and answers
    as its repeat (it was answered "expired" while the first copy was pushed)."""
    first = item(user)
    late = item(user, first.idempotency_key, expire_in=-timedelta(seconds=1))

    assert [r.outcome for r in notifier.send_batch(first, late)] == [ACCEPTED, DUPLICATE]
    notifier.wait_delivered(1, user)
    assert len(notifier.delivered(key=first.idempotency_key)) == 1


def test_registered_devices_get_the_push(notifier: Client, user: str) -> None:
    phone = pb.Device(device_token=f"apns-{user}", platform=pb.Device.PLATFORM_APNS)
    tablet = pb.Device(device_token=f"fcm-{user}", platform=pb.Device.PLATFORM_FCM)
    first = notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user, device=phone))
    again = notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user, device=phone))
    # Idempotent: the same device, its registration time refreshed (it is in use).
    assert (again.device.device_token, again.device.platform) == (
        first.device.device_token,
        first.device.platform,
    )
    first_time = first.device.register_time.ToDatetime(tzinfo=UTC)
    assert first_time <= again.device.register_time.ToDatetime(tzinfo=UTC)
    assert first.device.register_time.seconds > 0
    notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user, device=tablet))

    listed = notifier.stub.ListDevices(pb.ListDevicesRequest(user_id=user)).devices
    assert {(d.device_token, d.platform) for d in listed} == {
        (phone.device_token, pb.Device.PLATFORM_APNS),
        (tablet.device_token, pb.Device.PLATFORM_FCM),
    }

    key = reminder_key()
    notifier.send_batch(item(user, key))
    pushed = notifier.wait_delivered(2, user)
    assert sorted(p.device_token for p in pushed) == sorted(
        [phone.device_token, tablet.device_token]
    )
    assert {p.idempotency_key for p in pushed} == {key}


def test_a_token_registered_by_another_user_leaves_the_first_users_devices(
    notifier: Client, user: str
) -> None:
    """A phone signed out without unregistering (offline, the app killed), then signed in
    as someone else, registers its token again: the first user's reminders, texts
    included, went on being pushed to it. A token is one device, of one user at a time."""
    first_user, second_user = user, f"{user}-next"
    shared = pb.Device(device_token=f"apns-{user}-phone", platform=pb.Device.PLATFORM_APNS)
    kept = pb.Device(device_token=f"fcm-{user}-tablet", platform=pb.Device.PLATFORM_FCM)
    for owner, device in ((first_user, shared), (first_user, kept), (second_user, shared)):
        notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=owner, device=device))

    def tokens(owner: str) -> set[str]:
        request = pb.ListDevicesRequest(user_id=owner)
        return {d.device_token for d in notifier.stub.ListDevices(request).devices}

    assert tokens(first_user) == {kept.device_token}
    assert tokens(second_user) == {shared.device_token}
    notifier.send_batch(item(first_user))
    assert [p.device_token for p in notifier.wait_delivered(1, first_user)] == [kept.device_token]


def test_a_user_keeps_the_50_most_recently_registered_devices(notifier: Client, user: str) -> None:
    """Old tokens (rotated, reinstalled) go as new ones come: a push reaches at most 50."""
    tokens = [f"fcm-{n:02}-{user}" for n in range(MAX_DEVICES_PER_USER + 2)]
    for token in tokens:
        device = pb.Device(device_token=token, platform=pb.Device.PLATFORM_FCM)
        notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user, device=device))
        time.sleep(0.002)  # registration times a millisecond apart at least
    # Registering a kept token again removes nobody: it is not a new device.
    again = pb.Device(device_token=tokens[-1], platform=pb.Device.PLATFORM_FCM)
    notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user, device=again))

    listed = notifier.stub.ListDevices(pb.ListDevicesRequest(user_id=user)).devices
    assert sorted(d.device_token for d in listed) == tokens[2:]
    notifier.send_batch(item(user))
    pushed = notifier.wait_delivered(MAX_DEVICES_PER_USER, user)
    time.sleep(0.3)
    assert sorted(p.device_token for p in notifier.delivered(user)) == tokens[2:]
    assert len(pushed) == MAX_DEVICES_PER_USER

    # A device registering again is in use: the next eviction takes another.
    for token in (tokens[2], f"fcm-new-{user}"):
        time.sleep(0.002)
        device = pb.Device(device_token=token, platform=pb.Device.PLATFORM_FCM)
        notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user, device=device))
    listed = notifier.stub.ListDevices(pb.ListDevicesRequest(user_id=user)).devices
    assert {d.device_token for d in listed} == {*tokens[2:], f"fcm-new-{user}"} - {tokens[3]}


def test_register_device_refuses_bad_input_naming_the_field(notifier: Client, user: str) -> None:
    apns = pb.Device.PLATFORM_APNS
    cases = [
        (
            pb.RegisterDeviceRequest(user_id="", device=pb.Device(device_token="t", platform=apns)),
            "user_id",
        ),
        (
            pb.RegisterDeviceRequest(user_id=user, device=pb.Device(device_token="t")),
            "device.platform",
        ),
        (
            pb.RegisterDeviceRequest(
                user_id=user, device=pb.Device(device_token=f"auto:{user}", platform=apns)
            ),
            "device.device_token",
        ),
        (
            pb.RegisterDeviceRequest(
                user_id="u" * 257, device=pb.Device(device_token="t", platform=apns)
            ),
            "user_id",
        ),
        (
            pb.RegisterDeviceRequest(
                user_id=user, device=pb.Device(device_token="t" * 1025, platform=apns)
            ),
            "device.device_token",
        ),
        (
            pb.RegisterDeviceRequest(
                user_id=user, device=pb.Device(device_token="tok\nwith\x00ctrl", platform=apns)
            ),
            "device.device_token",
        ),
        (
            pb.RegisterDeviceRequest(
                user_id=user, device=pb.Device(device_token="   ", platform=apns)
            ),
            "device.device_token",
        ),
    ]
    for request, field in cases:
        with pytest.raises(grpc.RpcError) as refused:
            notifier.stub.RegisterDevice(request)
        assert_refused(refused.value, INVALID, field, "INVALID_FIELD", "notification.v1")
    assert notifier.stub.ListDevices(pb.ListDevicesRequest(user_id=user)).devices == []
    with pytest.raises(grpc.RpcError) as refused:
        notifier.stub.ListDevices(pb.ListDevicesRequest(user_id="u" * 257))
    assert_refused(refused.value, INVALID, "user_id", "INVALID_FIELD", "notification.v1")
    # The registry sets a device's time: a request's register_time, even one no
    # timestamp can hold, is not read.
    odd_time = pb.Device(device_token="phone", platform=apns)
    odd_time.register_time.seconds = -(10**12)
    registered = notifier.stub.RegisterDevice(
        pb.RegisterDeviceRequest(user_id=user, device=odd_time)
    )
    assert registered.device.register_time.seconds > 0


def test_list_delivered_filters_by_user_and_key(notifier: Client, user: str) -> None:
    other = f"{user}-other"
    keys = [reminder_key() for _ in range(3)]
    notifier.send_batch(item(user, keys[0]), item(user, keys[1]), item(other, keys[2]))
    notifier.wait_delivered(2, user)
    notifier.wait_delivered(1, other)
    assert sorted(p.idempotency_key for p in notifier.delivered(user)) == sorted(keys[:2])
    assert [p.user_id for p in notifier.delivered(key=keys[2])] == [other]
    assert notifier.delivered(user, keys[2]) == []
    everything = {p.idempotency_key for p in notifier.delivered()}
    assert set(keys) <= everything


def test_dropped_reply_then_retry_answers_duplicate_and_pushes_once(
    notifier_settings: NotifierSettings, user: str
) -> None:
    settings = dataclasses.replace(notifier_settings, faults=Faults(drop_reply=1))
    with running_notifier(settings) as notifier:
        batch = [item(user), item(user)]
        with pytest.raises(grpc.RpcError) as lost:
            notifier.send_batch(*batch)
        assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
        retried = notifier.send_batch(*batch)
        assert [r.outcome for r in retried] == [DUPLICATE, DUPLICATE]
        pushed = notifier.wait_delivered(2, user)
        time.sleep(0.3)
        assert len(notifier.delivered(user)) == 2
        assert sorted(p.idempotency_key for p in pushed) == sorted(m.idempotency_key for m in batch)


def test_an_rpc_failing_unexpectedly_answers_internal_without_details(
    notifier: Client, notifier_settings: NotifierSettings, user: str
) -> None:
    """A device row this notifier cannot read (a platform a newer version wrote): the
    caller gets INTERNAL, not UNKNOWN with the exception's text."""
    cassandra = notifier_settings.cassandra
    with connect(cassandra) as connection:
        connection.session.execute(
            f"INSERT INTO {cassandra.keyspace}.devices (user_id, device_token, platform)"
            " VALUES (%s, 'token-1', 'from-a-newer-version')",
            (user,),
        )
    with pytest.raises(grpc.RpcError) as raised:
        notifier.stub.ListDevices(pb.ListDevicesRequest(user_id=user), timeout=10)
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    assert raised.value.details() == "internal error"


def test_items_no_push_could_carry_are_rejected_on_their_own_naming_the_field(
    notifier: Client, notifier_settings: NotifierSettings, user: str
) -> None:
    """A timestamp out of range, a user id or content past its bound, a data key the push
    services reserve: each item rejected with its reason, its key not recorded, the rest
    of the batch delivered."""
    far_due = item(user)
    far_due.due_time.seconds = 253_402_300_800  # year 10000
    bad_nanos = item(user)
    bad_nanos.expire_time.nanos = 1_000_000_000
    long_user = item("u" * 257)
    long_body = item(user, body="x" * 4000, title="y" * 100)
    # Keys are logged: one with a line break would forge a log line.
    forging_key = item(user, f"{reminder_key()}\nERROR forged")
    # FCM refuses a whole message carrying one of its reserved data keys.
    reserved_key, reserved_prefix = item(user), item(user)
    reserved_key.data["from"] = "x"
    reserved_prefix.data["google.sent_time"] = "1"
    bad = [far_due, bad_nanos, long_user, long_body, forging_key, reserved_key, reserved_prefix]
    good = [item(user), item(user)]

    results = notifier.send_batch(good[0], *bad, good[1])

    assert [(r.outcome, r.reason) for r in results] == [
        (ACCEPTED, ""),
        (REJECTED, "due_time is not a valid timestamp"),
        (REJECTED, "expire_time is not a valid timestamp"),
        (REJECTED, "user_id: at most 256 bytes"),
        (REJECTED, "title, body and data are longer than 4096 bytes"),
        (REJECTED, "idempotency_key has characters that are not printable"),
        (REJECTED, "data key 'from' is reserved by the push services"),
        (REJECTED, "data key 'google.sent_time' is reserved by the push services"),
        (ACCEPTED, ""),
    ]
    [alone] = [notifier.stub.Send(pb.SendRequest(notification=far_due), timeout=10).result]
    assert alone.outcome == REJECTED
    # Counted like every answer, though the intake never saw the unreadable ones.
    rejected = ("notifier_items_total", frozenset({("outcome", "rejected")}))
    assert notifier.metrics()[rejected] == len(bad) + 1
    recorded = key_rows(notifier_settings, [m.idempotency_key for m in bad], "idempotency_key")
    assert recorded == [None] * len(bad)
    notifier.wait_delivered(2, user)
    time.sleep(0.3)
    delivered = {p.idempotency_key for p in notifier.delivered()}
    assert not delivered & {m.idempotency_key for m in bad}
