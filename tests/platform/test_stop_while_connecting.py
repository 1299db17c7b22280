"""A deployable asked to stop while its database hangs exits at once: it does not wait out
the driver's connect timeout (per contact point, per connection of its pools) past its
pod's termination grace. The database hangs in two ways: it accepts connections and never
answers (a node hung, a proxy in front of a dead one); or it answers the first one and
hangs on the pool's that follow (one node of several hung, a node dying as it is met)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from reminders_svc.config import CassandraSettings
from tests.api.serving import cassandra_env
from tests.platform.helpers import REMINDERS, free_port
from tests.tcp_proxy import TcpProxy

CONNECT_TIMEOUT_S = 60


def _stop_while_hanging(command: str, node: TcpProxy, cassandra: CassandraSettings) -> None:
    env = {
        **os.environ,
        "REMINDERS_ENV": "dev",
        **cassandra_env(cassandra),
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


def _hanging_after(connections: int, cassandra: CassandraSettings) -> TcpProxy:
    """The node, answering only its first `connections` connections."""
    node = TcpProxy(cassandra.contact_points[0], cassandra.port)
    node.answer_only_first(connections)
    return node


@pytest.mark.parametrize("command", ["serve-api", "dispatch", "notifier"])
def test_sigterm_while_connecting_to_a_node_that_never_answers_exits_at_once(
    command: str, migrated_settings: CassandraSettings
) -> None:
    _stop_while_hanging(command, _hanging_after(0, migrated_settings), migrated_settings)


@pytest.mark.parametrize("command", ["serve-api", "dispatch"])
def test_sigterm_while_filling_a_pool_from_a_node_that_hangs_exits_at_once(
    command: str, migrated_settings: CassandraSettings
) -> None:
    _stop_while_hanging(command, _hanging_after(1, migrated_settings), migrated_settings)
