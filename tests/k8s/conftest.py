"""Session fixtures of the k8s tests: the overlays and k8s/monitoring built once, the
operators' CRDs, the Dockerfile's stages, and a fresh virtual environment installed as the
image installs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.k8s.dockerfile import Stage, stages
from tests.k8s.tools import (
    K8S,
    OVERLAYS,
    PROMETHEUS_OPERATOR,
    PROMETHEUS_OPERATOR_VERSION,
    REPO,
    Obj,
    build,
    build_overlay,
    kustomize,
    operator_module_dir,
)

DOCKERFILE = REPO / "Dockerfile"
# The deployables: the image (Dockerfile target) and the manifests' component label.
TARGETS = ("api", "dispatcher", "notifier", "migrate")


@pytest.fixture(scope="session")
def overlays() -> dict[str, list[Obj]]:
    binary = kustomize()
    return {overlay: build_overlay(binary, overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="session")
def monitoring() -> list[Obj]:
    return build(kustomize(), K8S / "monitoring")


@pytest.fixture(scope="session")
def operator_crds() -> Path:
    return operator_module_dir() / "config" / "crd" / "bases"


@pytest.fixture(scope="session")
def monitoring_crds() -> Path:
    module = operator_module_dir(PROMETHEUS_OPERATOR, PROMETHEUS_OPERATOR_VERSION)
    return module / "example" / "prometheus-operator-crd"


@pytest.fixture(scope="session")
def dockerfile_stages() -> dict[str, Stage]:
    return stages(DOCKERFILE)


_BUILD_PINNED = ("--build-constraint", "build-constraints.txt")


@pytest.fixture(scope="session")
def image_venv(
    tmp_path_factory: pytest.TempPathFactory, dockerfile_stages: dict[str, Stage]
) -> Path:
    """A new virtual environment with the package installed from a build context that
    holds only what the Dockerfile's build stage copies, as its RUN does (pip at its pin,
    then `pip install -c constraints.txt --build-constraint build-constraints.txt .`):
    a file the image would miss makes this install or the commands fail."""
    root = tmp_path_factory.mktemp("image")
    context = root / "src"
    for source in dockerfile_stages["build"].copy_sources():
        origin = REPO / source
        if origin.is_dir():
            shutil.copytree(origin, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            context.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, context / source)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "install", "--quiet", "-c", "constraints.txt", "--upgrade", "pip"],
        cwd=context,
        timeout=300,
        check=True,
    )
    result = subprocess.run(
        [*pip, "install", "--quiet", "-c", "constraints.txt", *_BUILD_PINNED, "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, f"the image's pip install failed:\n{result.stderr}"
    return venv
