"""What the notifier is asked to send, to whom, and what it answers per item."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from reminders_svc.domain.errors import InvalidArgument
from reminders_svc.domain.reminder import user_id_problem as reminders_user_id_problem

MAX_BATCH_ITEMS = 500
# Keys are "<reminder_id>/<due as RFC 3339>" for reminders (64 bytes); anything much
# longer is a caller bug, and a row key we would keep for a month.
MAX_KEY_BYTES = 256
# APNs and FCM both refuse a payload over 4 KB: title, body and data (keys and values)
# must fit in it, or no push of the item could ever succeed.
MAX_CONTENT_BYTES = 4096
# APNs tokens are 64 hex digits, FCM registration tokens ~160 characters.
MAX_DEVICE_TOKEN_BYTES = 1024
# Tokens rotate (FCM) and reinstalls leave old ones that only a failed push removes:
# a user keeps this many, the most recently registered, so a push fans out to a bounded
# set and the registry's partition stays small.
MAX_DEVICES_PER_USER = 50
# A device token the service makes up for a user without devices (development only).
AUTO_DEVICE_PREFIX = "auto:"


class Priority(enum.Enum):
    URGENT = "urgent"
    BULK = "bulk"

    @property
    def rank(self) -> int:
        """Lower goes first."""
        return 0 if self is Priority.URGENT else 1


class Platform(enum.Enum):
    APNS = "apns"
    FCM = "fcm"


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    RETRYABLE = "retryable"


@dataclass(frozen=True)
class Notification:
    idempotency_key: str
    user_id: str
    priority: Priority
    title: str
    body: str
    data: Mapping[str, str] = field(default_factory=dict)
    due_time: datetime | None = None
    expire_time: datetime | None = None
    # When its sender first handed the key off; the due when unset.
    first_send_time: datetime | None = None

    def expired_at(self, now: datetime) -> bool:
        return self.expire_time is not None and self.expire_time <= now

    def retry_since(self) -> datetime | None:
        """Since when a push service asking for retries has been waited out: the later of
        the due and the first hand-off, so a ring handed off late gets the whole bound."""
        known = [at for at in (self.due_time, self.first_send_time) if at is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class ItemResult:
    idempotency_key: str
    outcome: Outcome
    reason: str = ""


class Settlement(enum.Enum):
    """How delivering a key ended, kept on its row: every later attempt at the key is
    answered from it, whichever replica it reaches."""

    PUSHED = "pushed"
    # Accepted with nowhere to push it (the user has no device): nothing to retry.
    NO_DEVICE = "no_device"
    # Written before 2026-12-06 when an item's expiry passed before a push (now a
    # HandBack.EXPIRED, the key released); such rows are still answered "expired".
    EXPIRED = "expired"
    # No device took it: the push service refused it for good, or asked for a retry at
    # every attempt, and it was handed back (HandBack.PUSH_RETRIES_EXHAUSTED) until
    # `give_up_after` past its due or its first hand-off, whichever came later.
    UNDELIVERABLE = "undeliverable"


class HandBack(enum.Enum):
    """Why a delivery ended undelivered and unsettled: its caller is answered "retry" and
    sends the key again later. This attempt's hold on the key is released for that retry,
    except on KEY_TAKEN_OVER, where the key is another attempt's to deliver."""

    # The notifier stops past its grace with the item queued or mid-push.
    STOPPING = "stopping"
    # The push service asked for a retry at every attempt (throttled, 5xx): a ring must
    # not be given up for a push service outage shorter than the sender's retries.
    PUSH_RETRIES_EXHAUSTED = "push_retries_exhausted"
    # Another attempt took the key over while the item waited here: it pushes instead.
    KEY_TAKEN_OVER = "key_taken_over"
    # Delivering it failed unexpectedly (a bug).
    ERROR = "error"
    # Its expiry passed before any device took it (a long queue, a storage outage): the
    # attempt that sent it is answered "expired", but the key is not settled so: the
    # sender's next attempt, with an expiry of its own (a ring re-claimed after an
    # outage), is pushed.
    EXPIRED = "expired"


# The answer while another attempt holds the key and may still deliver it.
HELD_ELSEWHERE_REASON = "another attempt is delivering this key"
EXPIRED_REASON = "expired"
_HANDED_BACK_REASONS = {
    HandBack.STOPPING: "not delivered (notifier stopping); send again",
    HandBack.PUSH_RETRIES_EXHAUSTED: (
        "not delivered (the push service asked to retry every attempt); send again"
    ),
    HandBack.KEY_TAKEN_OVER: HELD_ELSEWHERE_REASON,
    HandBack.ERROR: "not delivered (internal error); send again",
    HandBack.EXPIRED: "expired in the queue before this attempt; send again",
}


