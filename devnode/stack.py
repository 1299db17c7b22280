"""`reminders stack`: the whole service on this machine, in the foreground.

Starts the local Cassandra node (reused if running), applies the schema, then runs the
API, the reference notifier (recording adapter) and one dispatcher as child processes
with REMINDERS_ENV=dev, their output interleaved and prefixed. Ctrl-C (or SIGTERM) stops
them all gracefully, the dispatcher first so it releases its claims and leases, then the
node if this stack started it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devnode.node import NodeError, NodeSettings, start
from devnode.node import status as node_status
from devnode.node import stop as stop_node
from dispatcher.settings import DispatcherSettings
from notifier.settings import NotifierSettings
from reminders_svc.api.client_cli import local_target
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import ConfigError


def notifier_target(env: Mapping[str, str]) -> str:
    """The notifier the dispatcher and the demo reach: REMINDERS_NOTIFIER_TARGET, else
    where the stack's notifier listens (REMINDERS_NOTIFIER_HOST and _PORT, as it reads
    them), so moving its port moves the stack's dispatcher along."""
    given = env.get("REMINDERS_NOTIFIER_TARGET")
    if given:
        return given
    return local_target(env, "REMINDERS_NOTIFIER_", NotifierSettings.host, NotifierSettings.port)


# Started in this order, stopped in reverse.
_SERVICES: tuple[tuple[str, Sequence[str]], ...] = (
    ("api", ("serve-api",)),
    ("notifier", ("notifier",)),
    ("dispatch", ("dispatch",)),
)


def _relay(name: str, stream: IO[bytes]) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"[{name}] {line.decode(errors='replace')}")
        sys.stdout.flush()


def child_env(environ: Mapping[str, str], node: NodeSettings) -> dict[str, str]:
    """The environment of the stack's processes (migrate and the services)."""
    return {
        "REMINDERS_ENV": "dev",
        # Nothing on a development machine needs shielding from a catch-up: a stack stopped
        # overnight reads its 16 hours of empty minutes (64 parts) in a minute or two, where
        # the default pace takes five.
        "REMINDERS_DISPATCH_CATCH_UP_MINUTES_PER_S": "2000",
        # The local node's data centre (SimpleSnitch's), named so the driver need not
        # guess it and warn that it did.
        "REMINDERS_CASSANDRA_LOCAL_DC": "datacenter1",
        **environ,
        "REMINDERS_NOTIFIER_TARGET": notifier_target(environ),
        **node.client_env(environ),
    }


