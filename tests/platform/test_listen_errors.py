"""A deployable whose port is taken says so in one line, naming the address, and exits 1:
no traceback (gRPC raises a bare RuntimeError when it cannot bind; the /metrics server an
errno without the address)."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import grpc
import grpc.aio
import pytest
from prometheus_client import CollectorRegistry

from reminders_svc.runtime import MetricsEndpoint
from reminders_svc.tls import add_port
from tests.platform.helpers import free_port, run_cli

# Every port a test here does not take: free ones.
PORT_VARIABLES = (
    "REMINDERS_API_PORT",
    "REMINDERS_API_METRICS_PORT",
    "REMINDERS_DISPATCH_PORT",
    "REMINDERS_DISPATCH_METRICS_PORT",
    "REMINDERS_NOTIFIER_PORT",
    "REMINDERS_NOTIFIER_METRICS_PORT",
)


@pytest.mark.parametrize(
    ("command", "taken_variable", "complaint"),
    [
        ("serve-api", "REMINDERS_API_PORT", "cannot listen on"),
        ("dispatch", "REMINDERS_DISPATCH_PORT", "cannot listen on"),
        ("serve-api", "REMINDERS_API_METRICS_PORT", "cannot serve /metrics on"),
        ("dispatch", "REMINDERS_DISPATCH_METRICS_PORT", "cannot serve /metrics on"),
        ("notifier", "REMINDERS_NOTIFIER_METRICS_PORT", "cannot serve /metrics on"),
    ],
)
def test_a_taken_port_is_one_line_naming_it_and_exit_1(
    command: str, taken_variable: str, complaint: str
) -> None:
    with socket.socket() as taken:
        # As another gRPC server holds it (gRPC sets SO_REUSEPORT, so a second server that
        # also set it would share the port and start, unseen).
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Whatever the database, the ports are bound first.
        ports = {variable: str(free_port()) for variable in PORT_VARIABLES}
        done = run_cli(
            command,
            env={"REMINDERS_ENV": "dev", **ports, taken_variable: str(port)},
            timeout=60,
        )

    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{complaint} 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_an_ipv6_host_is_listened_on_by_grpc_and_by_metrics(host: str) -> None:
    """Unbracketed, gRPC read `::1:0` as the address ::0.1.0.0 on its default port (and
    blamed a taken port); bracketed, the /metrics server found no such name: no spelling
    of an IPv6 host started a deployable."""

    async def grpc_answers() -> bool:
        server = grpc.aio.server()
        port = add_port(server, host, 0, None)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"[::1]:{port}") as channel:
                await asyncio.wait_for(channel.channel_ready(), 10)
                return True
        finally:
            await server.stop(0)

    assert asyncio.run(grpc_answers())
    metrics = MetricsEndpoint(CollectorRegistry(), host, 0)
    try:
        with urllib.request.urlopen(f"http://[::1]:{metrics.port}/metrics", timeout=10) as page:
            assert page.status == 200
    finally:
        metrics.close()
