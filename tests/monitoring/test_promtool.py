"""promtool on the rules: `check rules` (the Prometheus parser's own word on every
expression) and `test rules` (tests/monitoring/rules_test.yaml: synthetic series, and the
alerts that must or must not fire on them).

promtool is looked up as $PROMTOOL, as the build of the Makefile's pinned version in the
checkout's cache (.cache/go/promtool-<version>/promtool), or on PATH. Without it the tests
are skipped on a workstation, and fail in CI (CI=true), where it must have been installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ci import unavailable
from tests.monitoring.files import ROOT, rule_document
from tests.pins import makefile_pin

UNIT_TESTS = Path(__file__).with_name("rules_test.yaml")


@pytest.fixture
def promtool() -> str:
    """$PROMTOOL, else the build of the Makefile's pinned version, else one on PATH: not
    whichever older build the cache still holds."""
    pinned = ROOT / ".cache" / "go" / f"promtool-{makefile_pin('PROMTOOL_VERSION')}" / "promtool"
    found = os.environ.get("PROMTOOL") or (str(pinned) if pinned.is_file() else None)
    found = found or shutil.which("promtool")
    if not found:
        unavailable("promtool is not installed (`make promtool`, PROMTOOL, or on PATH)")
    return found


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    """The PrometheusRule's spec, as the plain rules file Prometheus reads."""
    path = tmp_path / "reminders.rules.yaml"
    path.write_text(yaml.safe_dump(rule_document()["spec"], sort_keys=False))
    return path


def _run(promtool: str, *args: str) -> None:
    done = subprocess.run([promtool, *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_accepts_the_rules(promtool: str, rules_file: Path) -> None:
    _run(promtool, "check", "rules", "--lint=all", "--lint-fatal", str(rules_file))


def test_alerts_fire_on_synthetic_series(promtool: str, rules_file: Path) -> None:
    cases = yaml.safe_load(UNIT_TESTS.read_text())
    cases["rule_files"] = [str(rules_file)]
    unit_tests = rules_file.with_name("rules_test.yaml")
    unit_tests.write_text(yaml.safe_dump(cases, sort_keys=False))
    _run(promtool, "test", "rules", str(unit_tests))