def run_stack(settings: NodeSettings) -> int:
    try:
        env = child_env(os.environ, settings)
    except ConfigError as error:  # a malformed port of a service the stack dials
        print(f"reminders stack: {error}", file=sys.stderr)
        return 2
    # Until the services run, SIGTERM and a closed terminal (SIGHUP) interrupt the stack
    # as Ctrl-C does, so a node half started is stopped rather than left behind.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.default_int_handler)
    # Ctrl-C stops it all; a node that was already running (`reminders cassandra start`,
    # a test run) is someone else's and keeps running.
    ours = not node_status(settings).running
    try:
        pid, started = start(settings)
        print(f"cassandra {'started' if started else 'running'} (pid {pid})")
        return run_services(env)
    except NodeError as error:
        print(f"reminders stack: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # while the node started or the schema was applied
        return 130
    finally:
        if ours and node_status(settings).running:
            print("stopping cassandra")
            stop_node(settings)


def run_services(env: dict[str, str]) -> int:
    reminders = str(Path(sys.executable).with_name("reminders"))
    targets = health_targets(env)
    # Refused up front: the health checks would be answered by whatever holds the ports
    # (another stack; the services of one killed with SIGKILL, which outlive it), and
    # "stack up" would name a stack whose own services failed to listen.
    if targets is not None and (busy := listening(targets)):
        print(
            f"reminders stack: something already listens on {', '.join(busy)}: another"
            " `make run`, or the services of one that was killed? (`ss -ltnp` names it)",
            file=sys.stderr,
        )
        return 1
    if subprocess.run([reminders, "migrate"], env=env, check=False).returncode != 0:
        return 1
    stop = threading.Event()
    # A closed terminal (SIGHUP) stops the stack too: the children, in groups of their
    # own, would not hear it and would outlive it.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda *_: stop.set())
    print("starting the API, the notifier and a dispatcher (Ctrl-C stops them)")
    if targets is not None:
        api, notifier, _ = targets
        announce = threading.Thread(
            target=announce_when_serving,
            args=(targets, f"stack up: API {api}, notifier {notifier}; Ctrl-C stops it", stop),
            daemon=True,
        )
        announce.start()
    return supervise([(name, [reminders, *args]) for name, args in _SERVICES], env, stop)


def health_targets(env: Mapping[str, str]) -> tuple[str, str, str] | None:
    """Where the API, the notifier and the dispatcher answer gRPC health checks in plain
    text, as `env` sets them; None when one is TLS (or its settings are refused, which
    that service will say itself): no "stack up" line then."""
    try:
        api = ApiSettings.from_env(env)
        notifier = NotifierSettings.from_env(env)
        dispatcher = DispatcherSettings.from_env(env)
    except ConfigError:
        return None
    if api.tls is not None or notifier.tls is not None:
        return None
    return (
        f"{api.host}:{api.port}",
        f"{notifier.host}:{notifier.port}",
        f"{dispatcher.host}:{dispatcher.port}",
    )


def listening(targets: Sequence[str]) -> list[str]:
    """Those of `targets` (host:port) where something accepts connections."""
    found = []
    for target in targets:
        host, _, port = target.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
                found.append(target)
        except OSError:
            pass  # nothing there (or port 0: picked at start)
    return found


def announce_when_serving(targets: Sequence[str], message: str, stop: threading.Event) -> bool:
    """Print `message` once every target's gRPC health answers SERVING (a newcomer runs
    `reminders demo` on seeing it); False if `stop` came first."""
    for target in targets:
        with grpc.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while not _serving(health):
                if stop.wait(0.5):
                    return False
    print(message, flush=True)
    return True


def _serving(health: health_pb2_grpc.HealthStub) -> bool:
    try:
        answer = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
    except grpc.RpcError:
        return False  # not listening yet, or still starting
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def supervise(
    commands: Sequence[tuple[str, Sequence[str]]],
    env: Mapping[str, str],
    stop: threading.Event,
) -> int:
    """Run `commands` as children, their output prefixed with their names, until `stop` is
    set, Ctrl-C, or one ends on its own; then stop the rest, in reverse order.

    Returns 0 after a requested stop, else the exit code of the first child that ended on
    its own (128 + N if signal N killed it), so `make run` fails when a service crashed;
    130 when a second Ctrl-C cut the stop short (the children still stopping killed).
    """
    # Ctrl-C stops the stack even where SIGINT came ignored: a shell script starting it in
    # the background (`make run &`) passes it on so, and then nothing but SIGTERM stopped it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    relays: list[threading.Thread] = []  # one per child, in the same order
    code = 0
    try:
        for name, command in commands:
            # A process group of its own: Ctrl-C (SIGINT to the terminal's group) reaches
            # only the stack, which stops the children in order, the dispatcher first.
            child = subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
            assert child.stdout is not None
            relay = threading.Thread(target=_relay, args=(name, child.stdout), daemon=True)
            relay.start()
            relays.append(relay)
            children.append((name, child))
        while not stop.is_set():
            for name, child in children:
                if child.poll() is not None:
                    print(
                        f"reminders stack: {name} exited with {child.returncode}", file=sys.stderr
                    )
                    if code == 0:
                        code = 128 - child.returncode if child.returncode < 0 else child.returncode
                    stop.set()
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            _stop_in_reverse(children, relays)
        except KeyboardInterrupt:
            # A second Ctrl-C while they drain (up to 40 s each): no more waiting, but no
            # child left running either (they are in groups of their own: the terminal's
            # signal never reaches them, and they would hold their ports).
            for _, child in children:
                if child.poll() is None:
                    child.kill()
            for _, child in children:
                child.wait()
            print("reminders stack: killed the services still stopping", file=sys.stderr)
            code = code or 130
    return code


def _stop_in_reverse(
    children: Sequence[tuple[str, subprocess.Popen[bytes]]], relays: Sequence[threading.Thread]
) -> None:
    for (_, child), relay in reversed(list(zip(children, relays, strict=True))):
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=40)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        # Its last lines (a shutdown's, a crash's traceback) print before the next child is
        # stopped, and before the stack exits.
        relay.join(timeout=5)
