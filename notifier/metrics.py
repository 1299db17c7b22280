"""Prometheus metrics of the notifier. Labels are small fixed sets (outcomes, adapter
results, priorities), never keys, users or texts."""

from __future__ import annotations

import enum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from notifier.domain.model import HandBack, Outcome, Priority
from notifier.domain.push import PushResult


class Undeliverable(enum.Enum):
    """Why a notification was given up on (notifier_undeliverable_total's reason)."""

    NO_DEVICE = "no_device"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    REFUSED = "refused"


class NotifierMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.items = Counter(
            "notifier_items",
            "Notifications answered, by outcome (accepted, duplicate, rejected, retryable).",
            ("outcome",),
            registry=registry,
        )
        self.pushes = Counter(
            "notifier_pushes",
            "Pushes to devices, by adapter and result ("
            + ", ".join(result.value for result in PushResult)
            + ").",
            ("adapter", "result"),
            registry=registry,
        )
        self.queue_depth = Gauge(
            "notifier_queue_depth",
            "Recorded notifications waiting for a push worker, by priority (answered once pushed).",
            ("priority",),
            registry=registry,
        )
        self.expired_in_queue = Counter(
            "notifier_expired_in_queue",
            "Notifications handed back (answered retry, their keys released) because their"
            " expiry passed in the queue, before any device took them; counted in"
            " notifier_handed_back_total as expired too.",
            ("priority",),
            registry=registry,
        )
        self.undeliverable = Counter(
            "notifier_undeliverable",
            "Notifications given up on, by reason: no_device (answered accepted with nowhere "
            "to push them), attempts_exhausted (no device took it, the push service asking "
            "for a retry every time, for longer than the give-up bound past its due; until "
            "then such items are handed back: notifier_handed_back_total), refused (the "
            "push service refused it for good and no device took it).",
            ("reason",),
            registry=registry,
        )
        self.overloaded = Counter(
            "notifier_overloaded",
            "Notifications answered retry (overloaded) with nothing recorded, because as "
            "many of their priority as REMINDERS_NOTIFIER_MAX_PENDING were under way.",
            ("priority",),
            registry=registry,
        )
        self.handed_back = Counter(
            "notifier_handed_back",
            "Notifications handed back undelivered, their callers answered retry, by reason: "
            "stopping (past the shutdown grace, queued or mid-push), push_retries_exhausted "
            "(the push service asked for a retry at every attempt), key_taken_over (another "
            "attempt took the key while the item waited; it pushes instead), expired (its "
            "attempt's expiry passed before a push; the sender's next attempt has its own), "
            "error (a bug). "
            "Their keys are released, but for key_taken_over, so a retry pushes them.",
            ("reason",),
            registry=registry,
        )
        self.key_takeovers = Counter(
            "notifier_key_takeovers",
            "Keys taken over from an attempt that held them unsettled past the takeover "
            "bound (a notifier that died mid-delivery, or never heard its write land).",
            registry=registry,
        )
        self.push_lateness = Histogram(
            "notifier_push_lateness_seconds",
            "From a notification's due time to its successful push, by priority.",
            ("priority",),
            registry=registry,
            # A push may go out up to PUSH_GIVE_UP_AFTER_S (1 h at most) after the later of
            # its due and its first hand-off: 3600 and 7200 keep those in finite buckets
            # (past the last one, a quantile reads as that bucket).
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800, 3600, 7200),
        )
        self.storage_up = Gauge(
            "notifier_storage_up",
            "1 while Cassandra answers the health probe, else 0.",
            registry=registry,
        )
        # Export every label value from the start, so dashboards see zeros, not gaps.
        for outcome in Outcome:
            self.items.labels(outcome.value)
        for hand_back in HandBack:
            self.handed_back.labels(hand_back.value)
        for reason in Undeliverable:
            self.undeliverable.labels(reason.value)
        for priority in Priority:
            self.queue_depth.labels(priority.value).set(0)
            self.expired_in_queue.labels(priority.value)
            self.overloaded.labels(priority.value)

    def export_adapter(self, adapter: str) -> None:
        """Every push result of `adapter` from the start (zeros, not gaps: the first
        increment of a series born later is lost to rate())."""
        for result in PushResult:
            self.pushes.labels(adapter, result.value)

    def count_undeliverable(self, reason: Undeliverable) -> None:
        self.undeliverable.labels(reason.value).inc()

    def count_push(self, adapter: str, result: PushResult) -> None:
        self.pushes.labels(adapter, result.value).inc()
