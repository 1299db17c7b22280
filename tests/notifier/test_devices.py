"""Removing devices from the registry on the real Cassandra through a real gRPC server:
one device (UnregisterDevice), every device of a user (DeleteUserDevices), and what a
push then reaches; and the cap's eviction racing a registration of the device it evicts."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from cassandra.cluster import Session
from google.protobuf.message import Message

from genproto.notification.v1 import notification_pb2 as pb
from genproto.notification.v1 import notification_pb2_grpc as pb_grpc
from notifier.delivery.adapters import RecordingPushAdapter
from notifier.domain.model import MAX_DEVICES_PER_USER, Device, Platform
from notifier.domain.push import PushMessage, PushResult
from notifier.settings import NotifierSettings
from notifier.storage.devices import DeviceStore
from reminders_svc.domain.errors import Unavailable
from reminders_svc.storage.session import connect
from tests.grpc_errors import assert_refused
from tests.notifier.conftest import ACCEPTED, Client, item, running_notifier

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def register(notifier: Client, user_id: str, *tokens: str) -> None:
    for token in tokens:
        device = pb.Device(device_token=token, platform=pb.Device.PLATFORM_FCM)
        notifier.stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=user_id, device=device))


def tokens_of(notifier: Client, user_id: str) -> set[str]:
    listed = notifier.stub.ListDevices(pb.ListDevicesRequest(user_id=user_id)).devices
    return {d.device_token for d in listed}


def unregister(notifier: Client, user_id: str, token: str) -> None:
    request = pb.UnregisterDeviceRequest(user_id=user_id, device_token=token)
    notifier.stub.UnregisterDevice(request, timeout=10)


def delete_devices(notifier: Client, user_id: str) -> None:
    request = pb.DeleteUserDevicesRequest(user_id=user_id)
    notifier.stub.DeleteUserDevices(request, timeout=10)


def test_unregister_device_removes_that_device_and_leaves_the_others(
    notifier: Client, user: str
) -> None:
    phone, tablet = f"phone-{user}", f"tablet-{user}"
    register(notifier, user, phone, tablet)

    unregister(notifier, user, phone)

    assert tokens_of(notifier, user) == {tablet}
    notifier.send_batch(item(user))
    assert [p.device_token for p in notifier.delivered(user)] == [tablet]


def test_unregister_device_of_a_device_the_user_does_not_have_succeeds(
    notifier: Client, user: str
) -> None:
    """Clients retry: removing what is gone (or never was) is not an error."""
    phone = f"phone-{user}"
    register(notifier, user, phone)
    unregister(notifier, user, phone)

    unregister(notifier, user, phone)  # a retry
    unregister(notifier, user, f"never-{user}")
    unregister(notifier, f"{user}-without-devices", phone)

    assert tokens_of(notifier, user) == set()


def test_delete_user_devices_removes_every_device_of_that_user_only(
    notifier: Client, user: str
) -> None:
    other = f"{user}-other"
    register(notifier, user, *(f"fcm-{n}-{user}" for n in range(3)))
    register(notifier, other, f"fcm-{other}")

    delete_devices(notifier, user)

    assert tokens_of(notifier, user) == set()
    assert tokens_of(notifier, other) == {f"fcm-{other}"}
    delete_devices(notifier, user)  # a retry
    delete_devices(notifier, f"{user}-never-registered")
    # The user may register again (a new account under the same id).
    register(notifier, user, f"fcm-new-{user}")
    assert tokens_of(notifier, user) == {f"fcm-new-{user}"}


def test_no_token_stays_mapped_to_a_user_whose_devices_are_removed_or_evicted(
    notifier_settings: NotifierSettings, notifier: Client, user: str
) -> None:
    """The token -> owner rows outlived every removal (no TTL, never deleted): an account
    deleted stayed named beside each token it ever registered."""
    tokens = [f"fcm-{n:02}-{user}" for n in range(MAX_DEVICES_PER_USER + 3)]
    for token in tokens:  # the 3 oldest evicted by the cap
        register(notifier, user, token)
        time.sleep(0.002)  # registration times a millisecond apart at least
    taken = tokens[-1]
    register(notifier, f"{user}-other", taken)  # a phone signed in as someone else
    unregister(notifier, user, tokens[-2])

    def owned() -> dict[str, str]:
        cassandra = notifier_settings.cassandra
        with connect(cassandra) as connection:
            rows = connection.session.execute(
                f"SELECT device_token, user_id FROM {cassandra.keyspace}.device_owners"
            )
            return {r.device_token: r.user_id for r in rows if r.device_token in tokens}

    assert owned() == {
        **dict.fromkeys(tokens[3:-2], user),
        taken: f"{user}-other",
    }
    delete_devices(notifier, user)
    assert owned() == {taken: f"{user}-other"}


def test_a_push_after_delete_user_devices_reaches_no_device(
    notifier_settings: NotifierSettings, user: str
) -> None:
    # Without the development device a user without devices would get in its place.
    settings = dataclasses.replace(notifier_settings, auto_device=False)
    no_device = ("notifier_undeliverable_total", frozenset({("reason", "no_device")}))
    with running_notifier(settings) as notifier:
        register(notifier, user, f"phone-{user}", f"tablet-{user}")
        before = item(user)
        notifier.send_batch(before)
        assert len(notifier.delivered(user, before.idempotency_key)) == 2

        delete_devices(notifier, user)
        counted = notifier.metrics().get(no_device, 0)
        after = item(user)

        # Answered once its delivery ended: nowhere to push it, nothing to retry.
        assert [r.outcome for r in notifier.send_batch(after)] == [ACCEPTED]
        assert notifier.delivered(user, after.idempotency_key) == []
        assert notifier.metrics()[no_device] == counted + 1


def test_device_removal_refuses_bad_input_naming_the_field_and_removes_nothing(
    notifier: Client, user: str
) -> None:
    phone = f"phone-{user}"
    register(notifier, user, phone)
    unregister = notifier.stub.UnregisterDevice
    delete = notifier.stub.DeleteUserDevices
    cases: list[tuple[str, Callable[..., Any], Message]] = [
        ("user_id: required", unregister, pb.UnregisterDeviceRequest(device_token=phone)),
        (
            "user_id: at most 256 bytes",
            unregister,
            pb.UnregisterDeviceRequest(user_id="u" * 257, device_token=phone),
        ),
        ("device_token: required", unregister, pb.UnregisterDeviceRequest(user_id=user)),
        (
            "device_token: at most 1024 bytes",
            unregister,
            pb.UnregisterDeviceRequest(user_id=user, device_token="t" * 1025),
        ),
        (
            "device_token: tokens starting with 'auto:' are reserved",
            unregister,
            pb.UnregisterDeviceRequest(user_id=user, device_token=f"auto:{user}"),
        ),
        ("user_id: required", delete, pb.DeleteUserDevicesRequest()),
        (
            "user_id: at most 256 bytes",
            delete,
            pb.DeleteUserDevicesRequest(user_id="u" * 257),
        ),
    ]
    for details, call, request in cases:
        with pytest.raises(grpc.RpcError) as refused:
            call(request, timeout=10)
        assert refused.value.details() == details, request
        # The field at fault, machine-readable, in the notifier's own error domain.
        field = details.split(":", 1)[0]
        assert_refused(refused.value, INVALID, field, "INVALID_FIELD", "notification.v1")

    # Three refusals name this user: each is refused before anything is removed (a token
    # left empty must not read as "every device of the user").
    assert tokens_of(notifier, user) == {phone}


class _DeviceRegisteredAgainOnceListed(DeviceStore):
    """Right after this server's first listing of the user's devices, `device` registers
    again through another server: the eviction this one then makes works from a listing
    older than that registration."""

    def __init__(self, session: Session, keyspace: str, device: Device) -> None:
        super().__init__(session, keyspace)
        self._other_server = DeviceStore(session, keyspace)
        self._registering_again: Device | None = device

    async def list(self, user_id: str) -> tuple[Device, ...]:
        listed = await super().list(user_id)
        if self._registering_again is not None:
            device, self._registering_again = self._registering_again, None
            await self._other_server.register(user_id, device)
        return listed


def test_a_device_registered_again_while_a_new_one_evicts_it_stays_registered(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """A user at the cap registers a new phone while the oldest device registers again
    (its app starts): the new phone's eviction, listed before, used to delete that device
    anyway, and its app believed it was registered. Now it stays, and the other server's
    registration, which lists after the new phone was added, evicts the next oldest."""
    cassandra = notifier_settings.cassandra
    devices = [Device(f"fcm-{n:02}-{user}", Platform.FCM) for n in range(MAX_DEVICES_PER_USER)]
    oldest, next_oldest = devices[0], devices[1]
    new_phone = Device(f"fcm-new-{user}", Platform.FCM)

    async def scenario() -> set[str]:
        with connect(cassandra) as connection:
            registry = DeviceStore(connection.session, cassandra.keyspace)
            for device in devices:
                await registry.register(user, device)
                await asyncio.sleep(0.002)  # registration times a millisecond apart at least
            racing = _DeviceRegisteredAgainOnceListed(
                connection.session, cassandra.keyspace, oldest
            )
            await racing.register(user, new_phone)
            return {d.device_token for d in await registry.list(user)}

    kept = asyncio.run(scenario())

    assert oldest.device_token in kept
    assert new_phone.device_token in kept
    assert next_oldest.device_token not in kept
    assert len(kept) == MAX_DEVICES_PER_USER


class _TokenTakenBeforeTheRowIsWritten(DeviceStore):
    """Right after this server makes the user the token's owner, another user registers
    the same token through another server (the phone signed out and into that account)."""

    def __init__(self, session: Session, keyspace: str, taker: str) -> None:
        super().__init__(session, keyspace)
        self._other_server = DeviceStore(session, keyspace)
        self._taker: str | None = taker

    async def _own(self, user_id: str, token: str) -> None:
        await super()._own(user_id, token)
        if self._taker is not None:
            taker, self._taker = self._taker, None
            await self._other_server.register(taker, Device(token, Platform.FCM))


def test_a_token_taken_by_another_user_mid_registration_reaches_only_that_user(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """The other user's registration found no row of this user's to remove, and this
    one's row landed after it: this user's reminders went to the other user's phone."""
    cassandra = notifier_settings.cassandra
    phone = Device(f"fcm-shared-{user}", Platform.FCM)
    other = f"{user}-other"

    async def scenario() -> tuple[Device, set[str], set[str]]:
        with connect(cassandra) as connection:
            registry = DeviceStore(connection.session, cassandra.keyspace)
            racing = _TokenTakenBeforeTheRowIsWritten(connection.session, cassandra.keyspace, other)
            answered = await racing.register(user, phone)
            mine = {d.device_token for d in await registry.list(user)}
            theirs = {d.device_token for d in await registry.list(other)}
            return answered, mine, theirs

    answered, mine, theirs = asyncio.run(scenario())

    assert answered.device_token == phone.device_token
    assert mine == set()
    assert theirs == {phone.device_token}


