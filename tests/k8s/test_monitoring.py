"""k8s/monitoring builds with the pinned kustomize, its Prometheus Operator objects match
the CRDs of the pinned operator module, and its PodMonitor scrapes every long-running
deployable of either overlay (tests/monitoring checks the rules and the dashboard)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from tests.k8s.tools import OVERLAYS, REFERENCE_NOTIFIER_OVERLAYS, Crd, Obj
from tests.k8s.workloads import one, selected_deployment

OPERATOR_KINDS = {
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}
SCRAPED = ("reminders-api", "reminders-dispatcher", "reminders-notifier")


def test_monitoring_objects_match_their_schemas(
    monitoring: list[Obj], monitoring_crds: Path
) -> None:
    for obj in monitoring:
        where = f"monitoring: {obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] in OPERATOR_KINDS:
            Crd.load(monitoring_crds / OPERATOR_KINDS[obj["kind"]]).check(obj, where)
            continue
        try:
            kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{where}: {error.message} at {list(error.path)}", pytrace=False)
    assert {obj["kind"] for obj in monitoring} >= set(OPERATOR_KINDS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_monitor_scrapes_every_long_running_deployable(
    overlays: dict[str, list[Obj]], monitoring: list[Obj], overlay: str
) -> None:
    spec = one(monitoring, "PodMonitor")["spec"]
    # Only matchLabels is read below; no namespaceSelector: the overlay's own namespace.
    assert set(spec) == {"selector", "podMetricsEndpoints", "podTargetLabels"}, spec
    assert set(spec["selector"]) == {"matchLabels"}, spec["selector"]
    endpoints = spec["podMetricsEndpoints"]
    assert endpoints, "the PodMonitor scrapes no port"
    for name in SCRAPED:
        if name == "reminders-notifier" and overlay not in REFERENCE_NOTIFIER_OVERLAYS:
            continue
        deployment = selected_deployment(overlays[overlay], name, spec["selector"]["matchLabels"])
        # The labels copied onto its samples (the alerts tell the deployables apart by them).
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert set(spec["podTargetLabels"]) <= set(pod_labels), f"{overlay} {name}"
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            declared = {port["name"] for port in container.get("ports", [])}
            for endpoint in endpoints:
                assert endpoint["port"] in declared, f"{overlay} {name}: no port {endpoint}"
