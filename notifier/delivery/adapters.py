"""The push adapters of the reference service. Real APNs / FCM adapters implement the
same `PushAdapter` protocol (notifier.domain.push)."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from notifier.domain.model import Priority, data_bytes
from notifier.domain.push import PushAdapter, PushMessage, PushResult

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class LoggingPushAdapter:
    """Logs each push by key and sizes only: titles, bodies and data are personal and
    never reach the logs (DESIGN.md invariant 10)."""

    name = "logging"

    async def push(self, message: PushMessage) -> PushResult:
        log.info(
            "push key=%s collapse_id=%s platform=%s priority=%s"
            " title_bytes=%d body_bytes=%d data_bytes=%d",
            message.idempotency_key,
            message.collapse_id,
            message.platform.value if message.platform is not None else "implicit",
            message.priority.value,
            len(message.title.encode()),
            len(message.body.encode()),
            data_bytes(message.data),
        )
        return PushResult.OK


@dataclass(frozen=True)
class DeliveredPush:
    idempotency_key: str
    user_id: str
    device_token: str
    title: str
    body: str
    push_time: datetime
    due_time: datetime | None
    priority: Priority


class RecordingPushAdapter:
    """Keeps what was pushed in memory (bounded; oldest dropped), for tests and demos.

    Each push is numbered in push order, so a listing continues after the last one it
    returned however many older ones were dropped meanwhile."""

    name = "recording"

    def __init__(self, capacity: int, clock: Clock = utc_now) -> None:
        self._pushed: deque[tuple[int, DeliveredPush]] = deque(maxlen=capacity)
        self._numbers = itertools.count(1)
        self._clock = clock

    async def push(self, message: PushMessage) -> PushResult:
        pushed = DeliveredPush(
            idempotency_key=message.idempotency_key,
            user_id=message.user_id,
            device_token=message.device_token,
            title=message.title,
            body=message.body,
            push_time=self._clock(),
            due_time=message.due_time,
            priority=message.priority,
        )
        self._pushed.append((next(self._numbers), pushed))
        return PushResult.OK

    def delivered(self, user_id: str = "", idempotency_key: str = "") -> list[DeliveredPush]:
        """In push order; an empty filter matches everything."""
        return self.page(user_id, idempotency_key)[0]

    def page(
        self, user_id: str = "", idempotency_key: str = "", after: int = 0, limit: int | None = None
    ) -> tuple[list[DeliveredPush], int | None]:
        """In push order, those numbered past `after`, at most `limit`; an empty filter
        matches everything. With them, the number to continue after, or None when no
        other push matches."""
        matching = (
            (number, push)
            for number, push in self._pushed
            if number > after
            and (not user_id or push.user_id == user_id)
            and (not idempotency_key or push.idempotency_key == idempotency_key)
        )
        page = list(itertools.islice(matching, limit))
        more = limit is not None and len(page) == limit and next(matching, None) is not None
        return [push for _, push in page], page[-1][0] if more else None


def build_adapter(name: str, recording_capacity: int) -> PushAdapter:
    if name == "recording":
        return RecordingPushAdapter(recording_capacity)
    if name == "logging":
        return LoggingPushAdapter()
    raise ValueError(f"unknown push adapter {name!r}")
