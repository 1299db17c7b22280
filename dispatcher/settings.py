"""Dispatcher settings, read from REMINDERS_DISPATCH_* at startup (never at import time)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from reminders_svc.config import ConfigError, MinuteTiming


class MisfirePolicy(StrEnum):
    """What a ring found late after an outage does (DESIGN.md invariant 9)."""

    RING_LATE = "ring_late"  # one-off rings late, marked late; a repeat rings once, late
    SKIP_MISSED = "skip_missed"  # rings older than `misfire_grace` are not sent, only re-armed


@dataclass(frozen=True)
class DispatcherSettings:
    dispatcher_id: str
    notifier_target: str = "127.0.0.1:50061"
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
    ring_expiry: timedelta = timedelta(hours=1)
    shutdown_grace: timedelta = timedelta(seconds=25)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DispatcherSettings:
        env = os.environ if environ is None else environ
        prefix = "REMINDERS_DISPATCH_"

        def seconds(name: str, default: timedelta) -> timedelta:
            raw = env.get(prefix + name)
            if raw in (None, ""):
                return default
            try:
                return timedelta(seconds=float(raw))
            except ValueError:
                raise ConfigError(f"{prefix}{name}={raw!r}: expected seconds") from None

        def integer(name: str, default: int) -> int:
            raw = env.get(prefix + name)
            try:
                return default if raw in (None, "") else int(raw)
            except ValueError:
                raise ConfigError(f"{prefix}{name}={raw!r}: expected an integer") from None

        policy_raw = env.get(prefix + "MISFIRE_POLICY", MisfirePolicy.RING_LATE.value)
        try:
            policy = MisfirePolicy(policy_raw)
        except ValueError:
            raise ConfigError(
                f"{prefix}MISFIRE_POLICY={policy_raw!r}: expected ring_late or skip_missed"
            ) from None
        timing = MinuteTiming.from_env(env)  # shared with the API, which checks its deadline
        settings = cls(
            dispatcher_id=env.get(prefix + "ID") or f"{socket.gethostname()}-{os.getpid()}",
            notifier_target=env.get("REMINDERS_NOTIFIER_TARGET", "127.0.0.1:50061"),
            host=env.get(prefix + "HOST", "127.0.0.1"),
            port=integer("PORT", 50071),
            metrics_port=integer("METRICS_PORT", 9466),
            lease=seconds("LEASE_S", cls.lease),
            lease_renew_every=seconds("LEASE_RENEW_S", cls.lease_renew_every),
            claim_lease=seconds("CLAIM_LEASE_S", cls.claim_lease),
            prefetch=seconds("PREFETCH_S", cls.prefetch),
            poll_every=seconds("POLL_S", cls.poll_every),
            grace=timing.grace,
            skew=timing.skew,
            max_clock_offset=seconds("MAX_CLOCK_OFFSET_S", cls.max_clock_offset),
            batch_size=integer("BATCH_SIZE", cls.batch_size),
            max_in_flight=integer("MAX_IN_FLIGHT", cls.max_in_flight),
            catch_up_minutes_per_s=float(
                env.get(prefix + "CATCH_UP_MINUTES_PER_S") or cls.catch_up_minutes_per_s
            ),
            catch_up_rings_per_s=float(env.get(prefix + "CATCH_UP_RINGS_PER_S") or 50),
            initial_lookback=seconds("INITIAL_LOOKBACK_S", cls.initial_lookback),
            misfire_policy=policy,
            misfire_grace=seconds("MISFIRE_GRACE_S", cls.misfire_grace),
            late_after=seconds("LATE_AFTER_S", cls.late_after),
            ring_expiry=seconds("RING_EXPIRY_S", cls.ring_expiry),
            shutdown_grace=seconds("SHUTDOWN_GRACE_S", cls.shutdown_grace),
        )
        if settings.lease_renew_every * 2 >= settings.lease:
            raise ConfigError(f"{prefix}LEASE_RENEW_S must be under half of {prefix}LEASE_S")
        return settings
