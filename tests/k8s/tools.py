"""The tools the k8s tests need, pinned: kustomize (built by `make kustomize`), the
k8ssandra-operator and prometheus-operator Go modules (for their CRDs), and the built
overlays and k8s/monitoring as plain objects.

A missing tool skips a test with the command that provides it, except in CI
(CI=true), where it fails: CI must never pass by skipping (tests/ci.py).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.ci import unavailable
from tests.pins import makefile_pin

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = ("dev", "prod")
# The overlays that run the reference notifier (it pushes to no device): prod hands off to
# the real Notification Service instead (k8s/overlays/prod/kustomization.yaml).
REFERENCE_NOTIFIER_OVERLAYS = ("dev",)
# The operator whose CRD the prod overlay's K8ssandraCluster must satisfy.
K8SSANDRA_OPERATOR = "github.com/k8ssandra/k8ssandra-operator"
K8SSANDRA_OPERATOR_VERSION = "v1.20.0"
# The operator whose CRDs k8s/monitoring's PodMonitor and PrometheusRule must satisfy.
PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"

Obj = dict[str, Any]


def kustomize() -> Path:
    """The pinned kustomize binary where `make kustomize` puts it."""
    version = makefile_pin("KUSTOMIZE_VERSION")
    binary = REPO / ".cache" / "go" / f"kustomize-{version}" / "kustomize"
    if not binary.is_file():
        unavailable(f"kustomize {version} is not built: run `make kustomize` ({binary})")
    printed = _run([str(binary), "version"]).strip()
    assert printed == version, f"{binary} says {printed!r}, the Makefile pins {version}"
    return binary


def build_overlay(binary: Path, overlay: str) -> list[Obj]:
    return build(binary, K8S / "overlays" / overlay)


def build(binary: Path, directory: Path) -> list[Obj]:
    text = _run([str(binary), "build", str(directory)])
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _run(command: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, env=env, cwd=cwd
    )
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stderr}"
    return result.stdout


def operator_module_dir(
    path: str = K8SSANDRA_OPERATOR, version: str = K8SSANDRA_OPERATOR_VERSION
) -> Path:
    """A pinned operator module in Go's module cache (fetched once from the Go module
    proxy; later runs read the cache, offline)."""
    go = shutil.which("go")
    if go is None:
        unavailable(f"the Go toolchain (`go`) is needed to fetch the CRDs of {path}")
    module = f"{path}@{version}"
    # From the file system's root: outside any module, no go.mod is read or written.
    env = {**os.environ, "GO111MODULE": "on"}
    info = json.loads(_run([go, "mod", "download", "-json", module], env=env, cwd=Path("/")))
    assert "Error" not in info, f"go mod download {module}: {info.get('Error')}"
    return Path(info["Dir"])


@dataclass(frozen=True)
class Crd:
    group: str
    kind: str
    versions: dict[str, Obj]  # version name -> openAPIV3Schema

    @classmethod
    @functools.cache
    def load(cls, path: Path) -> Crd:
        """Parsed once per session (the K8ssandraCluster CRD is 30,000 lines)."""
        doc = yaml.safe_load(path.read_text())
        spec = doc["spec"]
        versions = {v["name"]: v["schema"]["openAPIV3Schema"] for v in spec["versions"]}
        return cls(spec["group"], spec["names"]["kind"], versions)

    def schema_for(self, api_version: str) -> Obj:
        group, _, version = api_version.rpartition("/")
        assert group == self.group, f"{api_version}: the CRD serves {self.group}"
        assert version in self.versions, f"{api_version}: the CRD serves {list(self.versions)}"
        return self.versions[version]

    def check(self, obj: Obj, where: str) -> None:
        """`obj` as the API server would take it: valid, and no field silently dropped."""
        schema = self.schema_for(obj["apiVersion"])
        # Not jsonschema.validate: it first compiles the schema's patterns with Python's
        # re, and CRDs carry Go ones (the PrometheusRule's `^(?i)(abort|warn)?$`).
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
        if error is not None:
            pytest.fail(f"{where}: {error.message} at {list(error.path)}", pytrace=False)
        assert not list(pruned_fields(obj, schema)), f"{where}: fields the CRD drops"


def pruned_fields(value: Any, schema: Obj, path: str = "") -> Iterator[str]:
    """Fields the API server would silently drop (not in the structural schema): typos
    that JSON Schema alone accepts, since CRD schemas do not forbid extra properties."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if isinstance(value, dict) and (properties is not None or isinstance(extra, dict)):
        for key, item in value.items():
            if properties is not None and key in properties:
                yield from pruned_fields(item, properties[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                yield from pruned_fields(item, extra, f"{path}.{key}")
            else:
                yield f"{path}.{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from pruned_fields(item, schema["items"], f"{path}[{index}]")
