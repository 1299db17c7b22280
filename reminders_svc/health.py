"""The gRPC health services every process of the project serves, and what each means.

- `""` (the server as a whole) and each RPC service's own name are **readiness**: SERVING
  only while the process can do its work (Cassandra answers, one failed probe between
  answers forgiven; for a dispatcher and an API server, their clock agrees with the
  database's). Kubernetes' readinessProbe asks `""`.
- `LIVENESS_SERVICE` is the process itself: SERVING from its start until it stops, and
  answered by its event loop, so a wedged loop fails it. Kubernetes' livenessProbe asks
  it (`grpc: {port: ..., service: liveness}`): a process waiting out a database outage
  is not restarted, since a restart brings no database back, and a fleet left in
  CrashLoopBackOff would come back minutes after the database did.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import grpc.aio
from cassandra.cluster import Session
from grpc_health.v1 import health, health_pb2
from prometheus_client import Gauge

from reminders_svc.storage.aio import execute

log = logging.getLogger(__name__)

LIVENESS_SERVICE = "liveness"
# The cheapest query that proves a coordinator answers.
PROBE_QUERY = "SELECT release_version FROM system.local"
# Storage probes failing in a row before readiness goes off: one alone is as often a slow
# or hung coordinator as an outage.
FAILED_PROBES_TO_NOT_READY = 2
# A storage probe's timeout is its interval, but never under this: the interval may be as
# short as 0.1 s, and a timeout that short fails probes on any busy node.
MIN_PROBE_TIMEOUT_S = 1.0

# A storage probe of a process's own (its timeout in seconds): raises when Cassandra does
# not answer; False when it answers but the process is not ready for another reason.
StorageProbe = Callable[[float], Awaitable[bool]]

_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class _HealthServicer(health.aio.HealthServicer):  # type: ignore[misc]  # grpc_health is untyped
    """grpcio's servicer, but every Watch stream ends once the process stops, after its
    last status went out. A client balancing with gRPC's client-side health checking keeps
    one stream open per connection, and an open stream held the server's stop for its whole
    grace: every rollout of a pod took its termination grace period. (Its own Watch never
    ends; it is replaced here rather than wrapped, so no write is cut in two.)"""

    def __init__(self) -> None:
        super().__init__()
        self._statuses: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self._ending = False

    async def set(self, service: str, status: int) -> None:
        await super().set(service, status)  # what Check answers
        async with self._changed:
            self._statuses[service] = status
            self._changed.notify_all()

    async def Watch(  # noqa: N802 - gRPC's method name
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> None:
        service = request.service
        sent: int | None = None
        while True:
            async with self._changed:
                await self._changed.wait_for(partial(self._has_news, service, sent))
                status, ending = self._status_of(service), self._ending
            if status != sent:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                sent = status
            if ending:
                return

    def _has_news(self, service: str, sent: int | None) -> bool:
        return self._ending or self._status_of(service) != sent

    def _status_of(self, service: str) -> int:
        return self._statuses.get(service, _UNKNOWN)

    async def end_watches(self) -> None:
        async with self._changed:
            self._ending = True
            self._changed.notify_all()


class ProcessHealth:
    """One process's health servicer: readiness of `services` (mirrored, 0/1, in
    `ready_gauge` when given) and liveness."""

    def __init__(self, services: Sequence[str], ready_gauge: Gauge | None = None) -> None:
        self.servicer = _HealthServicer()
        self._services = tuple(services)
        self._ready_gauge = ready_gauge
        self._stopping = False

    async def start(self) -> None:
        """Alive, not ready: call before the server listens."""
        await self.set_ready(False)
        await self.servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)

    async def set_ready(self, ready: bool, gauged: bool | None = None) -> None:
        """`gauged`: what the gauge shows, when not readiness itself (storage answering
        while readiness also waits on the clock)."""
        if self._ready_gauge is not None:
            self._ready_gauge.set(1 if (ready if gauged is None else gauged) else 0)
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready and not self._stopping
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self._set_services(status)

    async def _set_services(self, status: int) -> None:
        for service in self._services:
            await self.servicer.set(service, status)

    async def follow_storage(
        self, session: Session, interval_s: float, probe: StorageProbe | None = None
    ) -> None:
        """Probe Cassandra (with `probe`, when given, which may also say not ready) every
        `interval_s` until cancelled, each given `interval_s` (at least
        `MIN_PROBE_TIMEOUT_S`) to answer.

        Not ready once `FAILED_PROBES_TO_NOT_READY` probes in a row failed, ready again
        on the first that answers: one probe timing out on a hung coordinator (a query
        on `system.local` has no routing key, so it lands on any node) flipped a pod out
        of rotation, and clients watching its health dropped and re-added it. A probe
        that answers not ready (`probe` returning False: a clock off) is not ready at
        once, its cause being known. The gauge shows each probe's own answer."""
        timeout_s = max(interval_s, MIN_PROBE_TIMEOUT_S)
        failed_in_a_row = 0
        ready = False  # as start() left it
        while True:
            fine = True
            try:
                if probe is None:
                    await execute(session, PROBE_QUERY, timeout_s=timeout_s)
                else:
                    fine = await probe(timeout_s)
                answers = True
            except Exception as error:  # any driver error means "not answering"
                answers = False
                failed_in_a_row += 1
                log.warning(
                    "Cassandra health probe failed (%d in a row): %s",
                    failed_in_a_row,
                    type(error).__name__,
                )
            if answers:
                failed_in_a_row = 0
                ready = fine
            elif failed_in_a_row >= FAILED_PROBES_TO_NOT_READY:
                ready = False
            await self.set_ready(ready, gauged=answers)
            await asyncio.sleep(interval_s)

    async def shut_down(self) -> None:
        """Readiness NOT_SERVING for good, so load balancers drain the process; liveness
        stays SERVING while it stops (a dispatcher's drain may outlast the livenessProbe's
        failure budget, and a restart then would only cut the drain short)."""
        self._stopping = True
        # Not through set_ready: its gauge says whether storage (or the clock) is ready,
        # which a stop does not change; a dashboard would show storage down at every
        # rollout.
        await self._set_services(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.servicer.end_watches()
