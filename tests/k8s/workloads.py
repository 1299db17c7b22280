"""Reading built manifests: pod templates, containers, and the environment a container
would start with."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from tests.k8s.tools import Obj


def find(objects: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [
        obj
        for obj in objects
        if obj["kind"] == kind and (name is None or obj["metadata"]["name"] == name)
    ]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def selected_deployment(objects: list[Obj], name: str, selector: dict[str, str]) -> Obj:
    """The Deployment `name`, whose pods `selector` must select."""
    deployment = one(objects, "Deployment", name)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items(), f"{selector} does not select {name}'s pods"
    return deployment


def pod_spec(obj: Obj) -> Obj | None:
    """The pod template's spec of a workload (CronJob: of its Job template), else None."""
    spec = obj.get("spec", {})
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template = spec.get("template")
    return template["spec"] if isinstance(template, dict) else None


def pods(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(workload, pod spec) of every object that runs pods."""
    for obj in objects:
        spec = pod_spec(obj)
        if spec is not None:
            yield obj, spec


def image_name(reference: str) -> str:
    """The image's name without registry, path or tag: `reminders-api` of
    `registry.example.com:5000/reminders/reminders-api:0.1.0`."""
    return reference.rpartition("/")[2].partition(":")[0].partition("@")[0]


def containers_by_image(objects: list[Obj], image: str) -> list[tuple[Obj, Obj]]:
    """(pod spec, container) of every container whose image is `image` (any registry,
    any tag)."""
    return [
        (spec, container)
        for _, spec in pods(objects)
        for container in spec["containers"]
        if image_name(container["image"]) == image
    ]


def placeholder(ref: Obj) -> str:
    """A stand-in for a value only the cluster knows (a Secret's key, a pod field): long
    enough for any length rule and distinct per reference."""
    digest = hashlib.sha256(repr(sorted(ref.items())).encode()).hexdigest()
    return f"placeholder-{digest}"


def container_env(objects: list[Obj], container: Obj) -> dict[str, str]:
    """The environment the container starts with: envFrom ConfigMaps, then `env`."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert set(source) == {"configMapRef"}, f"unexpected envFrom {source}"
        config_map = one(objects, "ConfigMap", source["configMapRef"]["name"])
        env.update(config_map["data"])
    for item in container.get("env", []):
        value: Any = item.get("value")
        if value is None:
            value_from = item["valueFrom"]
            (ref,) = value_from.values()
            value = placeholder(ref)
        env[item["name"]] = str(value)
    return env
