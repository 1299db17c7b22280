"""The manifests agree with the code: each container runs a real subcommand, its
environment parses with the code's own settings classes, every REMINDERS_* name it sets
is one the code reads, and its ports, probes and grace period are the ones the process
binds and needs."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from dispatcher import cli as dispatcher_cli
from dispatcher.settings import DispatcherSettings
from notifier import cli as notifier_cli
from notifier.settings import NotifierSettings
from reminders_svc.api import serve_cli
from reminders_svc.api.auth import AuthSettings
from reminders_svc.api.settings import ApiSettings
from reminders_svc.cli import build_parser
from reminders_svc.config import MESH_VARIABLE, CassandraSettings, ConfigError
from reminders_svc.storage import migrate_cli
from tests.k8s.tools import OVERLAYS, REFERENCE_NOTIFIER_OVERLAYS, Obj
from tests.k8s.workloads import container_env, find, one, selected_deployment


class ReadingEnv(dict[str, str]):
    """An environment that records every name the code looks up in it."""

    def __init__(self, values: Mapping[str, str]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return super().__contains__(key)


@dataclass(frozen=True)
class Served:
    """What a long-running process binds, and how long it drains on SIGTERM."""

    host: str
    port: int
    metrics_port: int
    shutdown_grace_s: float

    @classmethod
    def of(cls, settings: ApiSettings | DispatcherSettings | NotifierSettings) -> Served:
        grace = settings.shutdown_grace.total_seconds()
        return cls(settings.host, settings.port, settings.metrics_port, grace)


def _api(env: Mapping[str, str]) -> Served:
    CassandraSettings.from_env(env)
    AuthSettings.from_env(env)
    return Served.of(ApiSettings.from_env(env))


def _dispatcher(env: Mapping[str, str]) -> Served:
    CassandraSettings.from_env(env)
    return Served.of(DispatcherSettings.from_env(env))


def _notifier(env: Mapping[str, str]) -> Served:
    return Served.of(NotifierSettings.from_env(env))


def _migrate(env: Mapping[str, str]) -> None:
    CassandraSettings.from_env(env)


@dataclass(frozen=True)
class Deployable:
    workload: tuple[str, str]  # kind, name
    subcommand: str
    handler: Callable[[argparse.Namespace], int]
    settings: Callable[[Mapping[str, str]], Served | None]
    # Seconds between the end of the drain and the process exiting (releases, closes).
    after_drain_s: float = 0.0
    # Seconds between SIGTERM and the start of the drain (work the stop waits for).
    before_drain_s: float = 0.0


DEPLOYABLES = {
    "api": Deployable(("Deployment", "reminders-api"), "serve-api", serve_cli.run, _api),
    # After the grace, with a slow database: up to a lease-renewal tick (5 s) before what
    # still runs is cut short, its claims released by LWT (up to the 12 s request timeout),
    # then the leases (an LWT each, up to 12 s again), then leaving the fleet (12 s more).
    # Before it, a tick under way at SIGTERM ends: a lease take in it is awaited (a read,
    # the LWT and a SERIAL read settling it, 12 s each).
    "dispatcher": Deployable(
        ("Deployment", "reminders-dispatcher"),
        "dispatch",
        dispatcher_cli.run,
        _dispatcher,
        after_drain_s=41,
        before_drain_s=36,
    ),
    "notifier": Deployable(
        ("Deployment", "reminders-notifier"), "notifier", notifier_cli.run, _notifier
    ),
    "migrate": Deployable(("Job", "reminders-migrate"), "migrate", migrate_cli.run, _migrate),
}


def _deployed(overlay: str) -> list[str]:
    """The deployables the overlay runs: the reference notifier only where it runs."""
    return [
        name for name in DEPLOYABLES if name != "notifier" or overlay in REFERENCE_NOTIFIER_OVERLAYS
    ]


CASES = [(overlay, name) for overlay in OVERLAYS for name in _deployed(overlay)]


def _pod(objects: list[Obj], deployable: Deployable) -> tuple[Obj, Obj]:
    spec = one(objects, *deployable.workload)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def _served(
    objects: list[Obj], name: str, *, unset: tuple[str, ...] = ()
) -> tuple[Obj, Obj, Served]:
    """The pod spec and container of a long-running deployable, and what its settings
    bind (with the variables ending in any of `unset` left out of its environment)."""
    deployable = DEPLOYABLES[name]
    spec, container = _pod(objects, deployable)
    env = container_env(objects, container)
    kept = {k: v for k, v in env.items() if not (unset and k.endswith(unset))}
    served = deployable.settings(kept)
    assert served is not None, f"{name} serves nothing"
    return spec, container, served


@pytest.mark.parametrize(("overlay", "name"), CASES)
def test_command_is_the_deployables_subcommand(
    overlays: dict[str, list[Obj]], overlay: str, name: str
) -> None:
    deployable = DEPLOYABLES[name]
    _, container = _pod(overlays[overlay], deployable)
    assert container["command"] == ["reminders", deployable.subcommand]
    assert "args" not in container
    parsed = build_parser().parse_args([deployable.subcommand])
    assert parsed.handler is deployable.handler


@pytest.mark.parametrize(("overlay", "name"), CASES)
def test_every_variable_set_is_one_the_code_reads(
    overlays: dict[str, list[Obj]], overlay: str, name: str
) -> None:
    """Names in the container's own `env` must be read by its process; the shared
    ConfigMap's names by at least one of the deployables."""
    objects = overlays[overlay]
    deployable = DEPLOYABLES[name]
    _, container = _pod(objects, deployable)
    env = ReadingEnv(container_env(objects, container))
    deployable.settings(env)
    own = {item["name"] for item in container.get("env", [])}
    assert own - env.read == set(), f"{overlay} {name}: set but never read"
    assert all(variable.startswith("REMINDERS_") for variable in env)


