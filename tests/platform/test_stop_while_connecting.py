"""A deployable asked to stop while its database hangs exits at once: it does not wait out
the driver's connect timeout (per contact point, per connection of its pools) past its
pod's termination grace. The database hangs in two ways: it accepts connections and never
answers (a node hung, a proxy in front of a dead one); or it answers the first one and
hangs on the pool's that follow (one node of several hung, a node dying as it is met)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from reminders_svc.config import CassandraSettings
from tests.api.serving import cassandra_env
from tests.platform.helpers import REMINDERS, free_port

CONNECT_TIMEOUT_S = 60


class HangingNode:
    """A port that accepts connections, reads what is sent and never answers; with
    `upstream`, its first connection is passed on to the node there instead."""

    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._upstream = upstream
        self.hanging = threading.Event()  # a connection is waiting for an answer
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._held.append(connection)
            if self._upstream is not None:
                upstream = socket.create_connection(self._upstream)
                self._held.append(upstream)
                for source, sink in ((connection, upstream), (upstream, connection)):
                    threading.Thread(target=_pump, args=(source, sink), daemon=True).start()
                self._upstream = None
            else:
                self.hanging.set()

    def close(self) -> None:
        self._listener.close()
        for connection in self._held:
            connection.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)


def _stop_while_hanging(command: str, node: HangingNode, cassandra: dict[str, str]) -> None:
    env = {
        **os.environ,
        "REMINDERS_ENV": "dev",
        **cassandra,
        "REMINDERS_CASSANDRA_CONTACT_POINTS": "127.0.0.1",
        "REMINDERS_CASSANDRA_PORT": str(node.port),
        "REMINDERS_CASSANDRA_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT_S),
        **{
            f"REMINDERS_{name}_{port}": str(free_port())
            for name in ("API", "DISPATCH", "NOTIFIER")
            for port in ("PORT", "METRICS_PORT")
        },
    }
    process = subprocess.Popen(
        [REMINDERS, command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert node.hanging.wait(60), f"{command} never met the hanging node"
        time.sleep(0.5)  # well into the driver's connect, waiting for the node's answer
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = process.wait(CONNECT_TIMEOUT_S)
        took_s = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        node.close()
    assert process.stdout is not None
    output = process.stdout.read()
    assert code == 0, output
    assert took_s < 10, f"{command} took {took_s:.1f} s to exit:\n{output}"
    assert "Traceback" not in output, output


@pytest.mark.parametrize("command", ["serve-api", "dispatch", "notifier"])
def test_sigterm_while_connecting_to_a_node_that_never_answers_exits_at_once(
    command: str,
) -> None:
    _stop_while_hanging(command, HangingNode(), {})


@pytest.mark.parametrize("command", ["serve-api", "dispatch"])
def test_sigterm_while_filling_a_pool_from_a_node_that_hangs_exits_at_once(
    command: str, migrated_settings: CassandraSettings
) -> None:
    node = HangingNode(upstream=(migrated_settings.contact_points[0], migrated_settings.port))
    _stop_while_hanging(command, node, cassandra_env(migrated_settings))
