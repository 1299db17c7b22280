"""The push-adapter interface, shaped to fit APNs and FCM.

APNs: device token, `apns-collapse-id` (<= 64 bytes), `apns-priority` 10 / 5,
`apns-expiration`; FCM: registration token, `collapse_key` and `android.notification.tag`
(both the collapse id: `collapse_key` only collapses messages queued for an offline
device, the tag replaces a notification already shown), the `apns-collapse-id` header for
iOS through FCM, android priority high / normal, `ttl`. A push answers ok, retry
(throttled, 5xx, timeout), device gone (APNs 410 Unregistered, FCM UNREGISTERED: the
token is dropped from the registry) or refused (a message the service will never take).
A push that does not answer within the notifier's `REMINDERS_NOTIFIER_PUSH_TIMEOUT_S` is
abandoned and counted a retry, so an adapter hung on a dead connection cannot hold a
push worker for ever.
"""

from __future__ import annotations

import base64
import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from notifier.domain.model import Device, Notification, Platform, Priority


class PushResult(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    DEVICE_GONE = "device_gone"
    # Refused for good, the device still there (APNs 400 such as PayloadTooLarge or
    # BadCollapseId, 403 on a bad provider token; FCM INVALID_ARGUMENT, SENDER_ID_MISMATCH):
    # retrying cannot help. No device took it: given up on (rejected) at once.
    REFUSED = "refused"


@dataclass(frozen=True)
class PushMessage:
    device_token: str
    platform: Platform | None
    idempotency_key: str
    # Derived from the key: a repeated push replaces, not adds, on the device.
    collapse_id: str
    priority: Priority
    expire_time: datetime | None
    title: str
    body: str
    data: Mapping[str, str]
    # Not sent to the push service; for the recording adapter and lateness accounting.
    user_id: str
    due_time: datetime | None


class PushAdapter(Protocol):
    @property
    def name(self) -> str:
        """A short label for metrics: 'recording', 'logging', 'apns', ..."""
        ...

    async def push(self, message: PushMessage) -> PushResult: ...


# APNs refuses an `apns-collapse-id` over 64 bytes; FCM's collapse_key has no tighter limit.
MAX_COLLAPSE_ID_BYTES = 64
_DIGEST_PREFIX = "k1-"


def collapse_id(idempotency_key: str) -> str:
    """The key itself when it fits (a reminder's key is 64 bytes with a UUID id), else a
    digest of it: stable across replicas and retries, so a repeat still collapses."""
    if len(idempotency_key.encode()) <= MAX_COLLAPSE_ID_BYTES:
        return idempotency_key
    digest = hashlib.sha256(idempotency_key.encode()).digest()
    return _DIGEST_PREFIX + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def push_message(notification: Notification, device: Device) -> PushMessage:
    return PushMessage(
        device_token=device.device_token,
        platform=device.platform,
        idempotency_key=notification.idempotency_key,
        collapse_id=collapse_id(notification.idempotency_key),
        priority=notification.priority,
        expire_time=notification.expire_time,
        title=notification.title,
        body=notification.body,
        data=notification.data,
        user_id=notification.user_id,
        due_time=notification.due_time,
    )
