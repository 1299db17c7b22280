"""constraints.txt pins every package installed, so a fresh machine gets what CI ran: it
must agree with pyproject.toml's pins and be what this environment has installed.
build-constraints.txt pins the build backend pip fetches to build the project."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

from packaging.requirements import Requirement

from tests.pins import REPO


def _name(requirement: str) -> str:
    """PEP 503's normalized form of a distribution's name."""
    return re.sub(r"[-_.]+", "-", requirement).lower()


def _pins(lines: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lines:
        if (match := re.fullmatch(r"\s*([A-Za-z0-9._-]+)(\[[^\]]*\])?==(\S+)\s*", line)) is None:
            continue
        pins[_name(match.group(1))] = match.group(3)
    return pins


def _constraints(file: str = "constraints.txt") -> dict[str, str]:
    lines = (REPO / file).read_text().splitlines()
    entries = [line for line in lines if line.strip() and not line.startswith("#")]
    pins = _pins(entries)
    assert len(pins) == len(entries), f"{file}: only name==version lines and comments"
    return pins


def test_every_pin_of_pyproject_is_the_constraints_version() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    pins = _pins(declared)
    assert len(pins) == len(declared), "pyproject.toml: every dependency pinned with =="
    constraints = _constraints()
    differ = {
        name: (version, constraints.get(name))
        for name, version in pins.items()
        if constraints.get(name) != version
    }
    assert not differ, f"pyproject pin vs constraints.txt (run `make constraints`): {differ}"


def test_this_environment_has_the_constrained_versions() -> None:
    installed = {_name(dist.metadata["Name"]): dist.version for dist in metadata.distributions()}
    differ = {
        name: (version, installed.get(name))
        for name, version in _constraints().items()
        if installed.get(name) != version
    }
    assert not differ, f"constraints.txt vs installed (run `make install`): {differ}"


def test_the_build_backend_is_pinned_within_what_pyproject_requires() -> None:
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    pins = _constraints("build-constraints.txt")
    for requirement in map(Requirement, requires):
        pinned = pins.get(_name(requirement.name))
        assert pinned is not None, f"build-constraints.txt lacks {requirement.name}"
        assert requirement.specifier.contains(pinned), f"{requirement} vs pin {pinned}"
