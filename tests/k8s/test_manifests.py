"""Every overlay builds with the pinned kustomize and each object is valid: built-in kinds
against the Kubernetes schemas (offline, kubernetes-validate, strict: unknown fields
fail), the K8ssandraCluster against its CRD from the pinned operator module. Then what
the manifests promise: secure pods, resources, probes, Cassandra as the design needs."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from reminders_svc.config import Replication
from reminders_svc.health import LIVENESS_SERVICE
from tests.k8s.tools import (
    K8S,
    OVERLAYS,
    REFERENCE_NOTIFIER_OVERLAYS,
    REPO,
    Crd,
    Obj,
    pruned_fields,
)
from tests.k8s.workloads import (
    container_env,
    containers_by_image,
    find,
    one,
    pods,
    selected_deployment,
)

# The oldest Kubernetes the manifests support (native gRPC probes: 1.24; the preStop
# sleep action: 1.30) and the newest whose schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CUSTOM_KINDS = {"K8ssandraCluster": "k8ssandra.io_k8ssandraclusters.yaml"}
NOTIFIER = "reminders-notifier"


def _long_running(overlay: str) -> tuple[str, ...]:
    """The Deployments of the overlay: the reference notifier only where it runs."""
    notifier = (NOTIFIER,) if overlay in REFERENCE_NOTIFIER_OVERLAYS else ()
    return ("reminders-api", "reminders-dispatcher", *notifier)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_holds_every_deployable(overlays: dict[str, list[Obj]], overlay: str) -> None:
    objects = overlays[overlay]
    for name in _long_running(overlay):
        one(objects, "Deployment", name)
    one(objects, "Service", "reminders-api")
    one(objects, "HorizontalPodAutoscaler", "reminders-dispatcher")
    one(objects, "PodDisruptionBudget", "reminders-dispatcher")
    one(objects, "Job", "reminders-migrate")
    if overlay in REFERENCE_NOTIFIER_OVERLAYS:
        one(objects, "Service", NOTIFIER)
        one(objects, "NetworkPolicy", NOTIFIER)
    (config,) = [
        c
        for c in find(objects, "ConfigMap")
        if c["metadata"]["name"].startswith("reminders-config")
    ]
    assert not find(objects, "Secret"), "secrets are the operator's, never committed"
    assert config["data"], "the settings ConfigMap is empty"


def test_prod_runs_no_reference_notifier_and_names_a_placeholder_target(
    overlays: dict[str, list[Obj]],
) -> None:
    """The reference notifier pushes to no device: in production every ring handed to it
    would be finalized unseen. Prod runs none of it and points the dispatchers at the
    placeholder the runbook tells the operator to replace."""
    objects = overlays["prod"]
    notifier_objects = [
        f"{obj['kind']} {obj['metadata']['name']}"
        for obj in objects
        if obj["metadata"]["name"] == NOTIFIER
        or obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "notifier"
    ]
    assert notifier_objects == [], f"prod deploys the reference notifier: {notifier_objects}"
    assert not containers_by_image(objects, NOTIFIER), "prod runs the reference notifier image"
    (container,) = one(objects, "Deployment", "reminders-dispatcher")["spec"]["template"]["spec"][
        "containers"
    ]
    target = container_env(objects, container)["REMINDERS_NOTIFIER_TARGET"]
    host, _, port = target.rpartition(":")
    assert port.isdigit(), f"{target}: no port"
    assert not find(objects, "Service", host), f"{target}: a Service of the overlay"
    assert host.endswith(".example.internal"), f"{target}: not the placeholder"
    assert f"`{target}`" in (REPO / "docs" / "operations.md").read_text(), (
        f"the runbook does not tell the operator to replace {target}"
    )


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_match_kubernetes_schemas(
    overlays: dict[str, list[Obj]], overlay: str, version: str
) -> None:
    for obj in overlays[overlay]:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        where = f"{overlay}: {obj['kind']} {obj['metadata']['name']} (Kubernetes {version})"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{where}: {error.message} at {list(error.path)}", pytrace=False)


def test_custom_resources_match_the_operator_crds(
    overlays: dict[str, list[Obj]], operator_crds: Path
) -> None:
    checked = 0
    for overlay, objects in overlays.items():
        for obj in objects:
            if obj["kind"] not in CUSTOM_KINDS:
                continue
            crd = Crd.load(operator_crds / CUSTOM_KINDS[obj["kind"]])
            crd.check(obj, f"{overlay}: {obj['kind']} {obj['metadata']['name']}")
            checked += 1
    assert checked, "no custom resource was checked"


def test_pruning_check_catches_a_misspelt_field(operator_crds: Path) -> None:
    crd = Crd.load(operator_crds / CUSTOM_KINDS["K8ssandraCluster"])
    typo = {"spec": {"reaper": {"autoScheduling": {"enabeld": True}}}}
    assert list(pruned_fields(typo, crd.schema_for("k8ssandra.io/v1alpha1"))) == [
        ".spec.reaper.autoScheduling.enabeld"
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_non_root_read_only_and_bounded(
    overlays: dict[str, list[Obj]], overlay: str
) -> None:
    for workload, spec in pods(overlays[overlay]):
        where = f"{overlay}: {workload['kind']} {workload['metadata']['name']}"
        security = spec["securityContext"]
        assert security["runAsNonRoot"] is True, where
        assert isinstance(security["runAsUser"], int), where
        assert security["runAsUser"] > 0, where
        assert spec.get("automountServiceAccountToken") is False, where
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in context["capabilities"], where
            for bound in ("requests", "limits"):
                assert set(container["resources"][bound]) == {"cpu", "memory"}, where
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, f"{where}: a writable /tmp (emptyDir)"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_long_running_pods_have_grpc_probes(overlays: dict[str, list[Obj]], overlay: str) -> None:
    """Readiness asks the whole server (SERVING only while its database answers);
    liveness and startup ask the process's own liveness service, so that a database
    outage takes pods out of their Services but never restarts them."""
    for name in _long_running(overlay):
        (container,) = one(overlays[overlay], "Deployment", name)["spec"]["template"]["spec"][
            "containers"
        ]
        where = f"{overlay} {name}"
        assert set(container["readinessProbe"]["grpc"]) == {"port"}, where
        for probe in ("livenessProbe", "startupProbe"):
            if probe in container:
                asked = container[probe]["grpc"].get("service")
                assert asked == LIVENESS_SERVICE, f"{where} {probe}"
        assert "livenessProbe" in container, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_disruption_budgets_and_autoscaler_select_their_pods(
    overlays: dict[str, list[Obj]], overlay: str
) -> None:
    objects = overlays[overlay]
    budgeted = set()
    for budget in find(objects, "PodDisruptionBudget"):
        selected_deployment(
            objects, budget["metadata"]["name"], budget["spec"]["selector"]["matchLabels"]
        )
        budgeted.add(budget["metadata"]["name"])
        # A drain may evict unready pods past the budget (every pod in a Cassandra outage,
        # dispatchers with a bad clock): the default policy would wait on them for ever.
        policy = budget["spec"].get("unhealthyPodEvictionPolicy")
        assert policy == "AlwaysAllow", f"{overlay}: {budget['metadata']['name']}"
    # A drain never takes every pod of a deployable at once.
    assert budgeted == {d["metadata"]["name"] for d in find(objects, "Deployment")}
    hpa = one(objects, "HorizontalPodAutoscaler", "reminders-dispatcher")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "reminders-dispatcher")
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    # The autoscaler owns the count: a Deployment's own would reset it at every apply.
    dispatchers = one(objects, "Deployment", "reminders-dispatcher")["spec"]
    assert "replicas" not in dispatchers
    # A rollout stops one dispatcher at a time, and not the next before the last one's
    # parts are taken (its drain, then the others' next tick).
    assert dispatchers["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert dispatchers["minReadySeconds"] >= 2 * 5  # REMINDERS_DISPATCH_LEASE_RENEW_S


def test_prod_api_scales_with_its_cpu_from_a_core_per_pod(
    overlays: dict[str, list[Obj]],
) -> None:
    """The base's 3 pods at half a core each serve about the average (docs/capacity.md:
    ~2 ms of CPU per create), with no room for the peak or a pod draining."""
    objects = overlays["prod"]
    api = one(objects, "Deployment", "reminders-api")["spec"]
    assert "replicas" not in api  # the autoscaler's: an apply would reset it
    (container,) = api["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["cpu"] == "1"
    hpa = one(objects, "HorizontalPodAutoscaler", "reminders-api")["spec"]
    target = hpa["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "reminders-api")
    assert 3 <= hpa["minReplicas"] < hpa["maxReplicas"]  # one per zone at least
    (metric,) = hpa["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["averageUtilization"] <= 90


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_long_running_pods_spread_over_zones_and_nodes(
    overlays: dict[str, list[Obj]], overlay: str
) -> None:
    """Without it the scheduler may put every API pod on one node: a node or zone lost
    takes the whole API down (a PodDisruptionBudget covers only voluntary evictions)."""
    for name in _long_running(overlay):
        template = one(overlays[overlay], "Deployment", name)["spec"]["template"]
        spread = {
            rule["topologyKey"]: rule for rule in template["spec"]["topologySpreadConstraints"]
        }
        assert set(spread) == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}, name
        for rule in spread.values():
            assert (
                rule["labelSelector"]["matchLabels"].items()
                <= template["metadata"]["labels"].items()
            ), f"{overlay} {name}: the rule counts other pods than its own"
            component = template["metadata"]["labels"]["app.kubernetes.io/component"]
            selected = rule["labelSelector"]["matchLabels"].get("app.kubernetes.io/component")
            assert selected == component, f"{overlay} {name}: spread among other pods too"
            # A hard rule would leave pods Pending on a cluster of one zone.
            assert rule["whenUnsatisfiable"] == "ScheduleAnyway", f"{overlay} {name}"


# DESIGN.md's busiest minute, and what one of its entries costs a dispatcher while it waits
# for its due (measured with tracemalloc: ~0.6 KB with its heap slot and seen-key).
BUSIEST_MINUTE_RINGS = 3_000_000
WAITING_ENTRY_BYTES = 700


def test_prod_dispatchers_at_their_minimum_hold_the_busiest_minute_in_half_their_memory(
    overlays: dict[str, list[Obj]],
) -> None:
    objects = overlays["prod"]
    pods = one(objects, "HorizontalPodAutoscaler", "reminders-dispatcher")["spec"]["minReplicas"]
    deployment = one(objects, "Deployment", "reminders-dispatcher")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    per_pod = BUSIEST_MINUTE_RINGS / pods * WAITING_ENTRY_BYTES
    assert per_pod < int(limit.removesuffix("Mi")) * 2**20 / 2


def test_prod_dispatchers_have_the_cores_capacity_plans(
    overlays: dict[str, list[Obj]],
) -> None:
    """docs/capacity.md: ~200 rings/s per dispatcher core, ~250 cores for the busiest
    minute; a dispatcher is one process on one event loop, so one core per pod."""
    objects = overlays["prod"]
    deployment = one(objects, "Deployment", "reminders-dispatcher")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    resources = container["resources"]
    assert resources["requests"]["cpu"] == "1", resources
    hpa = one(objects, "HorizontalPodAutoscaler", "reminders-dispatcher")["spec"]
    assert hpa["maxReplicas"] >= 250, hpa
    (metric,) = hpa["metrics"]
    target = metric["resource"]["target"]
    # Utilization is a share of the request; a process that cannot pass ~1 core must
    # reach the target within its one-core request.
    assert target["type"] == "Utilization"
    assert target["averageUtilization"] <= 90, target


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_cassandra_credentials_are_required_where_cassandra_checks_them(
    overlays: dict[str, list[Obj]], overlay: str
) -> None:
    """Prod's cluster authenticates: a pod started without the `reminders-cassandra`
    Secret would be refused for good, so it must wait for it (CreateContainerConfigError).
    Dev's node does not: its pods start without one."""
    refs = [
        (workload["metadata"]["name"], item["valueFrom"]["secretKeyRef"])
        for workload, spec in pods(overlays[overlay])
        for container in spec["containers"]
        for item in container.get("env", [])
        if item.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "reminders-cassandra"
    ]
    workloads = {name for name, _ in refs}
    assert workloads >= {"reminders-api", "reminders-dispatcher", "reminders-migrate"}, workloads
    for name, ref in refs:
        optional = ref.get("optional", False)
        assert optional is (overlay == "dev"), f"{overlay} {name}: {ref}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_token_keys_are_required_where_the_api_needs_them(
    overlays: dict[str, list[Obj]], overlay: str
) -> None:
    """Outside REMINDERS_ENV=dev the API exits without a token key: in prod it must wait
    for the `reminders-jwt` Secret (CreateContainerConfigError), not crash-loop. Dev's
    API starts without one (development keys)."""
    refs = [
        (workload["metadata"]["name"], item["name"], item["valueFrom"]["secretKeyRef"])
        for workload, spec in pods(overlays[overlay])
        for container in spec["containers"]
        for item in container.get("env", [])
        if item.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == "reminders-jwt"
    ]
    assert {(name, variable) for name, variable, _ in refs} == {
        ("reminders-api", "REMINDERS_JWT_SECRET"),
        ("reminders-api", "REMINDERS_ADMIN_JWT_SECRET"),
    }
    for name, variable, ref in refs:
        optional = ref.get("optional", False)
        assert optional is (overlay == "dev"), f"{overlay} {name} {variable}: {ref}"


