"""notification.v1 messages <-> domain values."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from genproto.notification.v1 import notification_pb2 as pb
from notifier.delivery.adapters import DeliveredPush
from notifier.domain.model import Device, ItemResult, Notification, Outcome, Platform, Priority

_PRIORITY_FROM_PB = {pb.PRIORITY_URGENT: Priority.URGENT}
_PRIORITY_TO_PB = {Priority.URGENT: pb.PRIORITY_URGENT, Priority.BULK: pb.PRIORITY_BULK}
_OUTCOME_TO_PB = {
    Outcome.ACCEPTED: pb.SendResult.OUTCOME_ACCEPTED,
    Outcome.DUPLICATE: pb.SendResult.OUTCOME_DUPLICATE,
    Outcome.REJECTED: pb.SendResult.OUTCOME_REJECTED,
    Outcome.RETRYABLE: pb.SendResult.OUTCOME_RETRYABLE,
}
_PLATFORM_FROM_PB = {pb.Device.PLATFORM_APNS: Platform.APNS, pb.Device.PLATFORM_FCM: Platform.FCM}
_PLATFORM_TO_PB = {platform: value for value, platform in _PLATFORM_FROM_PB.items()}


def _instant(message: pb.Notification | pb.Device, name: str) -> datetime | None:
    if not message.HasField(name):  # type: ignore[arg-type]
        return None
    stamp: Timestamp = getattr(message, name)
    return stamp.ToDatetime(tzinfo=UTC)


def _stamp(instant: datetime | None) -> Timestamp | None:
    if instant is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(instant)
    return stamp


def notification(message: pb.Notification) -> Notification:
    return Notification(
        idempotency_key=message.idempotency_key,
        user_id=message.user_id,
        # UNSPECIFIED is BULK, as the contract says.
        priority=_PRIORITY_FROM_PB.get(message.priority, Priority.BULK),
        title=message.title,
        body=message.body,
        data=dict(message.data),
        due_time=_instant(message, "due_time"),
        expire_time=_instant(message, "expire_time"),
    )


def send_result(result: ItemResult) -> pb.SendResult:
    return pb.SendResult(
        idempotency_key=result.idempotency_key,
        outcome=_OUTCOME_TO_PB[result.outcome],
        reason=result.reason,
    )


def device(message: pb.Device) -> Device:
    return Device(
        device_token=message.device_token,
        platform=_PLATFORM_FROM_PB.get(message.platform),
        register_time=_instant(message, "register_time"),
    )


def device_message(value: Device) -> pb.Device:
    return pb.Device(
        device_token=value.device_token,
        platform=(
            _PLATFORM_TO_PB[value.platform]
            if value.platform is not None
            else pb.Device.PLATFORM_UNSPECIFIED
        ),
        register_time=_stamp(value.register_time),
    )


def delivered_message(push: DeliveredPush) -> pb.Delivered:
    return pb.Delivered(
        idempotency_key=push.idempotency_key,
        user_id=push.user_id,
        device_token=push.device_token,
        title=push.title,
        body=push.body,
        push_time=_stamp(push.push_time),
        due_time=_stamp(push.due_time),
        priority=_PRIORITY_TO_PB[push.priority],
    )