@pytest.mark.parametrize("name", ["api", "dispatcher"])
def test_the_prod_overlay_without_its_mesh_line_refuses_plaintext(
    overlays: dict[str, list[Obj]], name: str
) -> None:
    """The shipped prod overlay runs its links in plaintext for a mesh, and says so; an SRE
    without a mesh deletes that line, and the API and the dispatchers then refuse to start
    until their TLS variables are set, rather than carry texts and tokens readable."""
    objects = overlays["prod"]
    _, container = _pod(objects, DEPLOYABLES[name])
    env = container_env(objects, container)
    assert env.pop(MESH_VARIABLE) == "true"
    with pytest.raises(ConfigError, match="is plaintext to"):
        DEPLOYABLES[name].settings(env)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_shared_setting_is_read_by_some_deployable(
    overlays: dict[str, list[Obj]], overlay: str
) -> None:
    objects = overlays[overlay]
    read: set[str] = set()
    shared: set[str] = set()
    for name in _deployed(overlay):
        deployable = DEPLOYABLES[name]
        _, container = _pod(objects, deployable)
        env = ReadingEnv(container_env(objects, container))
        deployable.settings(env)
        read |= env.read
        for source in container["envFrom"]:
            shared |= set(one(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
    assert shared, "no shared settings"
    assert shared - read == set(), f"{overlay}: in the ConfigMap but read by no deployable"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_migrate_job_fails_at_once_on_bad_configuration_and_retries_storage_trouble(
    overlays: dict[str, list[Obj]], overlay: str
) -> None:
    """Retried under `restartPolicy: OnFailure`, a typo in a setting held the Job (and a
    `kubectl wait` on it) for its whole hour."""
    job = one(overlays[overlay], *DEPLOYABLES["migrate"].workload)["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "Never"  # else no exit code is read
    fail_at_once = [
        rule["onExitCodes"]
        for rule in job["podFailurePolicy"]["rules"]
        if rule["action"] == "FailJob" and "onExitCodes" in rule
    ]
    assert fail_at_once == [
        {
            "containerName": "migrate",
            "operator": "In",
            "values": [migrate_cli.EXIT_BAD_CONFIGURATION],
        }
    ]
    assert job["backoffLimit"] > 10  # storage trouble (exit 1): a cluster still starting


SERVING = [(overlay, name) for overlay, name in CASES if name != "migrate"]


@pytest.mark.parametrize(("overlay", "name"), SERVING)
def test_ports_probes_and_grace_agree_with_the_settings(
    overlays: dict[str, list[Obj]], overlay: str, name: str
) -> None:
    spec, container, served = _served(overlays[overlay], name)
    where = f"{overlay} {name}"
    all_interfaces = "0.0.0.0"  # noqa: S104  (in a pod: the kubelet probes the pod IP)
    assert served.host == all_interfaces, f"{where}: binds {served.host}, unreachable by probes"
    ports = {port["containerPort"] for port in container["ports"]}
    assert ports == {served.port, served.metrics_port}, where
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in container:
            assert container[probe]["grpc"]["port"] == served.port, f"{where} {probe}"
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    deployable = DEPLOYABLES[name]
    needed = (
        pre_stop + deployable.before_drain_s + served.shutdown_grace_s + deployable.after_drain_s
    )
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > needed, f"{where}: SIGKILL after {grace} s, the process needs {needed} s"
    assert grace <= needed + 15, f"{where}: {grace} s is far above the drain time {needed} s"


@pytest.mark.parametrize(("overlay", "name"), SERVING)
def test_configured_ports_and_grace_are_the_code_defaults(
    overlays: dict[str, list[Obj]], overlay: str, name: str
) -> None:
    """The ConfigMap restates the defaults (README, docs) rather than drifting from them."""
    _, _, served = _served(overlays[overlay], name)
    _, _, defaults = _served(overlays[overlay], name, unset=("_PORT", "_GRACE_S", "_HOST"))
    configured = (served.port, served.metrics_port, served.shutdown_grace_s)
    assert configured == (defaults.port, defaults.metrics_port, defaults.shutdown_grace_s)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_route_to_the_ports_the_code_binds(
    overlays: dict[str, list[Obj]], overlay: str
) -> None:
    objects = overlays[overlay]
    checked = 0
    for service in find(objects, "Service"):
        selector = service["spec"]["selector"]
        if selector.get("app.kubernetes.io/name") != "reminders":
            continue
        checked += 1
        deployment = selected_deployment(objects, service["metadata"]["name"], selector)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        named = {port["name"]: port["containerPort"] for port in container["ports"]}
        for port in service["spec"]["ports"]:
            assert named[port["targetPort"]] == port["port"], f"{overlay} {port}"
    expected = 2 if overlay in REFERENCE_NOTIFIER_OVERLAYS else 1
    assert checked == expected, f"{overlay}: the API's and (dev) the notifier's Services"


@pytest.mark.parametrize(("overlay", "name"), SERVING)
def test_pod_monitor_scrapes_the_port_the_code_serves_metrics_on(
    overlays: dict[str, list[Obj]], monitoring: list[Obj], overlay: str, name: str
) -> None:
    _, container, served = _served(overlays[overlay], name)
    named = {port["name"]: port["containerPort"] for port in container["ports"]}
    for endpoint in one(monitoring, "PodMonitor")["spec"]["podMetricsEndpoints"]:
        assert named.get(endpoint["port"]) == served.metrics_port, f"{overlay} {name} {endpoint}"


@pytest.mark.parametrize("overlay", REFERENCE_NOTIFIER_OVERLAYS)
def test_dispatchers_reach_the_notifier_service(
    overlays: dict[str, list[Obj]], overlay: str
) -> None:
    objects = overlays[overlay]
    _, container = _pod(objects, DEPLOYABLES["dispatcher"])
    target = DispatcherSettings.from_env(container_env(objects, container)).notifier_target
    host, _, port = target.rpartition(":")
    service = one(objects, "Service", host)
    _, notifier = _pod(objects, DEPLOYABLES["notifier"])
    notifier_port = NotifierSettings.from_env(container_env(objects, notifier)).port
    (grpc,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
    assert grpc["targetPort"] == "grpc"
    assert {"name": "grpc", "containerPort": notifier_port} in notifier["ports"]


def _labels(objects: list[Obj], kind: str, name: str) -> dict[str, str]:
    labels: dict[str, str] = one(objects, kind, name)["spec"]["template"]["metadata"]["labels"]
    return labels


def _container_port(container: Obj, port: int | str) -> int:
    """A NetworkPolicy's port (a number, or the name of one of the container's ports) as
    the number the container listens on."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(number)


@pytest.mark.parametrize("overlay", REFERENCE_NOTIFIER_OVERLAYS)
def test_only_dispatchers_reach_the_notifiers_grpc_port(
    overlays: dict[str, list[Obj]], monitoring: list[Obj], overlay: str
) -> None:
    """The notifier's NetworkPolicy selects the notifier's pods; its gRPC port (the one
    the settings bind, and the one the dispatchers' target reaches through the Service) is
    open to the dispatchers' pods of the namespace only; its metrics port (the one the
    PodMonitor scrapes) to Prometheus; no other port to anyone."""
    objects = overlays[overlay]
    policy = one(objects, "NetworkPolicy", "reminders-notifier")["spec"]
    selected_deployment(objects, "reminders-notifier", policy["podSelector"]["matchLabels"])
    assert policy["policyTypes"] == ["Ingress"]
    _, notifier, served = _served(objects, "notifier")
    others = [
        _labels(objects, *DEPLOYABLES[name].workload) for name in ("api", "notifier", "migrate")
    ]
    allowed: dict[int, list[Obj]] = {}
    for rule in policy["ingress"]:
        assert rule.get("from"), f"{overlay}: a rule open to every source"
        assert rule.get("ports"), f"{overlay}: a rule open on every port"
        for port in rule["ports"]:
            assert port.get("protocol", "TCP") == "TCP"
            assert "endPort" not in port
            allowed.setdefault(_container_port(notifier, port["port"]), []).extend(rule["from"])
    assert set(allowed) == {served.port, served.metrics_port}, f"{overlay}: {allowed}"

    # gRPC: one peer, pods of this namespace that are the dispatchers and nothing else.
    (peer,) = allowed[served.port]
    assert set(peer) == {"podSelector"}, f"{overlay}: {peer}"
    selector = peer["podSelector"]["matchLabels"]
    assert set(peer["podSelector"]) == {"matchLabels"}
    selected_deployment(objects, "reminders-dispatcher", selector)
    assert not any(selector.items() <= labels.items() for labels in others), selector
    _, dispatcher = _pod(objects, DEPLOYABLES["dispatcher"])
    target = DispatcherSettings.from_env(container_env(objects, dispatcher)).notifier_target
    host, _, port = target.rpartition(":")
    (service_port,) = [
        p for p in one(objects, "Service", host)["spec"]["ports"] if p["port"] == int(port)
    ]
    assert _container_port(notifier, service_port["targetPort"]) == served.port

    # Metrics: Prometheus, as the Prometheus Operator labels its pods, on the port scraped.
    (scraper,) = allowed[served.metrics_port]
    assert scraper["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "prometheus"
    for endpoint in one(monitoring, "PodMonitor")["spec"]["podMetricsEndpoints"]:
        assert _container_port(notifier, endpoint["port"]) == served.metrics_port
