"""Process plumbing every long-running process of the project shares: the /metrics
endpoint and running a server until SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import signal
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from reminders_svc.concurrency import unless_stopped


class MetricsEndpoint:
    """Prometheus /metrics of one registry on its own port (0: any free port)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._http: WSGIServer
        self._http, _ = start_http_server(port, addr=host, registry=registry)
        self.port: int = self._http.server_address[1]

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


class Stoppable(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def run_until_signal(server: Stoppable) -> None:
    """Start `server`, run until SIGTERM or SIGINT, then stop it (gracefully)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    try:
        # A start still waiting for the database is given up on a signal, not waited out.
        await unless_stopped(server.start(), stopping)
        await stopping.wait()
    finally:
        await server.stop()
