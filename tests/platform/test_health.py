"""What the health services answer across a process's life (reminders_svc/health.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import cast

from cassandra.cluster import Session
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


def _readiness_seen_by_probes(
    answers: list[bool | None], interval_s: float
) -> tuple[list[int], list[float | None], list[float]]:
    """Run `follow_storage` on a probe answering `answers` in turn (None: it raises, as
    a probe timing out does). Returns the readiness and the gauge each probe found (what
    start() and the probes before it left: one more than `answers`), then the timeouts the
    probes were given."""
    registry = CollectorRegistry()
    storage_up = Gauge("storage_up", "storage answers", registry=registry)
    health = ProcessHealth(("",), storage_up)
    readiness: list[int] = []
    gauge: list[float | None] = []
    timeouts: list[float] = []
    done = asyncio.Event()

    async def probe(timeout_s: float) -> bool:
        readiness.append(
            (await health.servicer.Check(health_pb2.HealthCheckRequest(), None)).status
        )
        gauge.append(registry.get_sample_value("storage_up"))
        timeouts.append(timeout_s)
        if len(timeouts) > len(answers):
            done.set()
            await asyncio.Event().wait()  # until cancelled
        answer = answers[len(timeouts) - 1]
        if answer is None:
            raise TimeoutError("the coordinator did not answer in time")
        return answer

    async def scenario() -> None:
        await health.start()
        following = asyncio.create_task(
            health.follow_storage(cast(Session, None), interval_s, probe)  # probe: no session
        )
        await done.wait()
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following

    asyncio.run(scenario())
    return readiness, gauge, timeouts


def test_one_failed_storage_probe_between_answers_leaves_readiness_on() -> None:
    """A storage probe timing out on one hung coordinator among many (a probe has no
    routing key) flipped the pod out of rotation for a probe interval, again and again;
    only the gauge shows each probe's failure."""
    readiness, gauge, _ = _readiness_seen_by_probes([True, None, True, None, True], 0.01)

    assert readiness == [NOT_SERVING] + [SERVING] * 5
    assert gauge == [0, 1, 0, 1, 0, 1]


def test_storage_failing_two_probes_in_a_row_turns_readiness_off_until_one_answers() -> None:
    readiness, gauge, _ = _readiness_seen_by_probes([True, None, None, None, True], 0.01)

    assert readiness == [NOT_SERVING, SERVING, SERVING, NOT_SERVING, NOT_SERVING, SERVING]
    assert gauge == [0, 1, 0, 0, 0, 1]


def test_a_storage_probe_answering_not_ready_turns_readiness_off_at_once() -> None:
    """Not a probe that failed: one that answered, and says why not (a clock off)."""
    readiness, gauge, _ = _readiness_seen_by_probes([True, False, True], 0.01)

    assert readiness == [NOT_SERVING, SERVING, NOT_SERVING, SERVING]
    assert gauge == [0, 1, 1, 1]


def test_a_storage_probe_is_given_its_interval_but_never_under_a_second() -> None:
    """The interval may be as short as 0.1 s: as a timeout, that failed probes on any
    busy node."""
    *_, short = _readiness_seen_by_probes([True], 0.1)
    *_, long = _readiness_seen_by_probes([True], 1.25)

    assert set(short) == {1.0}
    assert set(long) == {1.25}


def test_a_failed_first_storage_probe_leaves_readiness_off() -> None:
    """The failure forgiven is one between answers: a process yet to hear storage answer
    is not ready."""
    readiness, _, _ = _readiness_seen_by_probes([None, True], 0.01)

    assert readiness == [NOT_SERVING, NOT_SERVING, SERVING]
