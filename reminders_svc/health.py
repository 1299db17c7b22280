"""The gRPC health services every process of the project serves, and what each means.

- `""` (the server as a whole) and each RPC service's own name are **readiness**: SERVING
  only while the process can do its work (Cassandra answers; for a dispatcher, its clock
  is checked against the database's). Kubernetes' readinessProbe asks `""`.
- `LIVENESS_SERVICE` is the process itself: SERVING from its start until it stops, and
  answered by its event loop, so a wedged loop fails it. Kubernetes' livenessProbe asks
  it (`grpc: {port: ..., service: liveness}`): a process waiting out a database outage
  is not restarted, since a restart brings no database back, and a fleet left in
  CrashLoopBackOff would come back minutes after the database did.
"""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

LIVENESS_SERVICE = "liveness"


async def mark_alive(servicer: health.aio.HealthServicer) -> None:
    """Liveness SERVING; `enter_graceful_shutdown()` turns it off with the rest."""
    await servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
