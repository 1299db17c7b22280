"""The dispatcher's Prometheus metrics. Labels never carry user ids, reminder ids or texts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dispatcher.handoff import Outcome
from reminders_svc.domain.dispatch import SkipReason
from reminders_svc.runtime import export_from_start, process_registry

# From the 1-second target to a catch-up of the bucket entries' whole default retention
# (7 days): past the last bucket a quantile reads as that bucket, so a day-long outage
# showed as 1 h late. 60 stays: the lateness objective's rules read it.
_LATENESS_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600, 7200, 21600, 86400, 604800
)  # fmt: skip


# The outcomes rings_total counts: a ring's final answer. A retryable one is counted in
# notifier_errors_total, and the ring retried.
_FINAL_OUTCOMES = tuple(outcome for outcome in Outcome if outcome is not Outcome.RETRYABLE)


class DispatcherMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """`registry`: where to export; by default, a process's own (the dispatcher's)."""
        self.registry = registry or process_registry()
        r = self.registry
        self.claim_lateness = Histogram(
            "reminders_dispatch_claim_lateness_seconds",
            "From a ring's due to its claim.",
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.handoff_lateness = Histogram(
            "reminders_dispatch_handoff_lateness_seconds",
            "From a ring's due to the notifier's answer.",
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.rings = Counter(
            "reminders_dispatch_rings_total",
            "Rings handed off, by the notifier's answer.",
            ["outcome"],
            registry=r,
        )
        self.skips = Counter(
            "reminders_dispatch_skips_total",
            "Bucket entries whose row said not to ring.",
            ["reason"],
            registry=r,
        )
        self.skips_deferred = Counter(
            "reminders_dispatch_skips_deferred_total",
            "Skips decided on a row read before its minute's final read, looked at again"
            " then: a user's write may still have been landing (counted in skips once final).",
            registry=r,
        )
        self.entries_rewritten = Counter(
            "reminders_dispatch_entries_rewritten_total",
            "Finalizes that landed after the final read of their next ring's minute, whose"
            " entry was written again into the minute of now (a storage stall; rare).",
            registry=r,
        )
        self.claims_lost = Counter(
            "reminders_dispatch_claims_lost_total",
            "Claims, claim renewals or finalizes lost to a user's change (edit, snooze,"
            " pause, delete) or, rarely, to another dispatcher that took over the claim"
            " once it expired; a lost part lease is counted in leases_lost instead.",
            registry=r,
        )
        self.reclaims = Counter(
            "reminders_dispatch_reclaims_total", "Expired claims taken over.", registry=r
        )
        self.parts = Gauge(
            "reminders_dispatch_parts", "P, the number of parts in force now.", registry=r
        )
        self.parts_owned = Gauge(
            "reminders_dispatch_parts_owned", "Parts this dispatcher holds a lease on.", registry=r
        )
        self.lease_takeovers = Counter(
            "reminders_dispatch_lease_takeovers_total",
            "Leases taken on parts held before (by this dispatcher or another): handed"
            " over by a rebalance or a stop, or expired with a dead or paused holder.",
            registry=r,
        )
        self.part_failures = Counter(
            "reminders_dispatch_part_failures_total",
            "Part workers that failed on an error not of storage's unavailability (a grant"
            " revoked, a row that does not decode): the part is released, and taken here"
            " again only after a cool-down doubling from 5 s to 5 minutes.",
            registry=r,
        )
        self.leases_lost = Counter(
            "reminders_dispatch_leases_lost_total",
            "Leases lost before release (a renewal or a checkpoint refused, or no renewal"
            " landed before the lease's local deadline).",
            registry=r,
        )
        self.checkpoint_lag = Gauge(
            "reminders_dispatch_checkpoint_lag_seconds",
            "Age of the oldest unfinished minute over the parts held (from the minute's"
            " start: up to 60 s plus the grace when keeping up).",
            registry=r,
        )
        self.oldest_claim = Gauge(
            "reminders_dispatch_oldest_unresolved_claim_seconds",
            "Age (from its claim) of the oldest claimed, unfinalized ring.",
            registry=r,
        )
        self.clock_offset = Gauge(
            "reminders_dispatch_clock_offset_seconds",
            "Measured offset of the database clock minus this dispatcher's.",
            registry=r,
        )
        self.clock_ready = Gauge(
            "reminders_dispatch_clock_ready", "1 when the clock is within its bound.", registry=r
        )
        self.notifier_errors = Counter(
            "reminders_dispatch_notifier_errors_total",
            "Rings answered retryable or failed calls to the notifier.",
            registry=r,
        )
        self.notifier_reachable = Gauge(
            "reminders_dispatch_notifier_reachable",
            "0 while this dispatcher's attempts to connect to the notifier fail (rings due"
            " meanwhile are left unclaimed until it is back), 1 otherwise.",
            registry=r,
        )
        self.notifier_refusing = Gauge(
            "reminders_dispatch_notifier_refusing",
            "1 while the notifier's calls all fail or answer every ring retryable: rings"
            " due meanwhile are left unclaimed, one let through every 2 s to find out"
            " when it takes rings again.",
            registry=r,
        )
        self.catch_up_backlog = Gauge(
            "reminders_dispatch_catch_up_backlog_minutes",
            "Minutes behind the current one, summed over the parts held.",
            registry=r,
        )
        self.rings_set_aside = Counter(
            "reminders_dispatch_rings_set_aside_total",
            "Entries set aside after an unexpected error handling their row (logged with the"
            " reminder id); `reminders admin replay` rings them once the cause is fixed.",
            registry=r,
        )
        self.minutes_done = Counter(
            "reminders_dispatch_minutes_checkpointed_total", "Minutes checkpointed.", registry=r
        )
        self.started = Gauge(
            "reminders_dispatch_started",
            "1 from this dispatcher's first tick on (it reached Cassandra and found its schema"
            " current), 0 before: until then its clock_ready and notifier_reachable read 0"
            " without having measured anything.",
            registry=r,
        )
        export_from_start(self.rings, (outcome.value for outcome in _FINAL_OUTCOMES))
        export_from_start(self.skips, (reason.value for reason in SkipReason))
