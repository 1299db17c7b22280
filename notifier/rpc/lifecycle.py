"""Process plumbing any of the project's gRPC servers needs, nothing notifier-specific:
health that follows Cassandra, the /metrics endpoint, running until SIGTERM / SIGINT.

Written to move to a shared module (e.g. reminders_svc/runtime.py) that the API server
can use too; its own copies are in reminders_svc/api/server.py.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from cassandra.cluster import Session
from grpc_health.v1 import health, health_pb2
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from reminders_svc.api.server import PROBE_QUERY
from reminders_svc.concurrency import unless_stopped
from reminders_svc.storage.aio import execute

log = logging.getLogger(__name__)


class StorageHealth:
    """gRPC health of `services` (and a 0/1 gauge) following whether Cassandra answers."""

    def __init__(self, services: Sequence[str], storage_up: Gauge) -> None:
        self.servicer = health.aio.HealthServicer()
        self._services = tuple(services)
        self._storage_up = storage_up

    async def set(self, serving: bool) -> None:
        self._storage_up.set(1 if serving else 0)
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in self._services:
            await self.servicer.set(service, status)

    async def follow(self, session: Session, interval_s: float) -> None:
        """Probe every `interval_s` until cancelled."""
        while True:
            try:
                await execute(session, PROBE_QUERY, timeout_s=interval_s)
                answers = True
            except Exception as error:  # any driver error means "not answering"
                log.warning("Cassandra health probe failed: %s", type(error).__name__)
                answers = False
            await self.set(answers)
            await asyncio.sleep(interval_s)


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
