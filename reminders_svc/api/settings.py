"""API server settings, read from REMINDERS_* environment variables at startup."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from reminders_svc.config import (
    HANDOFF_WINDOW,
    ConfigError,
    Env,
    MinuteTiming,
    Retention,
    check_tz_override,
    in_development,
    require_protected,
    ring_expiry_from_env,
)
from reminders_svc.domain.limits import Limits
from reminders_svc.tls import API_PREFIX, ServerTls

# The test hooks REMINDERS_API_FAULTS may name: the host clock seen 30 s ahead.
API_FAULTS = frozenset({"wall_clock_ahead"})


@dataclass(frozen=True)
class ApiSettings:
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9464
    reflection: bool = False
    # How long a write RPC waits on its storage work: shorter than the dispatcher's grace G
    # minus the clocks' skew (DESIGN.md invariant 3). It bounds the waiting; what bounds a
    # statement already sent is the cluster's write timeouts (docs/architecture.md).
    write_deadline: timedelta = timedelta(seconds=10)
    shutdown_grace: timedelta = timedelta(seconds=20)
    limits: Limits = field(default_factory=Limits)
    retention: Retention = field(default_factory=Retention)
    # None: plaintext (local development, or TLS terminated by a mesh sidecar).
    tls: ServerTls | None = None
    # How often the health service asks Cassandra whether it answers.
    health_probe_interval: timedelta = timedelta(seconds=3)
    # How long after a cleared claim's expiry its ring may still be pushed.
    still_pushed_for: timedelta = HANDOFF_WINDOW
    # The dispatchers' clock-skew allowance for writers (REMINDERS_DISPATCH_SKEW_S): a host
    # clock known off the database's by more is not ready (DESIGN.md invariant 3).
    max_clock_offset: timedelta = MinuteTiming.skew
    # Test hooks named in REMINDERS_API_FAULTS (API_FAULTS); none in production.
    faults: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiSettings:
        values = os.environ if environ is None else environ
        env = Env(values)
        dev = in_development(values)
        write_deadline = env.seconds(
            "REMINDERS_API_WRITE_DEADLINE_S", cls.write_deadline, low=0, high=3600
        )
        _check_write_deadline(write_deadline, values)
        # Read as the dispatchers read them (one ConfigMap): a notifier on a clock up to
        # the skew behind pushes until the ring's expiry by its clock.
        skew = MinuteTiming.from_env(values).skew
        still_pushed_for = ring_expiry_from_env(values) + skew
        check_tz_override(values)  # the zones every due is computed in
        shutdown_grace = env.seconds(
            "REMINDERS_API_SHUTDOWN_GRACE_S",
            max(cls.shutdown_grace, write_deadline),
            low=0,
            high=3600,
        )
        if shutdown_grace < write_deadline:
            # A call cut at the stop answers UNAVAILABLE, its change perhaps made: the grace
            # lets every write finish or reach its deadline (answered OUTCOME_UNKNOWN).
            raise ConfigError(
                f"REMINDERS_API_SHUTDOWN_GRACE_S={shutdown_grace.total_seconds():g} must be at"
                f" least REMINDERS_API_WRITE_DEADLINE_S={write_deadline.total_seconds():g}:"
                " a call cut mid-write is answered UNAVAILABLE though its change may be made"
            )
        settings = cls(
            host=env.text("REMINDERS_API_HOST", "127.0.0.1"),
            port=env.port("REMINDERS_API_PORT", cls.port),
            metrics_port=env.port("REMINDERS_API_METRICS_PORT", cls.metrics_port),
            reflection=env.flag("REMINDERS_API_REFLECTION", dev),
            write_deadline=write_deadline,
            shutdown_grace=shutdown_grace,
            limits=Limits(
                max_active_per_user=env.integer(
                    "REMINDERS_MAX_ACTIVE_PER_USER", Limits.max_active_per_user, low=1, high=10**9
                ),
                min_snooze=env.seconds(
                    "REMINDERS_API_MIN_SNOOZE_S", Limits.min_snooze, low=1, high=3600
                ),
            ),
            retention=Retention.from_env(values),
            tls=ServerTls.from_env(values, API_PREFIX),
            health_probe_interval=env.seconds(
                "REMINDERS_API_HEALTH_PROBE_INTERVAL_S",
                cls.health_probe_interval,
                low=0.1,
                high=600,
            ),
            still_pushed_for=still_pushed_for,
            max_clock_offset=skew,
            faults=env.hooks("REMINDERS_API_FAULTS", API_FAULTS),
        )
        require_protected(
            values,
            "REMINDERS_API_HOST (the API's port: tokens and reminder texts)",
            settings.host,
            settings.tls is not None,
        )
        return settings


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