class _RemovalFailsOnce(DeviceStore):
    """A registry whose first removal does not answer, as a storage timeout would."""

    failed = False

    async def remove(self, user_id: str, device_token: str) -> None:
        if not self.failed:
            self.failed = True
            raise Unavailable("storage did not answer")
        await super().remove(user_id, device_token)


def test_a_token_moved_to_another_user_by_a_registration_retried_leaves_the_first_user(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """A phone signed out of one user and into another: the registration's removal of the
    token from the first user failed after the owner had moved, and its retry found the
    move done and stopped there, leaving the token on both users' devices (the first
    user's reminders, texts included, on the other user's phone)."""
    cassandra = notifier_settings.cassandra
    phone = Device(f"fcm-moved-{user}", Platform.FCM)
    other = f"{user}-other"

    async def scenario() -> tuple[set[str], set[str]]:
        with connect(cassandra) as connection:
            registry = DeviceStore(connection.session, cassandra.keyspace)
            await registry.register(user, phone)
            flaky = _RemovalFailsOnce(connection.session, cassandra.keyspace)
            with contextlib.suppress(Unavailable):
                await flaky.register(other, phone)
            await flaky.register(other, phone)  # the app's retry
            mine = {d.device_token for d in await registry.list(user)}
            theirs = {d.device_token for d in await registry.list(other)}
            return mine, theirs

    assert asyncio.run(scenario()) == (set(), {phone.device_token})


def test_a_row_left_behind_for_a_token_another_user_owns_is_neither_listed_nor_kept(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """A removal that failed halfway (an unregistration, a registration by another user)
    leaves this user's row of a token another user owns now: never listed, never pushed."""
    cassandra = notifier_settings.cassandra
    phone = Device(f"fcm-left-{user}", Platform.FCM)
    other = f"{user}-other"

    async def scenario() -> tuple[set[str], int]:
        with connect(cassandra) as connection:
            registry = DeviceStore(connection.session, cassandra.keyspace)
            await registry.register(other, phone)
            connection.session.execute(
                "INSERT INTO devices (user_id, device_token, platform, registered_at)"
                " VALUES (%s, %s, %s, toTimestamp(now()))",
                (user, phone.device_token, Platform.FCM.value),
            )
            listed = {d.device_token for d in await registry.list(user)}
            rows = connection.session.execute(
                "SELECT device_token FROM devices WHERE user_id = %s", (user,)
            )
            return listed, len(list(rows))

    assert asyncio.run(scenario()) == (set(), 0)


class _GoneThoughRegisteredAgain(RecordingPushAdapter):
    """Answers the first push "device gone" (the token the app had before), after the app
    registered that same token again (started anew) while the push was under way."""

    def __init__(self, user_id: str) -> None:
        super().__init__(100)
        self._user_id = user_id
        self.target = ""  # the notifier's own, once it listens
        self.pushes = 0

    async def push(self, message: PushMessage) -> PushResult:
        self.pushes += 1
        if self.pushes > 1:
            return await super().push(message)
        await asyncio.sleep(0.002)  # a registration time a millisecond later at least
        await asyncio.to_thread(self._register_again, message.device_token)
        return PushResult.DEVICE_GONE

    def _register_again(self, token: str) -> None:
        with grpc.insecure_channel(self.target) as channel:
            stub = pb_grpc.NotificationServiceStub(channel)
            device = pb.Device(device_token=token, platform=pb.Device.PLATFORM_FCM)
            stub.RegisterDevice(pb.RegisterDeviceRequest(user_id=self._user_id, device=device))


def test_a_device_answered_gone_but_registered_again_meanwhile_stays_registered(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """The push service's "gone" speaks of the registration the push was made from: one
    made since (the app started again) is in use. It was removed with the old one, and
    the user's reminders reached no device until the app's next start."""
    phone = f"fcm-phone-{user}"
    adapter = _GoneThoughRegisteredAgain(user)
    with running_notifier(notifier_settings, adapter) as notifier:
        adapter.target = notifier.target
        register(notifier, user, phone)
        [answer] = notifier.send_batch(item(user))
        assert answer.outcome == ACCEPTED
        assert adapter.pushes == 1
        assert tokens_of(notifier, user) == {phone}