def _settings(objects: list[Obj]) -> dict[str, str]:
    (container,) = one(objects, "Job", "reminders-migrate")["spec"]["template"]["spec"][
        "containers"
    ]
    return container_env(objects, container)


def test_dev_runs_one_cassandra_node_with_paxos_v2(overlays: dict[str, list[Obj]]) -> None:
    objects = overlays["dev"]
    node = one(objects, "StatefulSet", "cassandra")
    assert node["spec"]["replicas"] == 1
    (container,) = node["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "cassandra:5.0.9"
    env = {item["name"]: item["value"] for item in container["env"]}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert f"-Dcassandra.config=file://{mount['mountPath']}/cassandra.yaml" in env["JVM_EXTRA_OPTS"]
    volume = next(v for v in node["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    config = yaml.safe_load(
        one(objects, "ConfigMap", volume["configMap"]["name"])["data"]["cassandra.yaml"]
    )
    assert config["paxos_variant"] == "v2"
    settings = _settings(objects)
    service = one(objects, "Service", settings["REMINDERS_CASSANDRA_CONTACT_POINTS"])
    assert (
        service["spec"]["selector"].items()
        <= node["spec"]["template"]["metadata"]["labels"].items()
    )
    assert Replication.parse(settings["REMINDERS_CASSANDRA_REPLICATION"]) == Replication(
        "SimpleStrategy", (("replication_factor", 1),)
    )
    assert config["endpoint_snitch"] == "SimpleSnitch"
    assert settings["REMINDERS_CASSANDRA_LOCAL_DC"] == "datacenter1"  # SimpleSnitch's DC


def test_prod_cluster_is_rf3_local_quorum_paxos_v2_repaired(overlays: dict[str, list[Obj]]) -> None:
    objects = overlays["prod"]
    cluster = one(objects, "K8ssandraCluster")
    cassandra = cluster["spec"]["cassandra"]
    assert cassandra["serverVersion"].startswith("5.0.")
    yaml_config = cassandra["config"]["cassandraYaml"]
    assert yaml_config["paxos_variant"] == "v2"
    assert yaml_config["paxos_state_purging"] == "repaired"
    (dc,) = cassandra["datacenters"]
    settings = _settings(objects)
    dc_name = dc["metadata"]["name"]
    assert Replication.parse(settings["REMINDERS_CASSANDRA_REPLICATION"]) == Replication(
        "NetworkTopologyStrategy", ((dc_name, 3),)
    )
    assert dc["size"] >= 3
    assert settings["REMINDERS_CASSANDRA_LOCAL_DC"] == dc_name
    assert settings["REMINDERS_CASSANDRA_CONSISTENCY"] == "LOCAL_QUORUM"
    assert settings["REMINDERS_CASSANDRA_SERIAL_CONSISTENCY"] == "SERIAL"
    # cass-operator names the data centre's Service <cluster>-<dc>-service.
    service = f"{cluster['metadata']['name']}-{dc_name}-service"
    assert settings["REMINDERS_CASSANDRA_CONTACT_POINTS"] == service


def test_prod_schedules_paxos_repairs_of_every_lwt_keyspace(overlays: dict[str, list[Obj]]) -> None:
    objects = overlays["prod"]
    cluster = one(objects, "K8ssandraCluster")
    assert cluster["spec"]["reaper"]["autoScheduling"]["enabled"] is True
    cron = one(objects, "CronJob", "cassandra-paxos-repair")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    (container,) = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    script = " ".join(container["command"] + container["args"])
    assert "repair --paxos-only" in script
    env = {item["name"]: item.get("value") for item in container["env"]}
    settings = _settings(objects)
    # The service's keyspace, and no other: a keyspace that does not exist (the reference
    # notifier's, not deployed here) fails the whole run.
    assert env["KEYSPACES"].split() == [settings["REMINDERS_CASSANDRA_KEYSPACE"]]
    name, dc = cluster["metadata"]["name"], cluster["spec"]["cassandra"]["datacenters"][0]
    assert env["PODS_SERVICE"] == f"{name}-{dc['metadata']['name']}-all-pods-service"
    refs = {
        item["valueFrom"]["secretKeyRef"]["name"]
        for item in container["env"]
        if "valueFrom" in item
    }
    assert refs == {f"{name}-superuser"}, "the operator's superuser Secret (JMX login)"


def test_runbook_states_the_oldest_kubernetes_supported() -> None:
    oldest = ".".join(KUBERNETES_VERSIONS[0].split(".")[:2])
    assert f"Kubernetes {oldest} or later" in (REPO / "docs" / "operations.md").read_text()


def test_runbook_selects_jobs_by_labels_they_carry(overlays: dict[str, list[Obj]]) -> None:
    """docs/operations.md lists Jobs by label (`kubectl get jobs -l k=v`): some Job must
    carry it. A CronJob's Jobs take theirs from jobTemplate.metadata, not from the pod
    template."""
    runbook = (REPO / "docs" / "operations.md").read_text()
    selectors = re.findall(r"kubectl get jobs -l\s+([\w./-]+)=([\w.-]+)", runbook)
    assert selectors, "the runbook no longer lists Jobs by label"
    objects = overlays["prod"]
    job_labels = [job["metadata"].get("labels", {}) for job in find(objects, "Job")] + [
        cron["spec"]["jobTemplate"].get("metadata", {}).get("labels", {})
        for cron in find(objects, "CronJob")
    ]
    for key, value in selectors:
        assert any(labels.get(key) == value for labels in job_labels), f"no Job has {key}={value}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_patch_file_deletes_several_objects(overlay: str) -> None:
    """kustomize before 5.7 (the one in kubectl before 1.34, which the runbook supports)
    panics on a patch file of several `$patch: delete` documents: one inline patch each."""
    directory = K8S / "overlays" / overlay
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    for patch in kustomization.get("patches", []):
        if "path" not in patch:
            continue
        documents = [d for d in yaml.safe_load_all((directory / patch["path"]).read_text()) if d]
        deletes = [d for d in documents if d.get("$patch") == "delete"]
        assert len(deletes) <= 1, f"{overlay}: {patch['path']} deletes {len(deletes)} objects"