def delivery_result(key: str, end: Settlement | HandBack, *, first: bool) -> ItemResult:
    """The answer for a key whose delivery ended as `end` (a HandBack: not delivered);
    `first` for the attempt that delivered it, else a repeat of the key."""
    if end is HandBack.EXPIRED and first:
        return ItemResult(key, Outcome.REJECTED, EXPIRED_REASON)  # its own expiry passed
    if isinstance(end, HandBack):
        return ItemResult(key, Outcome.RETRYABLE, _HANDED_BACK_REASONS[end])
    if end is Settlement.EXPIRED:
        return ItemResult(key, Outcome.REJECTED, EXPIRED_REASON)
    if end is Settlement.UNDELIVERABLE:
        return ItemResult(key, Outcome.REJECTED, "the push service refused every attempt")
    return ItemResult(key, Outcome.ACCEPTED if first else Outcome.DUPLICATE)


@dataclass(frozen=True)
class Device:
    device_token: str
    # None for the implicit development device, which no push service knows.
    platform: Platform | None
    register_time: datetime | None = None

    @property
    def is_implicit(self) -> bool:
        return is_implicit_token(self.device_token)


def is_implicit_token(device_token: str) -> bool:
    return device_token.startswith(AUTO_DEVICE_PREFIX)


def devices_beyond_cap(devices: Iterable[Device], *, keep: int) -> list[Device]:
    """The devices to forget so that `keep` remain: the least recently registered."""
    newest_first = sorted(
        devices,
        key=lambda d: (d.register_time or datetime.min.replace(tzinfo=UTC), d.device_token),
        reverse=True,
    )
    return newest_first[keep:]


def implicit_device(user_id: str) -> Device:
    return Device(device_token=f"{AUTO_DEVICE_PREFIX}{user_id}", platform=None)


def rejection(notification: Notification) -> ItemResult | None:
    """The REJECTED answer for an item that can never be sent, or None if it may be (an
    expired one may still have been delivered by an earlier attempt: see Intake)."""
    key = notification.idempotency_key

    def rejected(reason: str) -> ItemResult:
        return ItemResult(key, Outcome.REJECTED, reason)

    if not key:
        return rejected("idempotency_key is required")
    if len(key.encode()) > MAX_KEY_BYTES:
        return rejected(f"idempotency_key is longer than {MAX_KEY_BYTES} bytes")
    if not key.isprintable():
        # Keys are logged: a line break or other control in one would forge log lines.
        return rejected("idempotency_key has characters that are not printable")
    user_problem = user_id_problem(notification.user_id)
    if user_problem is not None:
        return rejected(user_problem.message)
    if content_bytes(notification) > MAX_CONTENT_BYTES:
        return rejected(f"title, body and data are longer than {MAX_CONTENT_BYTES} bytes")
    reserved = sorted(key for key in notification.data if _is_reserved_data_key(key))
    if reserved:
        # FCM refuses the whole message (INVALID_ARGUMENT), APNs' payload would clash.
        return rejected(f"data key {reserved[0]!r} is reserved by the push services")
    return None


# Keys FCM reserves in a message's data ("from", "message_type", and any starting with
# "google" or "gcm"), and the ones an APNs payload or FCM's message carry themselves.
_RESERVED_DATA_KEYS = frozenset({"from", "message_type", "notification", "aps"})
_RESERVED_DATA_PREFIXES = ("google", "gcm")


def _is_reserved_data_key(key: str) -> bool:
    return key in _RESERVED_DATA_KEYS or key.startswith(_RESERVED_DATA_PREFIXES)


def content_bytes(notification: Notification) -> int:
    """The size of what a push carries: title, body, and data's keys and values."""
    texts = (notification.title, notification.body)
    return sum(len(text.encode()) for text in texts) + data_bytes(notification.data)


def data_bytes(data: Mapping[str, str]) -> int:
    """The size of a push's data: its keys and values, UTF-8."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in data.items())


def user_id_problem(user_id: str) -> InvalidArgument | None:
    """Why `user_id` names no user (the API refuses such a subject too), or None."""
    problem = reminders_user_id_problem(user_id)
    return None if problem is None else InvalidArgument("user_id", problem)


def device_problem(user_id: str, device: Device) -> InvalidArgument | None:
    """Why a device cannot be registered, or None."""
    problem = device_token_problem(user_id, device.device_token, field="device.device_token")
    if problem is not None:
        return problem
    if not device.device_token.isprintable() or not device.device_token.strip():
        # APNs and FCM tokens are printable; one with a line break would forge log lines.
        # (Checked at registration only: a token stored before can still be removed.)
        return InvalidArgument("device.device_token", "must be printable and not blank")
    if device.platform is None:
        return InvalidArgument("device.platform", "must be APNS or FCM")
    return None


def device_token_problem(user_id: str, device_token: str, *, field: str) -> InvalidArgument | None:
    """Why (`user_id`, `device_token`) names no device a user could have registered, or
    None; `field` is where the request carries the token."""
    user_problem = user_id_problem(user_id)
    if user_problem is not None:
        return user_problem
    if not device_token:
        return InvalidArgument(field, "required")
    if len(device_token.encode()) > MAX_DEVICE_TOKEN_BYTES:
        return InvalidArgument(field, f"at most {MAX_DEVICE_TOKEN_BYTES} bytes")
    if is_implicit_token(device_token):
        return InvalidArgument(field, f"tokens starting with {AUTO_DEVICE_PREFIX!r} are reserved")
    return None
