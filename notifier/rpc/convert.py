"""notification.v1 messages <-> domain values."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from genproto.notification.v1 import notification_pb2 as pb
from notifier.delivery.adapters import DeliveredPush
from notifier.domain.model import Device, ItemResult, Notification, Outcome, Platform, Priority
from reminders_svc.timestamps import timestamp

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


class InvalidTimestamp(ValueError):
    """A timestamp field outside what a datetime holds (years 1 to 9999, nanos < 1 s)."""

    def __init__(self, field: str) -> None:
        super().__init__(f"{field} is not a valid timestamp")


def _instant(message: pb.Notification, name: str) -> datetime | None:
    if not message.HasField(name):  # type: ignore[arg-type]
        return None
    stamp: Timestamp = getattr(message, name)
    try:
        return stamp.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise InvalidTimestamp(name) from None


def notification(message: pb.Notification) -> Notification:
    """Raises InvalidTimestamp naming the field."""
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
        first_send_time=_instant(message, "first_send_time"),
    )


def send_result(result: ItemResult) -> pb.SendResult:
    return pb.SendResult(
        idempotency_key=result.idempotency_key,
        outcome=_OUTCOME_TO_PB[result.outcome],
        reason=result.reason,
    )


def device(message: pb.Device) -> Device:
    """A device to register: its register_time is the registry's to set, not read."""
    return Device(
        device_token=message.device_token, platform=_PLATFORM_FROM_PB.get(message.platform)
    )


def device_message(value: Device) -> pb.Device:
    return pb.Device(
        device_token=value.device_token,
        platform=(
            _PLATFORM_TO_PB[value.platform]
            if value.platform is not None
            else pb.Device.PLATFORM_UNSPECIFIED
        ),
        register_time=timestamp(value.register_time),
    )


def delivered_message(push: DeliveredPush) -> pb.Delivered:
    return pb.Delivered(
        idempotency_key=push.idempotency_key,
        user_id=push.user_id,
        device_token=push.device_token,
        title=push.title,
        body=push.body,
        push_time=timestamp(push.push_time),
        due_time=timestamp(push.due_time),
        priority=_PRIORITY_TO_PB[push.priority],
    )
