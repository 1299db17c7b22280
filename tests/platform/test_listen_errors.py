"""A deployable whose port is taken says so in one line and exits 1: no traceback (gRPC
raises a bare RuntimeError when it cannot bind)."""

from __future__ import annotations

import socket

import pytest

from tests.platform.helpers import free_port, run_cli


@pytest.mark.parametrize(
    ("command", "port_variable"),
    [("serve-api", "REMINDERS_API_PORT"), ("dispatch", "REMINDERS_DISPATCH_PORT")],
)
def test_a_taken_grpc_port_is_one_line_and_exit_1(command: str, port_variable: str) -> None:
    with socket.socket() as taken:
        # As another gRPC server holds it (gRPC sets SO_REUSEPORT, so a second server that
        # also set it would share the port and start, unseen).
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli(
            command,
            env={
                "REMINDERS_ENV": "dev",
                port_variable: str(port),
                # Whatever the database, the port is bound first.
                "REMINDERS_API_METRICS_PORT": str(free_port()),
                "REMINDERS_DISPATCH_METRICS_PORT": str(free_port()),
            },
            timeout=60,
        )

    assert done.returncode == 1, done.stdout + done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
