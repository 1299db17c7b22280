"""Dispatcher settings, read from REMINDERS_DISPATCH_* at startup (never at import time)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

from reminders_svc.config import (
    RING_EXPIRY,
    ConfigError,
    Env,
    MinuteTiming,
    Retention,
    check_tz_override,
    require_protected,
    ring_expiry_from_env,
)
from reminders_svc.tls import NOTIFIER_CLIENT_PREFIX, ClientTls

# notification.v1's SendBatch takes 1 to 500 items (proto/notification/v1): a larger
# batch would be refused whole, and its rings retried for ever.
MAX_BATCH_SIZE = 500


class MisfirePolicy(StrEnum):
    """What a ring found late after an outage does (DESIGN.md invariant 9)."""

    RING_LATE = "ring_late"  # one-off rings late, marked late; a repeat rings once, late
    SKIP_MISSED = "skip_missed"  # rings older than `misfire_grace` are not sent, only re-armed


# The test hooks REMINDERS_DISPATCH_FAULTS may name (DESIGN.md's fault-injection tests).
FAULTS = frozenset(
    {
        "crash_after_claim",
        "crash_after_send",
        "freeze_after_claim",
        "wall_clock_ahead",
        "wall_clock_ahead_on_sigusr1",
    }
)


# A dispatcher id is a key of its heartbeat row and the owner in its leases, and logged.
MAX_DISPATCHER_ID = 200


def _dispatcher_id(value: str, variable: str) -> str:
    if not 0 < len(value) <= MAX_DISPATCHER_ID or not value.isprintable():
        # Not echoed: it may be long or hold line breaks.
        raise ConfigError(f"{variable}: expected 1 to {MAX_DISPATCHER_ID} printable characters")
    return value


@dataclass(frozen=True)
class DispatcherSettings:
    dispatcher_id: str
    notifier_target: str = "127.0.0.1:50061"
    # TLS of the channel to the notifier, from REMINDERS_NOTIFIER_TLS_* (the CA file turns
    # it on; a client certificate for mTLS). None: plaintext (local development, a mesh).
    notifier_tls: ClientTls | None = None
    host: str = "127.0.0.1"
    port: int = 50071  # gRPC health
    metrics_port: int = 9466
    # Part leases: expire on the database's clock (TTL); renewed well before.
    lease: timedelta = timedelta(seconds=15)
    lease_renew_every: timedelta = timedelta(seconds=5)
    # A claim is held this long before another dispatcher may take the ring over.
    claim_lease: timedelta = timedelta(seconds=30)
    # Read a minute's bucket this far ahead; poll for late entries this often.
    prefetch: timedelta = timedelta(seconds=5)
    poll_every: timedelta = timedelta(seconds=1)
    # Re-read a whole minute this long after it ends before checkpointing it: longer
    # than the API's write deadline plus clock skew (DESIGN.md invariant 3).
    grace: timedelta = MinuteTiming.grace
    # Entries are read "written since the last look" minus this, for writers' clock skew.
    skew: timedelta = MinuteTiming.skew
    max_clock_offset: timedelta = timedelta(seconds=1)
    batch_size: int = 100
    # Rings in hand at once, each from its fresh row read to its finalize.
    max_in_flight: int = 256
    # Catch-up after an outage: past minutes read, and late entries read and claimed, at
    # most this fast per dispatcher, so API reads stay fast while a backlog drains. An
    # empty minute costs a bucket read and a checkpoint: at 200/s an hour of 64 parts takes
    # 19 s (GetReminder p99 1.4x idle, bench_catchup); at 20/s it took over 3 minutes, and
    # every part's live minute waited behind it.
    catch_up_minutes_per_s: float = 200.0
    catch_up_rings_per_s: float = 50.0
    # A part that was never checkpointed starts this far back.
    initial_lookback: timedelta = timedelta(hours=1)
    misfire_policy: MisfirePolicy = MisfirePolicy.RING_LATE
    misfire_grace: timedelta = timedelta(minutes=5)
    # A ring handed off later than this after its due is marked late.
    late_after: timedelta = timedelta(seconds=60)
    # How long the notifier may still deliver a ring, counted from each hand-off attempt.
    ring_expiry: timedelta = RING_EXPIRY
    shutdown_grace: timedelta = timedelta(seconds=25)
    # How long bucket entries and delivery history rows are kept; the API reads the same.
    retention: Retention = field(default_factory=Retention)
    # Test hooks named in REMINDERS_DISPATCH_FAULTS (FAULTS); none in production.
    faults: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DispatcherSettings:
        values = os.environ if environ is None else environ
        prefix = "REMINDERS_DISPATCH_"
        env = Env(values, prefix)
        day_s = 86_400.0

        def seconds(
            name: str, default: timedelta, low: float = 0.05, high: float = 3600
        ) -> timedelta:
            return env.seconds(name, default, low=low, high=high)

        def count(name: str, default: int) -> int:
            return env.integer(name, default, low=1, high=100_000)

        timing = MinuteTiming.from_env(values)  # shared with the API, which checks its deadline
        settings = cls(
            dispatcher_id=_dispatcher_id(
                env.text("ID", f"{socket.gethostname()}-{os.getpid()}"), f"{prefix}ID"
            ),
            notifier_target=values.get("REMINDERS_NOTIFIER_TARGET") or cls.notifier_target,
            notifier_tls=ClientTls.from_env(values, NOTIFIER_CLIENT_PREFIX),
            host=env.text("HOST", cls.host),
            port=env.port("PORT", cls.port),
            metrics_port=env.port("METRICS_PORT", cls.metrics_port),
            lease=seconds("LEASE_S", cls.lease, low=1),
            lease_renew_every=seconds("LEASE_RENEW_S", cls.lease_renew_every),
            claim_lease=seconds("CLAIM_LEASE_S", cls.claim_lease, low=1),
            prefetch=seconds("PREFETCH_S", cls.prefetch, low=0, high=60),
            poll_every=seconds("POLL_S", cls.poll_every, high=60),
            grace=timing.grace,
            skew=timing.skew,
            max_clock_offset=seconds("MAX_CLOCK_OFFSET_S", cls.max_clock_offset, low=0.01, high=60),
            batch_size=env.integer("BATCH_SIZE", cls.batch_size, low=1, high=MAX_BATCH_SIZE),
            max_in_flight=count("MAX_IN_FLIGHT", cls.max_in_flight),
            catch_up_minutes_per_s=env.number(
                "CATCH_UP_MINUTES_PER_S", cls.catch_up_minutes_per_s, low=0.01, high=1e6
            ),
            catch_up_rings_per_s=env.number(
                "CATCH_UP_RINGS_PER_S", cls.catch_up_rings_per_s, low=0.01, high=1e6
            ),
            initial_lookback=seconds(
                "INITIAL_LOOKBACK_S", cls.initial_lookback, low=0, high=7 * day_s
            ),
            misfire_policy=env.choice(
                "MISFIRE_POLICY",
                cls.misfire_policy,
                (MisfirePolicy.RING_LATE, MisfirePolicy.SKIP_MISSED),
            ),
            misfire_grace=seconds("MISFIRE_GRACE_S", cls.misfire_grace, low=0, high=7 * day_s),
            late_after=seconds("LATE_AFTER_S", cls.late_after, low=0, high=day_s),
            ring_expiry=ring_expiry_from_env(values),
            shutdown_grace=seconds("SHUTDOWN_GRACE_S", cls.shutdown_grace, low=0),
            retention=Retention.from_env(values),
            faults=env.hooks("FAULTS", FAULTS),
        )
        if settings.lease_renew_every * 2 >= settings.lease:
            raise ConfigError(f"{prefix}LEASE_RENEW_S must be under half of {prefix}LEASE_S")
        check_tz_override(values)  # a finalize computes the next ring in its zone
        require_protected(
            values,
            "REMINDERS_NOTIFIER_TARGET (the link to the notifier: reminder texts)",
            settings.notifier_target,
            settings.notifier_tls is not None,
        )
        return settings
