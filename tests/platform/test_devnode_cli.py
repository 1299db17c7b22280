"""`reminders stack`, `reminders demo` and the node's settings, as a developer meets them:
a crashed service fails `make run`, a node moved off 9042 takes its clients along, and a
typo or a stack that is not running gets one line, not a traceback. No node needed."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer

from devnode import demo, node, stack
from dispatcher.settings import DispatcherSettings
from notifier.settings import NotifierSettings
from reminders_svc.api import client_cli
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import CassandraSettings, ConfigError
from tests.platform.helpers import REMINDERS, free_port, run_cli


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


SLEEPER = _python("import time; time.sleep(60)")


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("print('boom', flush=True); raise SystemExit(3)", 3),
        # Killed (the OOM killer's SIGKILL): the shell's 128 + N, not a negative status.
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + signal.SIGKILL),
    ],
)
def test_a_child_that_ends_on_its_own_fails_the_stack_with_its_code(
    code: str, expected: int, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    result = stack.supervise(
        [("api", SLEEPER), ("crash", _python(code)), ("dispatch", SLEEPER)],
        os.environ,
        threading.Event(),
    )

    assert result == expected
    assert time.monotonic() - began < 10  # the others were stopped, not waited for
    out, err = capsys.readouterr()
    assert "crash exited with" in err
    if expected == 3:
        assert "[crash] boom" in out


def test_a_requested_stop_exits_0_even_when_a_child_stops_with_an_error(tmp_path: Path) -> None:
    # A service may exit non-zero when told to stop; the stack asked, so it is no failure.
    ready = tmp_path / "ready"
    sigterm_exits_1 = _python(
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(60)"
    )
    stop = threading.Event()

    def stop_once_ready() -> None:  # not before its handler is in: else no exit 1 to forgive
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()

    threading.Thread(target=stop_once_ready, daemon=True).start()

    assert stack.supervise([("a", SLEEPER), ("b", sigterm_exits_1)], os.environ, stop) == 0
    assert ready.exists()


def _stack_of_two_once_ready(
    child: list[str], sigint: Any = signal.SIG_DFL
) -> subprocess.Popen[str]:
    """`supervise` of children a and b (each `child`, printing 'ready'), in a session of its
    own as a terminal's foreground group, once both said so; `sigint` is the disposition
    of SIGINT it inherits."""
    script = (
        "import os, sys, threading\n"
        "from devnode.stack import supervise\n"
        f"children = [('a', {child!r}), ('b', {child!r})]\n"
        "sys.exit(supervise(children, os.environ, threading.Event()))\n"
    )
    process = subprocess.Popen(
        _python(script),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
    )
    assert process.stdout is not None
    up = {process.stdout.readline().strip() for _ in range(2)}
    assert up == {"[a] ready", "[b] ready"}
    return process


@pytest.mark.parametrize("sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["", "inherited-ignored"])
def test_ctrl_c_stops_the_stack_and_its_children_with_0_the_last_started_first(
    sigint: Any,
) -> None:
    """Also where the stack inherits SIGINT ignored (a script's `make run &`): it ran on."""
    # As a terminal delivers Ctrl-C: SIGINT to its foreground process group. The children
    # do not hear it; the stack stops them with SIGTERM, in reverse order (the dispatcher
    # before the notifier and the API it hands off to).
    ready = _python(
        "import signal, sys, time\n"
        "def stop(*_):\n"
        "    print('stopping', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = _stack_of_two_once_ready(ready, sigint)
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=20)

    assert process.returncode == 0, err
    assert out.splitlines() == ["[b] stopping", "[a] stopping"]


def test_a_second_ctrl_c_kills_the_children_still_stopping_and_leaves_none(
    tmp_path: Path,
) -> None:
    """A stop can take minutes (each child up to 40 s): a second Ctrl-C must not leave
    children running, in process groups the terminal never signals, holding their ports."""
    pids = tmp_path / "pids"
    slow_to_stop = _python(
        "import os, signal, sys, time\n"
        f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "def stop(*_):\n"
        "    print('draining', flush=True)\n"
        "    time.sleep(30)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = _stack_of_two_once_ready(slow_to_stop)
    os.killpg(process.pid, signal.SIGINT)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "[b] draining"
    os.killpg(process.pid, signal.SIGINT)

    assert process.wait(timeout=20) == 130
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _client_env(environ: dict[str, str]) -> dict[str, str]:
    return node.NodeSettings.from_env(environ).client_env(environ)


def _child_port(environ: dict[str, str]) -> int:
    """The Cassandra port the stack's processes use under `environ`."""
    settings = node.NodeSettings.from_env(environ)
    return CassandraSettings.from_env(stack.child_env(environ, settings)).port


def test_a_node_moved_by_reminders_node_port_takes_the_stacks_processes_along() -> None:
    moved = {"REMINDERS_NODE_PORT": "9142"}

    assert _client_env(moved) == {"REMINDERS_CASSANDRA_PORT": "9142"}
    assert _child_port(moved) == 9142
    # Clients pointed elsewhere on purpose stay there; an empty variable is unset.
    chosen = {**moved, "REMINDERS_CASSANDRA_PORT": "9043"}
    assert _client_env(chosen) == {}
    assert _child_port(chosen) == 9043
    assert _client_env({**moved, "REMINDERS_CASSANDRA_PORT": ""}) == {
        "REMINDERS_CASSANDRA_PORT": "9142"
    }
    assert _client_env({}) == {}
    assert _child_port({}) == 9042


def _childs_notifier(environ: dict[str, str]) -> str:
    """The notifier the stack's dispatcher reaches under `environ`."""
    child = stack.child_env(environ, node.NodeSettings.from_env(environ))
    return DispatcherSettings.from_env(child).notifier_target


def test_a_notifier_moved_by_its_port_takes_the_stacks_dispatcher_and_the_demo_along() -> None:
    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    defaults = parser.parse_args(["demo"])
    assert _childs_notifier({}) == demo.targets(defaults, {})[1] == "127.0.0.1:50061"
    moved = {"REMINDERS_NOTIFIER_PORT": "6061"}
    assert _childs_notifier(moved) == demo.targets(defaults, moved)[1] == "127.0.0.1:6061"
    everywhere = {"REMINDERS_NOTIFIER_HOST": "::", "REMINDERS_NOTIFIER_PORT": "6061"}
    assert _childs_notifier(everywhere) == "[::1]:6061"
    # A target named on purpose stays; a malformed port is the stack's usage error.
    chosen = {**moved, "REMINDERS_NOTIFIER_TARGET": "notifier.internal:443"}
    assert _childs_notifier(chosen) == demo.targets(defaults, chosen)[1] == "notifier.internal:443"
    with pytest.raises(ConfigError, match="REMINDERS_NOTIFIER_PORT"):
        _childs_notifier({"REMINDERS_NOTIFIER_PORT": "http"})


def test_cassandra_env_prints_what_the_makefile_hands_the_nodes_clients() -> None:
    moved = run_cli(
        "cassandra",
        "env",
        env={"REMINDERS_NODE_PORT": "9142", "REMINDERS_CASSANDRA_PORT": ""},
        timeout=30,
    )
    unmoved = run_cli(
        "cassandra", "env", env={"REMINDERS_NODE_PORT": "", "REMINDERS_CASSANDRA_PORT": ""}
    )

    assert (moved.returncode, moved.stdout, moved.stderr) == (
        0,
        "REMINDERS_CASSANDRA_PORT=9142\n",
        "",
    )
    assert (unmoved.returncode, unmoved.stdout) == (0, "")


@pytest.mark.parametrize("action", ["status", "env"])
@pytest.mark.parametrize(
    ("value", "why"), [("abc", "expected an integer"), ("0", "expected 1 to 65535")]
)
def test_a_malformed_node_port_is_one_line_naming_the_variable(
    action: str, value: str, why: str
) -> None:
    result = run_cli("cassandra", action, env={"REMINDERS_NODE_PORT": value}, timeout=30)

    assert result.returncode == 2
    assert result.stderr == f"reminders cassandra {action}: REMINDERS_NODE_PORT={value!r}: {why}\n"


def test_clients_with_no_configuration_reach_the_servers_make_run_starts() -> None:
    """The client CLI, the demo and the dispatcher, given no address, call where an API
    server and a notifier with no configuration listen (what `make run` starts)."""
    api = ApiSettings.from_env({"REMINDERS_ENV": "dev"})
    notifier = NotifierSettings.from_env({"REMINDERS_ENV": "dev"})
    dispatcher = DispatcherSettings.from_env({"REMINDERS_ENV": "dev"})
    assert client_cli.DEFAULT_TARGET == f"{api.host}:{api.port}" == "127.0.0.1:50051"
    assert dispatcher.notifier_target == f"{notifier.host}:{notifier.port}"
    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    defaults = parser.parse_args(["demo"])
    assert demo.targets(defaults, {}) == (client_cli.DEFAULT_TARGET, dispatcher.notifier_target)
    # Moved ports, named as the client commands and the dispatcher read them:
    moved = {"REMINDERS_API_TARGET": "127.0.0.1:1", "REMINDERS_NOTIFIER_TARGET": "127.0.0.1:2"}
    assert demo.targets(defaults, moved) == ("127.0.0.1:1", "127.0.0.1:2")
    given = parser.parse_args(["demo", "--api", "h:3", "--notifier", "h:4"])
    assert demo.targets(given, moved) == ("h:3", "h:4")
    # An API that `make run` was told to serve elsewhere:
    assert demo.targets(defaults, {"REMINDERS_API_PORT": "6051"})[0] == "127.0.0.1:6051"


@pytest.mark.parametrize("argv", [("--in", "nan"), ("--in", "1e12"), ("--timeout", "-5")])
def test_the_demo_refuses_seconds_that_mean_nothing(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error, not a traceback (nan, 1e12) nor a run that fails at once (-5)."""
    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    with pytest.raises(SystemExit) as usage:
        parser.parse_args(["demo", *argv])
    assert usage.value.code == 2
    assert f"argument {argv[0]}: expected a number of seconds" in capsys.readouterr().err


def test_the_stack_says_it_is_up_only_once_its_services_serve(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A newcomer runs `reminders demo` when `make run` says "stack up": it must not say
    so while a service is still starting (the demo then fails, saying to start the stack)."""
    health = HealthServicer()
    health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    serving = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    not_yet_listening = f"127.0.0.1:{free_port()}"
    server.start()
    try:
        stop = threading.Event()
        announced: list[bool] = []
        announce = threading.Thread(
            target=lambda: announced.append(
                stack.announce_when_serving((serving, not_yet_listening), "up", stop)
            )
        )
        announce.start()
        time.sleep(1.5)
        health.set("", health_pb2.HealthCheckResponse.SERVING)
        time.sleep(1.5)  # past its look at the first service, on to the second
        assert capsys.readouterr().out == ""
        stop.set()
        announce.join(timeout=10)
        assert announced == [False]

        announced.clear()
        assert stack.announce_when_serving((serving,), "up", threading.Event())
        assert capsys.readouterr().out == "up\n"
    finally:
        server.stop(None)


def test_the_stack_refuses_to_start_where_something_holds_its_ports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A second `make run`, or the services a killed one left running: their health checks
    answered for this stack, which said "stack up" as its own API failed to listen."""
    with socket.create_server(("127.0.0.1", 0)) as held:
        api_port = held.getsockname()[1]
        env = {
            "REMINDERS_ENV": "dev",
            "REMINDERS_API_PORT": str(api_port),
            "REMINDERS_NOTIFIER_PORT": str(free_port()),
            "REMINDERS_DISPATCH_PORT": str(free_port()),
            # Never reached: refused before the schema is applied.
            "REMINDERS_CASSANDRA_PORT": str(free_port()),
        }
        assert stack.run_services(env) == 1
    said = capsys.readouterr()
    assert f"something already listens on 127.0.0.1:{api_port}: another `make run`" in said.err
    assert "stack up" not in said.out


def test_the_stack_waits_for_its_services_where_the_environment_moved_them() -> None:
    dev = {"REMINDERS_ENV": "dev"}
    assert stack.health_targets(dev) == ("127.0.0.1:50051", "127.0.0.1:50061", "127.0.0.1:50071")
    moved = {**dev, "REMINDERS_API_PORT": "6051", "REMINDERS_DISPATCH_PORT": "6071"}
    assert stack.health_targets(moved) == (
        "127.0.0.1:6051",
        "127.0.0.1:50061",
        "127.0.0.1:6071",
    )


def test_demo_without_a_running_stack_says_so_in_one_line() -> None:
    api, notifier = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    began = time.monotonic()
    result = run_cli("demo", "--api", api, "--notifier", notifier, timeout=30)

    assert result.returncode == 1
    assert result.stderr == (
        f"reminders demo: the notifier at {notifier} did not answer (UNAVAILABLE); "
        "start the stack with `make run`\n"
    )
    assert result.stdout == ""
    assert time.monotonic() - began < 15


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.5, "12:00:02"), (0.0001, "12:00:01"), (0.4, "12:00:01"), (20.25, "12:00:21")],
)
def test_the_demos_due_is_rounded_up_to_a_whole_second(seconds: float, expected: str) -> None:
    """Rounded down, `--in 0.5` was refused half the time: "... is in the past"."""
    now = datetime(2026, 12, 6, 12, 0, 0, 600_000, tzinfo=UTC)
    due = demo.due_in(seconds, now)
    assert due >= now + timedelta(seconds=seconds)
    assert due.strftime("%H:%M:%S.%f") == f"{expected}.000000"


@pytest.mark.parametrize(
    ("signum", "exit_code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_to_a_command_waiting_for_its_answer_is_one_line_and_its_exit_code(
    signum: signal.Signals, exit_code: int, said: str
) -> None:
    """A call to an address that takes the connection and never answers, interrupted:
    it printed a traceback. SIGTERM had no handler, so a command run as a container's
    PID 1 (an admin Job) ignored it until SIGKILL."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        env = {**os.environ, "REMINDERS_ENV": "dev"}
        with subprocess.Popen(
            [REMINDERS, "get", "--user", "alice", str(uuid.uuid4()), "--target", target],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as waiting:
            connection, _ = silent.accept()  # it is waiting for an answer now
            with connection:
                time.sleep(0.5)
                waiting.send_signal(signum)
                out, err = waiting.communicate(timeout=30)

    assert (waiting.returncode, out, err) == (exit_code, "", f"reminders get: {said}\n")


def test_a_pid_file_left_by_a_node_long_gone_names_no_other_process(tmp_path: Path) -> None:
    """A pid file outlives its node (the machine or session ended) and pids are reused:
    a process that took the number is neither waited for as the node nor signalled."""
    home = tmp_path / "node"
    home.mkdir()
    other = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        (home / "cassandra.pid").write_text(str(other.pid))
        env = {"REMINDERS_NODE_HOME": str(home)}

        assert run_cli("cassandra", "stop", env=env, timeout=30).stdout == "not running\n"
        assert other.poll() is None  # not signalled
        assert not (home / "cassandra.pid").exists()
    finally:
        other.kill()
        other.wait()


# How the stack ends: its services stopped by Ctrl-C (0), one crashed (3), or Ctrl-C while
# the schema was applied or while the node was starting (130).
ENDINGS = {"stopped": 0, "crashed": 3, "interrupted": 130, "interrupted starting": 130}


@pytest.mark.parametrize("running_before", [False, True])
@pytest.mark.parametrize("ending", ENDINGS)
def test_the_stack_stops_the_node_it_started_and_only_that_one(
    monkeypatch: pytest.MonkeyPatch, running_before: bool, ending: str
) -> None:
    """`make run` on a fresh machine starts the node, and Ctrl-C stops it all, also before
    the services are up; a node that was already running (one `make test` or
    `reminders cassandra start` left) keeps running."""
    running = [running_before]
    stopped: list[node.NodeSettings] = []

    def stop_node(settings: node.NodeSettings) -> bool:
        stopped.append(settings)
        running[0] = False
        return True

    def start(settings: node.NodeSettings) -> tuple[int, bool]:
        started = not running[0]
        running[0] = True  # its pid file is written before it is ready
        if ending == "interrupted starting":
            raise KeyboardInterrupt
        return 4242, started

    def run_services(env: dict[str, str]) -> int:
        if ending == "interrupted":
            raise KeyboardInterrupt
        return ENDINGS[ending]

    monkeypatch.setattr(stack, "node_status", lambda settings: _status(running[0]))
    monkeypatch.setattr(stack, "start", start)
    monkeypatch.setattr(stack, "stop_node", stop_node)
    monkeypatch.setattr(stack, "run_services", run_services)
    settings = node.NodeSettings.from_env({})
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = stack.run_stack(settings)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)

    assert code == ENDINGS[ending]
    assert stopped == ([] if running_before else [settings])


def _status(running: bool) -> node.NodeStatus:
    return node.NodeStatus(
        running=running,
        pid=4242 if running else None,
        cql_ready=running,
        rss_bytes=None,
        version=node.CASSANDRA_VERSION,
    )
