"""`reminders cassandra start | stop | status` as a developer and CI use it.

One test starts a second, private node (own home and ports) from the cached
distribution, so the shared node of the suite is never stopped.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from devnode import NodeSettings
from devnode.node import SLOW_START_TRACKER_FILES
from tests.platform.helpers import free_port, run_cli


def _node_env(home: Path, **extra: str) -> dict[str, str]:
    return {
        "REMINDERS_NODE_HOME": str(home),
        "REMINDERS_NODE_PORT": str(free_port()),
        "REMINDERS_NODE_STORAGE_PORT": str(free_port()),
        **extra,
    }


@pytest.mark.usefixtures("cassandra_settings")  # the shared node is up, so the jars are cached
def test_start_is_idempotent_and_status_and_stop_report_the_node(tmp_path: Path) -> None:
    env = _node_env(tmp_path / "node")
    try:
        first = run_cli("cassandra", "start", env=env)
        second = run_cli("cassandra", "start", env=env)
        status = run_cli("cassandra", "status", env=env)
    finally:
        stopped = run_cli("cassandra", "stop", env=env)

    assert first.returncode == 0, first.stderr
    assert " started: pid " in first.stdout
    pid = first.stdout.split("pid ")[1].split(",")[0]
    assert second.returncode == 0, second.stderr
    assert f"already running: pid {pid}," in second.stdout
    assert status.returncode == 0
    assert f"running pid={pid} cql_ready=True" in status.stdout
    assert stopped.stdout.strip() == "stopped"
    after = run_cli("cassandra", "status", env=env)
    assert after.returncode == 3
    assert "stopped" in after.stdout


def test_start_refuses_a_port_that_is_taken(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        env = _node_env(tmp_path / "node", REMINDERS_NODE_PORT=str(taken))
        result = run_cli("cassandra", "start", env=env)

    assert result.returncode == 1
    assert f"port {taken} (CQL) on 127.0.0.1 is taken by another process" in result.stderr


def test_start_explains_a_missing_java(tmp_path: Path) -> None:
    env = _node_env(tmp_path / "node", PATH=str(tmp_path / "empty-bin"), JAVA_HOME="")
    result = run_cli("cassandra", "start", env=env)

    assert result.returncode == 1
    assert "Java not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_start_explains_a_missing_maven_when_the_node_is_not_cached(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = shutil.which("java")
    assert java is not None, "this test needs the java the node runs on"
    (bin_dir / "java").symlink_to(java)
    env = _node_env(
        tmp_path / "node",
        PATH=str(bin_dir),
        JAVA_HOME="",
        REMINDERS_NODE_CACHE=str(tmp_path / "empty-cache"),
    )
    result = run_cli("cassandra", "start", env=env)

    assert result.returncode == 1
    assert "Maven (mvn) not found" in result.stderr


@pytest.mark.usefixtures("cassandra_settings")
def test_a_node_that_does_not_come_up_is_reported_with_its_log(tmp_path: Path) -> None:
    # A heap the JVM refuses makes the process exit at once.
    env = _node_env(tmp_path / "node", REMINDERS_NODE_HEAP="1k")
    result = run_cli("cassandra", "start", env=env)

    assert result.returncode == 1
    assert "did not come up" in result.stderr
    assert "stdout.log" in result.stderr
    assert "heap" in result.stderr.lower()
    assert not NodeSettings.from_env(env).pid_file.exists()


@pytest.mark.usefixtures("cassandra_settings")
def test_a_start_slowed_by_dropped_tables_says_so_and_reset_deletes_the_node(
    tmp_path: Path,
) -> None:
    # The heap the JVM refuses ends the start at once; the notice comes before it.
    env = _node_env(tmp_path / "node", REMINDERS_NODE_HEAP="1k")
    settings = NodeSettings.from_env(env)
    settings.paxos_tracker_dir.mkdir(parents=True)
    for index in range(SLOW_START_TRACKER_FILES + 1):
        (settings.paxos_tracker_dir / f"UNKNOWN-UNKNOWN-{index}.paxos").touch()

    started = run_cli("cassandra", "start", env=env)
    reset = run_cli("cassandra", "reset", env=env)
    again = run_cli("cassandra", "reset", env=env)

    assert started.returncode == 1
    assert f"Cassandra loads {SLOW_START_TRACKER_FILES + 1} Paxos tracker files" in started.stderr
    assert "`reminders cassandra reset` deletes it" in started.stderr
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.strip() == f"deleted {settings.home}"
    assert not settings.home.exists()
    assert again.stdout.strip() == f"nothing at {settings.home}"


def test_reset_refuses_a_home_that_holds_more_than_a_node(tmp_path: Path) -> None:
    """REMINDERS_NODE_HOME set to a wrong directory: reset deleted whatever was there."""
    home = tmp_path / "work"
    (home / "data").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")

    refused = run_cli("cassandra", "reset", env=_node_env(home), timeout=60)

    assert refused.returncode == 1
    assert refused.stderr == (
        f"reminders cassandra reset: {home} is not only a node's home (it holds notes.txt):"
        " nothing deleted; check REMINDERS_NODE_HOME\n"
    )
    assert (home / "notes.txt").read_text() == "mine"


def test_reset_deletes_what_a_crashed_jvm_left_in_the_home(tmp_path: Path) -> None:
    """A node that crashed or ran out of heap: its error log and heap dump are its own."""
    home = tmp_path / "node"
    (home / "data").mkdir(parents=True)
    (home / "hs_err_pid4242.log").write_text("fatal error")
    (home / "java_pid4242.hprof").write_bytes(b"\0")

    reset = run_cli("cassandra", "reset", env=_node_env(home), timeout=60)

    assert reset.returncode == 0, reset.stderr
    assert not home.exists()
