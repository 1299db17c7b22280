"""Typed settings read from the environment once, at startup (never at import time).

Secrets are held as `Secret` so that neither repr() nor logging prints them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal, TypeVar

ConsistencyName = Literal["ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"]
SerialConsistencyName = Literal["SERIAL", "LOCAL_SERIAL"]
_Choice = TypeVar("_Choice", bound=str)


class ConfigError(ValueError):
    """An environment variable is missing or malformed; the message names it."""


@dataclass(frozen=True)
class Retention:
    # Bucket entries live until due + this: longer than any outage we recover from.
    bucket: timedelta = timedelta(days=7)
    idempotency: timedelta = timedelta(days=7)
    history: timedelta = timedelta(days=90)
    # Deleted rows stay as tombstones past the dispatcher's retry horizon.
    tombstone: timedelta = timedelta(days=30)


@dataclass(frozen=True)
class Secret:
    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret('****')"

    __str__ = __repr__


@dataclass(frozen=True)
class Replication:
    """SimpleStrategy with one factor (a local node) or NetworkTopologyStrategy per DC."""

    strategy: Literal["SimpleStrategy", "NetworkTopologyStrategy"]
    factors: tuple[tuple[str, int], ...]

    @classmethod
    def parse(cls, text: str) -> Replication:
        """`SimpleStrategy:1` or `NetworkTopologyStrategy:dc1=3,dc2=3`."""
        strategy, _, spec = text.partition(":")
        try:
            if strategy == "SimpleStrategy":
                return cls("SimpleStrategy", (("replication_factor", int(spec or "1")),))
            if strategy == "NetworkTopologyStrategy" and spec:
                pairs = tuple(
                    (dc.strip(), int(rf))
                    for dc, rf in (item.split("=") for item in spec.split(","))
                )
                return cls("NetworkTopologyStrategy", pairs)
        except ValueError as error:
            raise ConfigError(f"REMINDERS_CASSANDRA_REPLICATION={text!r}: {error}") from error
        raise ConfigError(
            f"REMINDERS_CASSANDRA_REPLICATION={text!r}: expected 'SimpleStrategy:<rf>' or "
            "'NetworkTopologyStrategy:<dc>=<rf>[,<dc>=<rf>...]'"
        )

    def cql(self) -> str:
        items = [f"'class': '{self.strategy}'"] + [f"'{k}': {v}" for k, v in self.factors]
        return "{" + ", ".join(items) + "}"


@dataclass(frozen=True)
class TlsSettings:
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    check_hostname: bool


@dataclass(frozen=True)
class CassandraSettings:
    contact_points: tuple[str, ...] = ("127.0.0.1",)
    port: int = 9042
    keyspace: str = "reminders"
    local_dc: str | None = None
    consistency: ConsistencyName = "LOCAL_QUORUM"
    serial_consistency: SerialConsistencyName = "SERIAL"
    username: str | None = None
    password: Secret | None = None
    tls: TlsSettings | None = None
    replication: Replication = Replication("SimpleStrategy", (("replication_factor", 1),))
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 12.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CassandraSettings:
        env = os.environ if environ is None else environ
        prefix = "REMINDERS_CASSANDRA_"

        def get(name: str, default: str | None = None) -> str | None:
            value = env.get(prefix + name)
            return value if value not in (None, "") else default

        tls = None
        if _truthy(get("TLS", "false"), prefix + "TLS"):
            tls = TlsSettings(
                ca_file=get("TLS_CA_FILE"),
                cert_file=get("TLS_CERT_FILE"),
                key_file=get("TLS_KEY_FILE"),
                check_hostname=_truthy(
                    get("TLS_CHECK_HOSTNAME", "true"), prefix + "TLS_CHECK_HOSTNAME"
                ),
            )
        password = get("PASSWORD")
        return cls(
            contact_points=tuple(
                p.strip()
                for p in (get("CONTACT_POINTS", "127.0.0.1") or "").split(",")
                if p.strip()
            ),
            port=_int(get("PORT", "9042"), prefix + "PORT"),
            keyspace=_identifier(get("KEYSPACE", "reminders"), prefix + "KEYSPACE"),
            local_dc=get("LOCAL_DC"),
            consistency=_choice(
                get("CONSISTENCY", "LOCAL_QUORUM"),
                prefix + "CONSISTENCY",
                ("ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"),
            ),
            serial_consistency=_choice(
                get("SERIAL_CONSISTENCY", "SERIAL"),
                prefix + "SERIAL_CONSISTENCY",
                ("SERIAL", "LOCAL_SERIAL"),
            ),
            username=get("USERNAME"),
            password=Secret(password) if password is not None else None,
            tls=tls,
            replication=Replication.parse(get("REPLICATION", "SimpleStrategy:1") or ""),
            connect_timeout_s=_float(get("CONNECT_TIMEOUT", "10"), prefix + "CONNECT_TIMEOUT"),
            request_timeout_s=_float(get("REQUEST_TIMEOUT", "12"), prefix + "REQUEST_TIMEOUT"),
        )


@dataclass(frozen=True)
class MinuteTiming:
    """How the dispatcher closes a minute, which every writer of bucket entries must respect
    (DESIGN.md invariant 3): it re-reads the minute `grace` (G) after its end, reading
    entries `skew` earlier than its last look for writers' clocks. A write that may land
    later than G minus the skew could miss that re-read, so the API's write deadline must
    be shorter. The dispatcher and the API both read it here, from the same variables
    (one ConfigMap, k8s/base/reminders.env)."""

    grace: timedelta = timedelta(seconds=20)
    skew: timedelta = timedelta(seconds=5)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MinuteTiming:
        def seconds(name: str, default: timedelta) -> timedelta:
            raw = env.get(name)
            return default if raw in (None, "") else timedelta(seconds=_float(raw, name))

        return cls(
            grace=seconds("REMINDERS_DISPATCH_GRACE_S", cls.grace),
            skew=seconds("REMINDERS_DISPATCH_SKEW_S", cls.skew),
        )

    @property
    def longest_write(self) -> timedelta:
        """A write deadline must be shorter than this."""
        return self.grace - self.skew


def _truthy(value: str | None, name: str) -> bool:
    lowered = (value or "").lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={value!r}: expected true or false")


def _int(value: str | None, name: str) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise ConfigError(f"{name}={value!r}: expected an integer") from None


def _float(value: str | None, name: str) -> float:
    try:
        return float(value or "")
    except ValueError:
        raise ConfigError(f"{name}={value!r}: expected a number") from None


def _identifier(value: str | None, name: str) -> str:
    if not value or not value.replace("_", "a").isalnum() or not value[0].isalpha():
        raise ConfigError(f"{name}={value!r}: expected a CQL identifier (letters, digits, _)")
    return value


def _choice(value: str | None, name: str, choices: tuple[_Choice, ...]) -> _Choice:
    for choice in choices:
        if value == choice:
            return choice
    raise ConfigError(f"{name}={value!r}: expected one of {', '.join(choices)}")
