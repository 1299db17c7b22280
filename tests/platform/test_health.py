"""What the health services answer across a process's life (reminders_svc/health.py)."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry, Gauge

from reminders_svc.health import LIVENESS_SERVICE, ProcessHealth

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_a_stop_turns_readiness_off_for_good_and_leaves_liveness_and_the_gauge() -> None:
    """A draining dispatcher (up to ~66 s) must not be restarted by its livenessProbe, nor
    shown on the dashboard as having lost its storage or clock."""
    registry = CollectorRegistry()
    ready = Gauge("ready", "storage answers", registry=registry)

    async def answers(health: ProcessHealth) -> dict[str, int]:
        return {
            service: (
                await health.servicer.Check(
                    health_pb2.HealthCheckRequest(service=service),
                    None,  # a known service never touches the context
                )
            ).status
            for service in ("", "reminders.v1.RemindersService", LIVENESS_SERVICE)
        }

    async def scenario() -> list[dict[str, int]]:
        health = ProcessHealth(("", "reminders.v1.RemindersService"), ready)
        await health.start()
        await health.set_ready(True)
        seen = [await answers(health)]
        await health.shut_down()
        seen.append(await answers(health))
        await health.set_ready(True)  # a storage probe landing after the stop began
        seen.append(await answers(health))
        return seen

    serving, stopping, probed = asyncio.run(scenario())

    assert serving == {"": SERVING, "reminders.v1.RemindersService": SERVING, "liveness": SERVING}
    assert stopping == probed
    assert stopping == {
        "": NOT_SERVING,
        "reminders.v1.RemindersService": NOT_SERVING,
        "liveness": SERVING,
    }
    assert registry.get_sample_value("ready") == 1
