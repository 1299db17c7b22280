"""Notifier settings, read from REMINDERS_NOTIFIER_* (and REMINDERS_CASSANDRA_*) at startup."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

# The parsers of the shared config, so every REMINDERS_* variable reads the same way.
from reminders_svc.config import (
    CassandraSettings,
    ConfigError,
    _choice,
    _float,
    _identifier,
    _int,
    _truthy,
)

AdapterName = Literal["recording", "logging"]
PREFIX = "REMINDERS_NOTIFIER_"


@dataclass(frozen=True)
class Faults:
    """Fault injection for the dispatcher's tests; all off unless REMINDERS_NOTIFIER_FAULTS
    names them, e.g. `drop_reply:2` or `crash_before_push`."""

    # The first N SendBatch calls are processed in full but answered UNAVAILABLE.
    drop_reply: int = 0
    # SIGKILL this process when its first push is about to go out (keys recorded, nothing
    # pushed, nothing answered): what a notifier killed mid-delivery leaves behind.
    crash_before_push: bool = False

    @classmethod
    def parse(cls, text: str) -> Faults:
        faults = cls()
        for spec in filter(None, (part.strip() for part in text.split(","))):
            name, _, count = spec.partition(":")
            if name == "drop_reply":
                faults = dataclasses.replace(faults, drop_reply=_int(count, f"{PREFIX}FAULTS"))
            elif name == "crash_before_push" and not count:
                faults = dataclasses.replace(faults, crash_before_push=True)
            else:
                raise ConfigError(f"{PREFIX}FAULTS={text!r}: unknown fault {spec!r}")
        return faults

    @property
    def any(self) -> bool:
        return self != Faults()


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
    # Items of one SendBatch being recorded at once.
    batch_concurrency: int = 64
    push_max_attempts: int = 5
    push_retry_backoff: timedelta = timedelta(seconds=1)
    # The recording adapter keeps at most this many pushes (oldest dropped).
    recording_capacity: int = 100_000
    shutdown_grace: timedelta = timedelta(seconds=20)
    health_probe_interval: timedelta = timedelta(seconds=3)
    faults: Faults = Faults()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NotifierSettings:
        env = os.environ if environ is None else environ
        dev = env.get("REMINDERS_ENV", "") == "dev"

        def get(name: str, default: str) -> str:
            return env.get(PREFIX + name) or default

        def seconds(name: str, default: float) -> timedelta:
            return timedelta(seconds=_float(get(name, str(default)), PREFIX + name))

        cassandra = CassandraSettings.from_env(env)
        keyspace = _identifier(get("KEYSPACE", "notifier"), PREFIX + "KEYSPACE")
        return cls(
            host=get("HOST", "127.0.0.1"),
            port=_int(get("PORT", "50061"), PREFIX + "PORT"),
            metrics_port=_int(get("METRICS_PORT", "9465"), PREFIX + "METRICS_PORT"),
            cassandra=dataclasses.replace(cassandra, keyspace=keyspace),
            key_ttl=timedelta(days=_float(get("KEY_TTL_DAYS", "30"), PREFIX + "KEY_TTL_DAYS")),
            key_takeover_after=seconds("KEY_TAKEOVER_AFTER_S", 60),
            adapter=_choice(
                get("ADAPTER", "recording" if dev else "logging"),
                PREFIX + "ADAPTER",
                ("recording", "logging"),
            ),
            auto_device=_truthy(
                get("AUTO_DEVICE", "true" if dev else "false"), PREFIX + "AUTO_DEVICE"
            ),
            push_workers=_int(get("PUSH_WORKERS", "16"), PREFIX + "PUSH_WORKERS"),
            batch_concurrency=_int(get("BATCH_CONCURRENCY", "64"), PREFIX + "BATCH_CONCURRENCY"),
            push_max_attempts=_int(get("PUSH_MAX_ATTEMPTS", "5"), PREFIX + "PUSH_MAX_ATTEMPTS"),
            push_retry_backoff=seconds("PUSH_RETRY_BACKOFF_S", 1),
            recording_capacity=_int(
                get("RECORDING_CAPACITY", "100000"), PREFIX + "RECORDING_CAPACITY"
            ),
            shutdown_grace=seconds("SHUTDOWN_GRACE_S", 20),
            health_probe_interval=seconds("HEALTH_PROBE_INTERVAL_S", 3),
            faults=Faults.parse(get("FAULTS", "")),
        )
