"""API server settings, read from REMINDERS_* environment variables at startup."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from reminders_svc.config import ConfigError, MinuteTiming, Retention
from reminders_svc.storage.reminders_store import LIST_SCAN_ROWS


@dataclass(frozen=True)
class Limits:
    max_text_chars: int = 500
    max_active_per_user: int = 5000
    max_page_size: int = 500
    default_page_size: int = 50
    min_snooze: timedelta = timedelta(minutes=1)
    max_snooze: timedelta = timedelta(days=7)
    max_message_bytes: int = 64 * 1024
    # The most rows of a user's partition one List call reads (a short page with a token
    # when it comes first).
    list_scan_rows: int = LIST_SCAN_ROWS


@dataclass(frozen=True)
class ServerTls:
    """TLS of the API port; with `client_ca_file`, mutual TLS (clients must present a cert)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServerTls | None:
        prefix = "REMINDERS_API_TLS_"
        cert, key, client_ca = (
            env.get(prefix + name) or None for name in ("CERT_FILE", "KEY_FILE", "CLIENT_CA_FILE")
        )
        if cert is None and key is None:
            if client_ca is not None:
                raise ConfigError(f"{prefix}CLIENT_CA_FILE needs {prefix}CERT_FILE and _KEY_FILE")
            return None
        if cert is None or key is None:
            raise ConfigError(f"set both {prefix}CERT_FILE and {prefix}KEY_FILE, or neither")
        return cls(cert_file=cert, key_file=key, client_ca_file=client_ca)


@dataclass(frozen=True)
class ApiSettings:
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9464
    reflection: bool = False
    # Each write RPC's storage work must finish within this, which is shorter than the
    # dispatcher's grace G (DESIGN.md invariant 3), so no entry lands after a re-read.
    write_deadline: timedelta = timedelta(seconds=10)
    shutdown_grace: timedelta = timedelta(seconds=20)
    limits: Limits = field(default_factory=Limits)
    retention: Retention = field(default_factory=Retention)
    # None: plaintext (local development, or TLS terminated by a mesh sidecar).
    tls: ServerTls | None = None
    # How often the health service asks Cassandra whether it answers.
    health_probe_interval: timedelta = timedelta(seconds=3)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiSettings:
        env = os.environ if environ is None else environ
        dev = env.get("REMINDERS_ENV", "") == "dev"

        def number(name: str, default: float) -> float:
            raw = env.get(name)
            if raw in (None, ""):
                return default
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise ConfigError(f"{name}={raw!r}: expected a number")
            return value

        reflection_raw = env.get("REMINDERS_API_REFLECTION", "true" if dev else "false").lower()
        if reflection_raw not in ("true", "false", "1", "0"):
            raise ConfigError(
                f"REMINDERS_API_REFLECTION={reflection_raw!r}: expected true or false"
            )
        write_deadline = timedelta(seconds=number("REMINDERS_API_WRITE_DEADLINE_S", 10))
        _check_write_deadline(write_deadline, env)
        return cls(
            host=env.get("REMINDERS_API_HOST", "127.0.0.1"),
            port=int(number("REMINDERS_API_PORT", 50051)),
            metrics_port=int(number("REMINDERS_API_METRICS_PORT", 9464)),
            reflection=reflection_raw in ("true", "1"),
            write_deadline=write_deadline,
            shutdown_grace=timedelta(seconds=number("REMINDERS_API_SHUTDOWN_GRACE_S", 20)),
            limits=Limits(
                max_active_per_user=int(number("REMINDERS_MAX_ACTIVE_PER_USER", 5000)),
            ),
            retention=Retention(
                bucket=timedelta(days=number("REMINDERS_BUCKET_RETENTION_DAYS", 7)),
                idempotency=_idempotency_retention(
                    number("REMINDERS_IDEMPOTENCY_RETENTION_DAYS", 7)
                ),
                history=timedelta(days=number("REMINDERS_HISTORY_RETENTION_DAYS", 90)),
            ),
            tls=ServerTls.from_env(env),
            health_probe_interval=timedelta(
                seconds=number("REMINDERS_API_HEALTH_PROBE_INTERVAL_S", 3)
            ),
        )


def _check_write_deadline(write_deadline: timedelta, env: Mapping[str, str]) -> None:
    """Refuse a deadline that is not positive, or not shorter than the dispatcher's grace G
    minus its clock-skew allowance: a write landing later could miss the minute's final
    re-read (DESIGN.md invariant 3). G and the skew are read as the dispatcher reads them."""
    if write_deadline <= timedelta(0):
        raise ConfigError("REMINDERS_API_WRITE_DEADLINE_S: expected a number of seconds above 0")
    timing = MinuteTiming.from_env(env)
    if write_deadline >= timing.longest_write:
        raise ConfigError(
            f"REMINDERS_API_WRITE_DEADLINE_S={write_deadline.total_seconds():g} must be shorter "
            f"than the dispatcher's grace G ({timing.grace.total_seconds():g} s) minus its "
            f"clock-skew allowance ({timing.skew.total_seconds():g} s), or a write could land "
            "after the minute's final re-read"
        )


def _idempotency_retention(days: float) -> timedelta:
    """Refuse a create-record lifetime below 1 day or above a deleted row's: TTL 0 means
    never expire in Cassandra, and a record outliving the deleted row would let a late
    replay of the create re-create the reminder under the same id. Checked before the
    timedelta is made, which overflows on a huge number."""
    longest = Retention().tombstone / timedelta(days=1)
    if not 1 <= days <= longest:
        raise ConfigError(
            f"REMINDERS_IDEMPOTENCY_RETENTION_DAYS={days:g}: expected 1 to {longest:g} days "
            "(a deleted reminder's row lifetime), or a replayed create could re-create it"
        )
    return timedelta(days=days)
