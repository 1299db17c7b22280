"""A deployable asked to stop while its database accepts connections and never answers
(a node hung, a proxy in front of a dead one) exits at once: it does not wait out the
driver's connect timeout (per contact point) past its pod's termination grace."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from tests.platform.helpers import REMINDERS, free_port

CONNECT_TIMEOUT_S = 60


class SilentNode:
    """A port that accepts connections, reads what is sent and never answers."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.connected = threading.Event()
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._held.append(connection)
            self.connected.set()

    def close(self) -> None:
        self._listener.close()
        for connection in self._held:
            connection.close()


@pytest.mark.parametrize("command", ["serve-api", "dispatch", "notifier"])
def test_sigterm_while_connecting_to_a_silent_node_exits_at_once(command: str) -> None:
    node = SilentNode()
    env = {
        **os.environ,
        "REMINDERS_ENV": "dev",
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
        assert node.connected.wait(60), f"{command} never tried the node"
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
