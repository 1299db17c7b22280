"""What each process's metrics export before anything has happened: every count the rules
and dashboard read, at zero (rate() and increase() cannot see the first increment of a
series born with it), and the client's process and runtime metrics."""

from __future__ import annotations

import re

import grpc
from prometheus_client import CollectorRegistry

from dispatcher.metrics import DispatcherMetrics
from notifier.metrics import NotifierMetrics
from notifier.settings import NotifierSettings
from reminders_svc.api.server import DECLARED_METHODS, ApiMetrics
from reminders_svc.domain.dispatch import SkipReason
from reminders_svc.runtime import process_registry
from tests.monitoring.files import alerts
from tests.monitoring.promql import parse

# Samples of prometheus_client's process, GC and platform collectors (process_* on Linux).
STANDARD_SAMPLES = frozenset(
    {
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "python_gc_collections_total",
        "python_info",
    }
)


def _sample_names(registry: CollectorRegistry) -> frozenset[str]:
    return frozenset(sample.name for family in registry.collect() for sample in family.samples)


def test_the_dispatcher_exports_every_final_outcome_and_skip_reason_at_zero() -> None:
    registry = DispatcherMetrics().registry
    rings = {
        outcome: registry.get_sample_value("reminders_dispatch_rings_total", {"outcome": outcome})
        for outcome in ("accepted", "duplicate", "rejected", "retryable")
    }
    skips = {
        reason: registry.get_sample_value("reminders_dispatch_skips_total", {"reason": reason})
        for reason in SkipReason
    }

    # Not retryable, never a ring's final answer: notifier_errors_total counts those.
    assert rings == {"accepted": 0, "duplicate": 0, "rejected": 0, "retryable": None}
    assert skips == dict.fromkeys(SkipReason, 0)


def test_every_code_the_api_errors_alert_counts_is_exported_from_the_start() -> None:
    """A pod's first INTERNAL on a method went uncounted by RemindersApiErrors."""
    registry = CollectorRegistry()
    ApiMetrics(registry)
    alerted = {
        code.name
        for alert in alerts()
        if alert["annotations"]["runbook_url"].endswith("#api-errors")
        for selector in parse(alert["expr"]).selectors
        for matcher in selector.matchers
        if matcher.label == "code"
        for code in grpc.StatusCode
        if re.fullmatch(matcher.value, code.name)
    }

    assert alerted
    for method in DECLARED_METHODS:
        for code in {*alerted, "OK"}:
            labels = {"method": method, "code": code}
            assert registry.get_sample_value("reminders_api_requests_total", labels) == 0, labels


def test_a_process_registry_has_the_process_and_runtime_metrics() -> None:
    """The dispatcher runs at a hard memory limit: its memory, CPU and open file
    descriptors were only to be had from the kubelet (and the descriptors not at all)."""
    assert _sample_names(process_registry()) >= STANDARD_SAMPLES
    # The dispatcher's metrics make the process's registry when given none.
    assert _sample_names(DispatcherMetrics().registry) >= STANDARD_SAMPLES


def test_a_push_given_up_on_at_the_latest_is_in_a_finite_lateness_bucket() -> None:
    """A push may go out up to the give-up bound after the later of its due and first
    hand-off; past the last finite bucket (it was 1800 s) a quantile reads as that
    bucket."""
    registry = CollectorRegistry()
    metrics = NotifierMetrics(registry)
    give_up_s = NotifierSettings().push_give_up_after.total_seconds()
    metrics.push_lateness.labels("urgent").observe(2 * give_up_s)

    finite = [
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "notifier_push_lateness_seconds_bucket"
        and sample.labels["priority"] == "urgent"
        and sample.labels["le"] != "+Inf"
    ]
    assert finite[-1] == 1
