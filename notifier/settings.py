"""Notifier settings, read from REMINDERS_NOTIFIER_* (and REMINDERS_CASSANDRA_*) at startup."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from reminders_svc.config import (
    CassandraSettings,
    ConfigError,
    Env,
    Retention,
    in_development,
    require_protected,
)
from reminders_svc.tls import NOTIFIER_SERVER_PREFIX, ServerTls

AdapterName = Literal["recording", "logging"]
PREFIX = "REMINDERS_NOTIFIER_"


@dataclass(frozen=True)
class Faults:
    """Fault injection for the dispatcher's tests; all off unless REMINDERS_NOTIFIER_FAULTS
    names them, e.g. `drop_reply:2`, `crash_before_push`, `reject` or `retry`."""

    # The first N SendBatch calls are processed in full but answered UNAVAILABLE.
    drop_reply: int = 0
    # SIGKILL this process when its first push is about to go out (keys recorded, nothing
    # pushed, nothing answered): what a notifier killed mid-delivery leaves behind.
    crash_before_push: bool = False
    # Every SendBatch item is answered REJECTED ("fault injected"), nothing recorded or
    # pushed: an answer the notifier gives for good (an expired item, say) on demand.
    reject: bool = False
    # Every SendBatch item is answered RETRYABLE ("fault injected"), nothing recorded or
    # pushed: a notifier its senders reach that cannot deliver (its push service down).
    retry: bool = False

    @classmethod
    def parse(cls, text: str) -> Faults:
        faults = cls()
        for spec in filter(None, (part.strip() for part in text.split(","))):
            name, _, count = spec.partition(":")
            if name == "drop_reply" and count.isdecimal() and int(count) > 0:
                faults = dataclasses.replace(faults, drop_reply=int(count))
            elif name in _SWITCHES and not count:
                faults = dataclasses.replace(faults, **{name: True})
            else:
                raise ConfigError(f"{PREFIX}FAULTS={text!r}: unknown fault {spec!r}")
        return faults

    @property
    def any(self) -> bool:
        return self != Faults()


# The faults named without a count: on or off.
_SWITCHES = frozenset(f.name for f in dataclasses.fields(Faults) if f.type in (bool, "bool"))


@dataclass(frozen=True)
class NotifierSettings:
    host: str = "127.0.0.1"
    port: int = 50061
    metrics_port: int = 9465
    cassandra: CassandraSettings = field(
        default_factory=lambda: CassandraSettings(keyspace="notifier")
    )
    # Keys outlive any catch-up (the dispatcher's retention is 7 days), so a late retry
    # of an alert already sent is still answered DUPLICATE.
    key_ttl: timedelta = timedelta(days=30)
    # A key recorded but not settled for this long is taken over by a new attempt at it:
    # its holder died or never heard its write land. Longer than a live delivery takes
    # (push retries included: 5 attempts from 1 s backoff is ~15 s).
    key_takeover_after: timedelta = timedelta(seconds=60)
    adapter: AdapterName = "logging"
    # Development: users without devices get "auto:<user_id>", so pushes are observable.
    auto_device: bool = False
    push_workers: int = 16
    # Items being recorded at once, per priority, over all calls.
    batch_concurrency: int = 64
    # Deliveries under way at once, per priority; past it new items are answered "retry".
    max_pending: int = 10_000
    push_max_attempts: int = 5
    push_retry_backoff: timedelta = timedelta(seconds=1)
    # One push to one device: past this it is abandoned and counted a retry.
    push_timeout: timedelta = timedelta(seconds=10)
    # A notification no device took (the push service asked for a retry every time) is
    # handed back to its sender for this long after its due, then given up (rejected).
    push_give_up_after: timedelta = timedelta(hours=1)
    # The recording adapter keeps at most this many pushes (oldest dropped).
    recording_capacity: int = 100_000
    shutdown_grace: timedelta = timedelta(seconds=20)
    health_probe_interval: timedelta = timedelta(seconds=3)
    faults: Faults = Faults()
    # TLS of the gRPC port, from REMINDERS_NOTIFIER_SERVER_TLS_* (SERVER_: the
    # dispatchers' REMINDERS_NOTIFIER_TLS_* are the client side of the same link, and
    # the processes share one ConfigMap). None: plaintext (local development, or a mesh).
    tls: ServerTls | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NotifierSettings:
        values = os.environ if environ is None else environ
        env = Env(values, PREFIX)
        dev = in_development(values)

        def seconds(name: str, default: timedelta, low: float = 0.05) -> timedelta:
            return env.seconds(name, default, low=low, high=3600)

        def count(name: str, default: int) -> int:
            return env.integer(name, default, low=1, high=100_000)

        cassandra = CassandraSettings.from_env(values)
        settings = cls(
            host=env.text("HOST", cls.host),
            port=env.port("PORT", cls.port),
            metrics_port=env.port("METRICS_PORT", cls.metrics_port),
            cassandra=dataclasses.replace(
                cassandra, keyspace=env.identifier("KEYSPACE", "notifier")
            ),
            key_ttl=env.days("KEY_TTL_DAYS", cls.key_ttl, low=1, high=365),
            key_takeover_after=seconds("KEY_TAKEOVER_AFTER_S", cls.key_takeover_after, low=1),
            adapter=env.choice("ADAPTER", "recording", ("recording", "logging")),
            auto_device=env.flag("AUTO_DEVICE", dev),
            push_workers=count("PUSH_WORKERS", cls.push_workers),
            batch_concurrency=count("BATCH_CONCURRENCY", cls.batch_concurrency),
            max_pending=count("MAX_PENDING", cls.max_pending),
            push_max_attempts=count("PUSH_MAX_ATTEMPTS", cls.push_max_attempts),
            # Not 0: a storage retry would then spin (it backs off from this value too).
            push_retry_backoff=seconds("PUSH_RETRY_BACKOFF_S", cls.push_retry_backoff, low=0.01),
            push_timeout=seconds("PUSH_TIMEOUT_S", cls.push_timeout, low=0.1),
            push_give_up_after=seconds("PUSH_GIVE_UP_AFTER_S", cls.push_give_up_after, low=0),
            recording_capacity=count("RECORDING_CAPACITY", cls.recording_capacity),
            shutdown_grace=seconds("SHUTDOWN_GRACE_S", cls.shutdown_grace, low=0),
            health_probe_interval=seconds(
                "HEALTH_PROBE_INTERVAL_S", cls.health_probe_interval, low=0.1
            ),
            faults=Faults.parse(env.text("FAULTS", "")),
            tls=ServerTls.from_env(values, NOTIFIER_SERVER_PREFIX),
        )
        _check_adapter_named(env, dev)  # last: a malformed value is named first
        # A ring is re-sent, under its key, for as long as its bucket entry lives (a catch-up
        # after an outage): its key must outlive that to dedupe the re-send. Both read from
        # the ConfigMap every pod shares.
        # A hold is refreshed before a push once half the bound has passed: a push taking
        # longer than the other half is taken over by another replica, and pushed twice.
        if settings.key_takeover_after <= 2 * settings.push_timeout:
            raise ConfigError(
                f"{PREFIX}KEY_TAKEOVER_AFTER_S ({settings.key_takeover_after.total_seconds():g})"
                f" must be over twice {PREFIX}PUSH_TIMEOUT_S"
                f" ({settings.push_timeout.total_seconds():g}): a push still under way would"
                " be taken over by another replica and pushed twice"
            )
        bucket = Retention.from_env(values).bucket
        if settings.key_ttl <= bucket:
            raise ConfigError(
                f"{PREFIX}KEY_TTL_DAYS ({settings.key_ttl.days}) must be longer than"
                f" REMINDERS_BUCKET_RETENTION_DAYS ({bucket.days}): a ring re-sent in a"
                " catch-up would find its key gone and be pushed twice"
            )
        require_protected(
            values,
            "REMINDERS_NOTIFIER_HOST (the reference notifier's port: only mutual TLS"
            " authenticates its callers)",
            settings.host,
            settings.tls is not None and settings.tls.mutual,
        )
        return settings


def _check_adapter_named(env: Env, dev: bool) -> None:
    # Neither adapter reaches a device: this service stands in for a real Notification
    # Service, and rings handed to it are finalized as rung. So outside development the
    # choice is named in the deployment, never a default that pushes nowhere unnoticed.
    if not dev and not env.raw("ADAPTER"):
        raise ConfigError(
            f"{PREFIX}ADAPTER is not set: the reference notifier pushes to no device"
            " (recording keeps pushes in memory, logging logs them); name one to run it"
            " outside REMINDERS_ENV=dev, or point the dispatchers at a real Notification"
            " Service"
        )
