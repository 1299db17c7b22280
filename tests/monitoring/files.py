"""The monitoring files under k8s/monitoring/, loaded, and what the checks share."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.monitoring.exported import TARGET_LABELS, exported
from tests.monitoring.promql import Expression, parse

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "k8s" / "monitoring"
RULES = MONITORING / "prometheus-rules.yaml"
DASHBOARD = MONITORING / "reminders-dashboard.json"
POD_MONITOR = MONITORING / "pod-monitor.yaml"
# Series the scrape itself makes for every target, with only the target's labels.
SCRAPE_SERIES = frozenset({"up"})
OPERATIONS_DOC = ROOT / "docs" / "operations.md"

# The sections of docs/operations.md that the alerts' runbook_url point at.
RUNBOOK_ANCHORS = frozenset(
    {
        "lateness-burn-rate",
        "checkpoint-lag",
        "parts-without-owner",
        "oldest-unresolved-claim",
        "clock-offset",
        "rings-set-aside",
        "notifier-errors",
        "api-errors",
    }
)
# Where the alerts say the runbook is: a placeholder the runbook tells the operator to
# replace with where their team reads it (an alert's link must be absolute to open).
RUNBOOK_BASE = "https://git.example.internal/reminders/blob/main/docs/operations.md"
RUNBOOK_URL = re.compile(rf"^{re.escape(RUNBOOK_BASE)}#(?P<anchor>[a-z0-9-]+)$")


@dataclass(frozen=True)
class Query:
    where: str  # a rule's or a panel's name, for messages
    expr: str
    legend: str = ""


def rule_document() -> dict[str, Any]:
    document = yaml.safe_load(RULES.read_text())
    assert isinstance(document, dict)
    return document


def rule_groups() -> list[dict[str, Any]]:
    groups = rule_document()["spec"]["groups"]
    assert isinstance(groups, list)
    return groups


def rules() -> Iterator[dict[str, Any]]:
    for group in rule_groups():
        yield from group["rules"]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def recorded() -> frozenset[str]:
    return frozenset(rule["record"] for rule in rules() if "record" in rule)


def rule_queries() -> list[Query]:
    return [Query(rule.get("alert") or rule["record"], rule["expr"]) for rule in rules()]


def dashboard() -> dict[str, Any]:
    document = json.loads(DASHBOARD.read_text())
    assert isinstance(document, dict)
    return document


def panels() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return found


def dashboard_queries() -> list[Query]:
    return [
        Query(panel["title"], target["expr"], target.get("legendFormat", ""))
        for panel in panels()
        for target in panel.get("targets", [])
    ]


def scrape_labels() -> frozenset[str]:
    """The labels the scrape gives every sample: Prometheus's and the operator's, and the
    pod labels the PodMonitor copies (podTargetLabels, named as Prometheus sanitizes)."""
    spec = yaml.safe_load(POD_MONITOR.read_text())["spec"]
    copied = {re.sub(r"[^a-zA-Z0-9_]", "_", label) for label in spec.get("podTargetLabels", [])}
    return TARGET_LABELS | copied


def problems_with(query: Query) -> list[str]:
    """Why `query` would read something the code does not export: an unknown sample name,
    a label the sample does not have, a histogram bucket that does not exist."""
    metrics = exported()
    target_labels = scrape_labels()
    known = {**metrics.labels, **dict.fromkeys(SCRAPE_SERIES, frozenset[str]())}
    try:
        expression = parse(query.expr)
    except ValueError as error:
        return [f"{query.where}: {error}"]
    problems: list[str] = []
    known_recorded = recorded()
    for selector in expression.selectors:
        if selector.metric in known_recorded:
            continue
        if selector.metric not in known:
            problems.append(f"{query.where}: {selector.metric} is not exported by the code")
            continue
        for matcher in selector.matchers:
            if matcher.label not in known[selector.metric] | target_labels:
                problems.append(f"{query.where}: {selector.metric} has no label {matcher.label}")
            elif matcher.label == "le" and not _matches_any(
                matcher.op, matcher.value, metrics.buckets[selector.metric]
            ):
                problems.append(f"{query.where}: {selector.metric} has no bucket {matcher.value}")
    available = _labels_of(expression, known_recorded) | target_labels
    for label in expression.grouping | _legend_labels(query.legend):
        if label not in available:
            problems.append(f"{query.where}: no metric it reads has a label {label}")
    return problems


def _labels_of(expression: Expression, known_recorded: frozenset[str]) -> frozenset[str]:
    labels = exported().labels
    return frozenset(
        label
        for metric in expression.metrics - known_recorded
        for label in labels.get(metric, frozenset())
    )


def _legend_labels(legend: str) -> frozenset[str]:
    return frozenset(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))


def _matches_any(op: str, value: str, candidates: frozenset[str]) -> bool:
    if op == "=":
        return value in candidates
    if op == "=~":
        return any(re.fullmatch(value, candidate) for candidate in candidates)
    return True  # a negative matcher names no bucket that must exist


def markdown_anchors(text: str) -> frozenset[str]:
    """The anchors a Markdown page offers: its headings' GitHub slugs and explicit ids."""
    anchors: set[str] = set()
    for line in text.splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
        anchors.update(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", line))
        anchors.update(re.findall(r"\{#([\w-]+)\}", line))
    return frozenset(anchors)
