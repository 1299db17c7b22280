"""The Dockerfile, checked without a Docker engine: pinned base, numeric non-root user,
one target per deployable whose command runs (`--help`) from a fresh install, and the
manifests run the very same commands as the same user."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.k8s.conftest import TARGETS
from tests.k8s.dockerfile import Stage
from tests.k8s.tools import REFERENCE_NOTIFIER_OVERLAYS, REPO, Obj
from tests.k8s.workloads import containers_by_image

# A full version tag: python:3.11.<patch>-slim-<debian release>, never `latest`/`3.11`.
PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm$")


def test_every_base_image_is_pinned(dockerfile_stages: dict[str, Stage]) -> None:
    external = {stage.name: stage.base for stage in dockerfile_stages.values() if not stage.parent}
    assert external, "no FROM"
    for name, base in external.items():
        assert PINNED_BASE.match(base), f"stage {name}: FROM {base} is not a full version tag"
    assert len(set(external.values())) == 1, f"one Python for build and run: {external}"


@pytest.mark.parametrize("target", TARGETS)
def test_target_runs_as_numeric_non_root_user(
    dockerfile_stages: dict[str, Stage], target: str
) -> None:
    user = dockerfile_stages[target].last("USER")
    assert user is not None, f"target {target} runs as root (no USER)"
    uid, _, gid = user.partition(":")
    for number in filter(None, (uid, gid)):
        assert number.isdigit(), f"target {target}: USER {user} is not numeric"
        assert int(number) != 0, f"target {target}: USER {user} is root"


def test_build_installs_the_package_with_pip(dockerfile_stages: dict[str, Stage]) -> None:
    runs = [arg for name, arg in dockerfile_stages["build"].instructions if name == "RUN"]
    # Pinned as make install pins it: the image runs the versions the tests ran.
    pinned = r"\bpip install -c constraints\.txt --build-constraint build-constraints\.txt \.(\s|$)"
    assert any(re.search(pinned, run) for run in runs), runs
    # pip itself at the pinned version first: older ones lack --build-constraint.
    assert any(re.search(r"\bpip install -c constraints\.txt --upgrade pip\b", run) for run in runs)


def test_copied_sources_exist_and_are_not_ignored(dockerfile_stages: dict[str, Stage]) -> None:
    ignored = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for source in dockerfile_stages["build"].copy_sources():
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        hits = [pattern for pattern in ignored if fnmatch.fnmatch(source, pattern)]
        assert not hits, f"COPY {source} is excluded by .dockerignore {hits}"


@pytest.mark.parametrize("target", TARGETS)
def test_entry_command_runs_from_a_fresh_install(
    dockerfile_stages: dict[str, Stage], image_venv: Path, target: str, tmp_path: Path
) -> None:
    command = dockerfile_stages[target].entry_command()
    assert command[:1] == ["reminders"], f"target {target}: {command}"
    bin_dir = image_venv / "bin"
    # Outside the checkout, so only the installed package can be imported.
    result = subprocess.run(
        [str(bin_dir / command[0]), *command[1:], "--help"],
        cwd=tmp_path,
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{command} --help:\n{result.stderr}"
    assert result.stdout.startswith(f"usage: {' '.join(command)}"), result.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_manifests_run_each_image_as_the_dockerfile_does(
    overlays: dict[str, list[Obj]], dockerfile_stages: dict[str, Stage], target: str
) -> None:
    stage = dockerfile_stages[target]
    uid, _, gid = (stage.last("USER") or "").partition(":")
    for overlay, objects in overlays.items():
        pods = containers_by_image(objects, f"reminders-{target}")
        if target == "notifier" and overlay not in REFERENCE_NOTIFIER_OVERLAYS:
            assert not pods, f"{overlay} runs the reference notifier"
            continue
        assert pods, f"{overlay}: no container runs the image reminders-{target}"
        for pod, container in pods:
            assert container["command"] == stage.entry_command(), f"{overlay} {target}"
            security = pod["securityContext"]
            assert str(security["runAsUser"]) == uid, f"{overlay} {target}: runAsUser"
            assert not gid or str(security["runAsGroup"]) == gid, f"{overlay} {target}"


@pytest.mark.parametrize("target", TARGETS)
def test_prod_pulls_each_image_from_a_registry(overlays: dict[str, list[Obj]], target: str) -> None:
    """A name without a registry means docker.io/library, where these images do not exist;
    dev clusters (kind, minikube) are loaded with the local builds instead."""
    found = containers_by_image(overlays["prod"], f"reminders-{target}")
    if target == "notifier":
        assert "prod" not in REFERENCE_NOTIFIER_OVERLAYS
        assert not found, "prod runs the reference notifier"
        return
    assert found, f"prod: no container runs the image reminders-{target}"
    for _, container in found:
        image = container["image"]
        registry, _, rest = image.partition("/")
        # Docker's rule: the first component is a registry if it has a dot or a port.
        assert rest, f"prod {target}: {image} names no registry"
        assert "." in registry or ":" in registry or registry == "localhost", image
        assert ":" in rest.rpartition("/")[2], f"prod {target}: {image} has no tag"
