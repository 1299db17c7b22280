"""The proto contract: generated code is current, `buf lint` is clean, and the service
config given to clients agrees with it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from genproto.notification.v1 import notification_pb2
from genproto.reminders.v1 import reminders_pb2
from reminders_svc.connections import CONNECTION_AGE_GRACE_S, SERVER_OPTIONS
from tests.ci import unavailable
from tests.pins import makefile_pin

ROOT = Path(__file__).resolve().parents[2]
# gRPC's status codes, which the proto's list and the docs' table name beside the reasons.
CODES = {code.name for code in grpc.StatusCode}


def test_generated_code_matches_the_proto_files(tmp_path: Path) -> None:
    out = tmp_path / "genproto"
    subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(out)], check=True
    )
    committed = ROOT / "genproto"
    fresh = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    current = {
        p.relative_to(committed): p.read_bytes()
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    stale = sorted(
        str(path) for path in fresh.keys() | current.keys() if fresh.get(path) != current.get(path)
    )
    assert not stale, f"genproto/ is stale; run `make proto`: {stale}"


def test_buf_lint_is_clean() -> None:
    version = makefile_pin("BUF_VERSION")
    # Where `make buf` installs the pinned version (the path names it, so a new pin
    # installs anew), else one on PATH of the same version.
    pinned = ROOT / ".cache" / f"buf-{version}" / "node_modules" / ".bin" / "buf"
    buf = str(pinned) if pinned.exists() else shutil.which("buf")
    if buf is None:
        unavailable(f"buf {version} is not installed (`make buf` installs it from npm)")
    printed = subprocess.run([buf, "--version"], capture_output=True, text=True).stdout.strip()
    assert printed == version, f"{buf} says {printed!r}, the Makefile pins {version}"
    result = subprocess.run([buf, "lint"], cwd=ROOT / "proto", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("descriptor", [reminders_pb2.DESCRIPTOR, notification_pb2.DESCRIPTOR])
def test_go_and_java_stubs_each_have_a_package_of_their_own(descriptor: Any) -> None:
    """Without `go_package` protoc-gen-go refused the files ("unable to determine Go import
    path"), and Java nested every class in one outer class of the package `reminders.v1`.
    (This machine's protoc has no Java or Go generator to run: the options are checked.)"""
    options = descriptor.GetOptions()
    version_dir = descriptor.package.replace(".", "/")  # reminders/v1
    go_path, _, go_name = options.go_package.partition(";")
    assert go_path.endswith(f"/{version_dir}"), options
    assert go_name == descriptor.package.replace(".", ""), options  # remindersv1
    assert options.java_multiple_files, options
    assert options.java_package.endswith(descriptor.package), options


SERVICE_CONFIG = ROOT / "proto" / "reminders" / "v1" / "service_config.json"
# The RPCs reminders.proto calls safe to repeat (Create: with the same request_id).
SAFE_TO_REPEAT = {
    "GetReminder",
    "ListReminders",
    "PreviewSchedule",
    "ListDeliveries",
    "CreateReminder",
}


def service_config() -> dict[str, Any]:
    config: dict[str, Any] = json.loads(SERVICE_CONFIG.read_text())
    return config


def test_the_service_config_names_only_the_contract_s_services_and_methods() -> None:
    services = {
        service.full_name: {method.name for method in service.methods}
        for service in reminders_pb2.DESCRIPTOR.services_by_name.values()
    }
    for method_config in service_config()["methodConfig"]:
        for name in method_config["name"]:
            assert name["service"] in services, name
            if "method" in name:
                assert name["method"] in services[name["service"]], name


def test_the_service_config_retries_unavailable_on_exactly_the_rpcs_safe_to_repeat() -> None:
    """gRPC's retry policy cannot see an ErrorInfo: UNAVAILABLE retried on a change would
    repeat one that landed (a snooze by a duration, moving the ring twice)."""
    retried = {
        name.get("method")
        for method_config in service_config()["methodConfig"]
        if "retryPolicy" in method_config
        for name in method_config["name"]
    }
    assert retried == SAFE_TO_REPEAT
    for method_config in service_config()["methodConfig"]:
        if "retryPolicy" in method_config:
            assert method_config["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]


def test_a_closing_connection_lets_every_call_the_service_config_allows_finish() -> None:
    """Servers close each connection after a while, giving the calls on it a grace: at
    30 s it cut off a DeleteUserData the admin config gives 120 s (a purge of a user with
    thousands of reminders), answered UNAVAILABLE."""
    longest_s = max(
        float(method_config["timeout"].removesuffix("s"))
        for method_config in service_config()["methodConfig"]
    )
    grace_ms = dict(SERVER_OPTIONS)["grpc.max_connection_age_grace_ms"]
    assert grace_ms == CONNECTION_AGE_GRACE_S * 1000
    assert CONNECTION_AGE_GRACE_S > longest_s == 120


def test_every_reason_the_proto_lists_is_mapped_for_a_gateway_in_the_client_docs() -> None:
    """docs/clients.md tells a gateway what each reason means in HTTP: a reason the
    contract gained and the table missed reached a BFF as an unexplained 500."""
    proto = (ROOT / "proto/reminders/v1/reminders.proto").read_text()
    listed = proto.split("// Codes and reasons:", 1)[1].split("\n//\n", 1)[0]
    reasons = set(re.findall(r"\b[A-Z]+(?:_[A-Z]+)+\b", listed)) - CODES
    table = (ROOT / "docs/clients.md").read_text().split("## Errors, for a gateway", 1)[1]
    documented = set(re.findall(r"\b[A-Z]+(?:_[A-Z]+)+\b", table)) - CODES
    assert len(reasons) >= 15, reasons
    assert reasons <= documented, sorted(reasons - documented)
