"""k8s/monitoring/prometheus-rules.yaml: well formed, every alert with a severity, a summary
and a runbook section, and every metric it reads one that the code exports."""

from __future__ import annotations

import re
from typing import Any

import grpc
import pytest

from dispatcher.metrics import DispatcherMetrics
from reminders_svc.config import Retention
from reminders_svc.storage.parts import DEFAULT_PARTS
from tests.monitoring.files import (
    OPERATIONS_DOC,
    RUNBOOK_ANCHORS,
    RUNBOOK_BASE,
    RUNBOOK_URL,
    Query,
    alerts,
    markdown_anchors,
    problems_with,
    rule_document,
    rule_groups,
    rule_queries,
    rules,
)
from tests.monitoring.promql import parse

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
_RECORD_NAME = re.compile(r"^[a-z_]+(:[a-z0-9_]+){1,2}$")  # level:metric[:operations]
_ALERT_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
_RECORD_KEYS = {"record", "expr", "labels"}
_SEVERITIES = {"critical", "warning"}
# The server's fault; INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS... are the caller's.
_SERVER_FAULT_CODES = {"INTERNAL", "UNAVAILABLE", "DEADLINE_EXCEEDED", "UNKNOWN"}


def _rule_id(rule: dict[str, Any]) -> str:
    return str(rule.get("alert") or rule.get("record"))


def test_is_a_prometheus_rule_object() -> None:
    document = rule_document()
    assert document["apiVersion"] == "monitoring.coreos.com/v1"
    assert document["kind"] == "PrometheusRule"
    assert document["metadata"]["name"]
    assert set(document["spec"]) == {"groups"}


def test_groups_are_well_formed() -> None:
    names = [group["name"] for group in rule_groups()]
    assert len(names) == len(set(names)), names
    for group in rule_groups():
        assert set(group) <= {"name", "interval", "rules"}, group["name"]
        assert group["rules"], group["name"]
        assert _DURATION.match(str(group.get("interval", "1m"))), group["name"]


@pytest.mark.parametrize("rule", list(rules()), ids=_rule_id)
def test_rule_is_well_formed(rule: dict[str, Any]) -> None:
    assert ("alert" in rule) != ("record" in rule)
    assert isinstance(rule["expr"], str)
    assert rule["expr"].strip()
    if "record" in rule:
        assert set(rule) <= _RECORD_KEYS
        assert _RECORD_NAME.match(rule["record"])
    else:
        assert set(rule) <= _ALERT_KEYS
        assert _DURATION.match(str(rule["for"]))
    for key in ("labels", "annotations"):
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in rule.get(key, {}).items())


def test_names_are_unique() -> None:
    names = [_rule_id(rule) for rule in rules()]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("alert", alerts(), ids=_rule_id)
def test_alert_has_severity_summary_and_runbook(alert: dict[str, Any]) -> None:
    assert alert["labels"]["severity"] in _SEVERITIES
    assert alert["annotations"]["summary"].strip()
    url = RUNBOOK_URL.match(alert["annotations"]["runbook_url"])
    assert url, alert["annotations"]["runbook_url"]
    assert url.group("anchor") in RUNBOOK_ANCHORS


def test_the_runbook_says_where_to_point_the_alerts_links() -> None:
    assert f"`{RUNBOOK_BASE}`" in OPERATIONS_DOC.read_text()


def test_every_runbook_section_has_an_alert() -> None:
    used = {RUNBOOK_URL.match(a["annotations"]["runbook_url"]) for a in alerts()}
    assert {match.group("anchor") for match in used if match} == RUNBOOK_ANCHORS


@pytest.mark.parametrize("query", rule_queries(), ids=lambda query: query.where)
def test_reads_only_what_the_code_exports(query: Query) -> None:
    assert problems_with(query) == []


def test_every_recording_is_used() -> None:
    read = {metric for query in rule_queries() for metric in parse(query.expr).metrics}
    assert {rule["record"] for rule in rules() if "record" in rule} <= read


def test_lateness_objective_reads_the_60_second_bucket() -> None:
    """The burn-rate alerts stand on the hand-off histogram's le="60" bucket."""
    buckets = [
        matcher
        for query in rule_queries()
        for selector in parse(query.expr).selectors
        if selector.metric == "reminders_dispatch_handoff_lateness_seconds_bucket"
        for matcher in selector.matchers
        if matcher.label == "le"
    ]
    assert buckets
    for matcher in buckets:
        # Both the client's spelling and Prometheus 3's normalized one.
        assert re.fullmatch(matcher.value, "60.0")
        assert re.fullmatch(matcher.value, "60")


@pytest.mark.parametrize("histogram", ["claim_lateness", "handoff_lateness"])
def test_a_ring_caught_up_at_the_end_of_its_entry_s_retention_is_in_a_finite_bucket(
    histogram: str,
) -> None:
    """Past the last finite bucket a quantile reads as that bucket: after a day-long outage
    the dashboard's lateness said 1 h."""
    metrics = DispatcherMetrics()
    getattr(metrics, histogram).observe(Retention().bucket.total_seconds())
    name = f"reminders_dispatch_{histogram}_seconds"
    finite = [
        sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == f"{name}_bucket" and sample.labels["le"] != "+Inf"
    ]
    assert finite[-1] == 1


def test_expected_parts_follow_the_dispatchers_and_default_to_the_code_s() -> None:
    (rule,) = (r for r in rules() if r.get("record") == "reminders:dispatch_parts_expected")
    assert re.search(r"\breminders_dispatch_parts\[", rule["expr"]), rule["expr"]
    assert rule["expr"].strip().endswith(f"or vector({DEFAULT_PARTS})")


def test_api_errors_count_only_the_server_s_fault() -> None:
    matchers = [
        matcher
        for alert in alerts()
        if alert["annotations"]["runbook_url"].endswith("#api-errors")
        for selector in parse(alert["expr"]).selectors
        for matcher in selector.matchers
        if matcher.label == "code"
    ]
    assert matchers
    codes = {code.name for code in grpc.StatusCode}
    for matcher in matchers:
        assert matcher.op == "=~"
        assert {code for code in codes if re.fullmatch(matcher.value, code)} == (
            _SERVER_FAULT_CODES
        )


def test_markdown_anchors_are_heading_slugs_and_explicit_ids() -> None:
    text = "# Ops\n## Checkpoint lag\n### Clock offset (and clock not ready)\n"
    text += '<a id="api-errors"></a>\n## Parts without an owner {#parts-without-owner}\n'
    assert markdown_anchors(text) >= {
        "checkpoint-lag",
        "clock-offset-and-clock-not-ready",
        "api-errors",
        "parts-without-owner",
    }


def test_runbook_sections_exist_in_the_operations_doc() -> None:
    assert OPERATIONS_DOC.exists(), "docs/operations.md holds the alerts' runbook"
    missing = RUNBOOK_ANCHORS - markdown_anchors(OPERATIONS_DOC.read_text())
    assert not missing, f"docs/operations.md has no section for {sorted(missing)}"
