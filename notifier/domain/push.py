"""The push-adapter interface, shaped to fit APNs and FCM.

APNs: device token, `apns-collapse-id` (<= 64 bytes), `apns-priority` 10 / 5,
`apns-expiration`; FCM: registration token, `android.notification.tag` (the collapse id:
a repeated push replaces the notification shown), the `apns-collapse-id` header for iOS
through FCM, android priority high / normal, `ttl`. Not FCM's `collapse_key`: FCM keeps
at most four distinct collapse keys per offline device and drops the rest, and every
ring's key is distinct, so an offline phone would lose all but four of its reminders.

A push answers one of `PushResult`; how an adapter maps the service's answers decides
whether a ring is retried, dropped with its token, or given up, so the mapping is part
of this interface (see `PushResult`). A push that does not answer within the notifier's
`REMINDERS_NOTIFIER_PUSH_TIMEOUT_S` is abandoned and counted a retry, so an adapter hung
on a dead connection cannot hold a push worker for ever.
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
    # Not now, maybe later: throttled (APNs 429, FCM QUOTA_EXCEEDED), the service failing
    # (5xx, UNAVAILABLE, INTERNAL), a timeout; and the sender's own credentials refused
    # (APNs 403 ExpiredProviderToken / InvalidProviderToken, FCM 401
    # THIRD_PARTY_AUTH_ERROR): that fails every push until an operator mends it, so it is
    # retried and handed back (the ring waits), never given up as this one message's fault.
    RETRY = "retry"
    # This token will never take a push again (APNs 410 Unregistered, 400 BadDeviceToken
    # or DeviceTokenNotForTopic; FCM UNREGISTERED, SENDER_ID_MISMATCH): dropped from the
    # registry; the user's other devices still get the ring.
    DEVICE_GONE = "device_gone"
    # This message will never be taken, the device still there (APNs 400 such as
    # PayloadTooLarge or BadCollapseId; FCM INVALID_ARGUMENT): retrying cannot help. No
    # device took it: given up on (rejected) at once.
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


# APNs refuses an `apns-collapse-id` over 64 bytes; an FCM tag has no tighter limit.
MAX_COLLAPSE_ID_BYTES = 64
_DIGEST_PREFIX = "k1-"


def collapse_id(idempotency_key: str) -> str:
    """The key itself when it fits as an HTTP/2 header value (a reminder's key is 64 bytes
    of ASCII with a UUID id), else a digest of it: stable across replicas and retries, so
    a repeat still collapses."""
    if (
        len(idempotency_key) <= MAX_COLLAPSE_ID_BYTES
        and idempotency_key.isascii()
        and idempotency_key.isprintable()
    ):
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
