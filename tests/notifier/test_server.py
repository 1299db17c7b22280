"""The notifier as a process: health, /metrics, the logging adapter's discretion, and
`python -m notifier` (what `reminders notifier` runs) migrating, serving and stopping on
SIGTERM."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dispatcher.handoff import NotifierClient, Outcome, Ring
from genproto.notification.v1 import notification_pb2 as pb
from genproto.notification.v1 import notification_pb2_grpc as pb_grpc
from notifier.rpc.server import NOTIFICATION_SERVICE
from notifier.settings import Faults, NotifierSettings
from reminders_svc.config import ConfigError
from tests.api.serving import cassandra_env
from tests.grpc_errors import error_info_of
from tests.notifier.conftest import ACCEPTED, Client, item, reminder_key, running_notifier
from tests.pins import REPO
from tests.platform.helpers import free_port
from tests.servers import UNDECODABLE_REQUEST, refusal_of_undecodable

SERVING = health_pb2.HealthCheckResponse.SERVING


def health_of(target: str, service: str = "") -> int:
    with grpc.insecure_channel(target) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        status: int = health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status
        return status


def wait_serving(target: str, process: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the notifier exited early:\n{process.communicate()[0]}")
        try:
            if health_of(target) == SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    raise AssertionError("the notifier did not become SERVING")


def test_health_and_metrics(notifier: Client, user: str) -> None:
    wait_serving(notifier.target)
    assert health_of(notifier.target, NOTIFICATION_SERVICE) == SERVING
    message = item(user)
    notifier.send_batch(message, message, item(user, key=""))
    notifier.wait_delivered(1, user)

    samples = notifier.metrics()

    def value(name: str, **labels: str) -> float:
        return samples[(name, frozenset(labels.items()))]

    assert value("notifier_items_total", outcome="accepted") >= 1
    assert value("notifier_items_total", outcome="duplicate") >= 1
    assert value("notifier_items_total", outcome="rejected") >= 1
    assert value("notifier_pushes_total", adapter="recording", result="ok") >= 1
    assert value("notifier_queue_depth", priority="urgent") == 0
    assert value("notifier_push_lateness_seconds_count", priority="urgent") >= 1
    assert value("notifier_storage_up") == 1
    assert not any(user in v for _, labels in samples for _, v in labels)
    # The process's own: memory, CPU, descriptors, the runtime.
    assert value("process_open_fds") > 0
    assert ("process_resident_memory_bytes", frozenset()) in samples


def test_every_count_is_exported_at_zero_before_its_first_event(notifier: Client) -> None:
    """rate() cannot see the first increment of a series born with it: the first item
    given up on after a restart was missing from its alert."""
    samples = notifier.metrics()

    for reason in ("no_device", "attempts_exhausted", "refused"):
        assert samples[("notifier_undeliverable_total", frozenset({("reason", reason)}))] == 0
    for result in ("ok", "retry", "device_gone", "refused"):
        labels = frozenset({("adapter", "recording"), ("result", result)})
        assert samples[("notifier_pushes_total", labels)] == 0


def test_bytes_that_are_not_a_request_are_an_invalid_argument(notifier: Client) -> None:
    for method in (f"/{NOTIFICATION_SERVICE}/SendBatch", "/grpc.health.v1.Health/Check"):
        name = method.rsplit("/", 1)[-1]
        assert refusal_of_undecodable(notifier.target, method) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request: not a valid {name} request",
        )
        # Named in the notifier's own error domain.
        raw: grpc.UnaryUnaryMultiCallable[bytes, bytes] = notifier.channel.unary_unary(method)
        info = error_info_of(lambda: raw(UNDECODABLE_REQUEST, timeout=10))  # noqa: B023
        assert (info.reason, info.domain) == ("INVALID_FIELD", "notification.v1")


def test_logging_adapter_logs_keys_and_sizes_never_texts(
    notifier_settings: NotifierSettings, user: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = dataclasses.replace(notifier_settings, adapter="logging")
    title, body, data = "SECRET-TITLE-7f3", "SECRET-BODY-91c", "SECRET-DATA-55e-значение"
    message = item(user, title=title, body=body)
    message.data["note"] = data
    # Counted as the size limit counts it (it logged the JSON, escapes and all: sizes past
    # the limit for items within it).
    data_size = sum(len(k.encode()) + len(v.encode()) for k, v in message.data.items())
    with caplog.at_level(logging.DEBUG), running_notifier(settings) as notifier:
        notifier.send_batch(message)
        deadline = time.monotonic() + 10
        while message.idempotency_key not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(grpc.RpcError) as refused:
            notifier.delivered(user)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert message.idempotency_key in caplog.text
    assert f"title_bytes={len(title)}" in caplog.text
    assert f"body_bytes={len(body)}" in caplog.text
    assert f"data_bytes={data_size}" in caplog.text
    for secret in (title, body, data):
        assert secret not in caplog.text


def test_process_migrates_serves_and_stops_on_sigterm(
    notifier_settings: NotifierSettings, user: str
) -> None:
    port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "REMINDERS_ENV": "dev",
        **cassandra_env(notifier_settings.cassandra),
        "REMINDERS_NOTIFIER_KEYSPACE": notifier_settings.cassandra.keyspace,
        "REMINDERS_NOTIFIER_PORT": str(port),
        "REMINDERS_NOTIFIER_METRICS_PORT": str(metrics_port),
        "REMINDERS_NOTIFIER_HEALTH_PROBE_INTERVAL_S": "0.5",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "notifier"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        target = f"127.0.0.1:{port}"
        wait_serving(target, process)
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.NotificationServiceStub(channel)
            reply = stub.SendBatch(pb.SendBatchRequest(notifications=[item(user)]), timeout=10)
            assert reply.results[0].outcome == ACCEPTED
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == 0, output
    # The fixture migrated it first.
    applied = sorted(path.stem for path in (REPO / "cql" / "notifier").glob("*.cql"))
    assert f"already applied {applied}" in output
    assert "stopped" in output


def test_faults_are_off_unless_named_and_unknown_ones_refused() -> None:
    assert Faults.parse("") == Faults()
    assert not Faults.parse(" ").any
    assert Faults.parse("drop_reply:2, crash_before_push, reject") == Faults(
        drop_reply=2, crash_before_push=True, reject=True
    )
    for text in ("crash_after_push", "crash_before_push:1", "drop_reply:x", "reject:2"):
        with pytest.raises(ConfigError):
            Faults.parse(text)


def test_a_dispatcher_spreads_its_hand_offs_over_every_notifier_its_target_names(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """One channel to a target naming several notifiers (a headless Service's DNS name
    does so in Kubernetes) must not send everything to the first one it reached."""
    with (
        running_notifier(notifier_settings) as first,
        running_notifier(notifier_settings) as second,
    ):
        target = f"ipv4:{first.target},{second.target}"
        now = datetime.now(UTC)
        rings = [
            Ring(reminder_key(), user, f"ring {n}", now, now + timedelta(minutes=5), now)
            for n in range(8)
        ]

        async def hand_off() -> list[Outcome]:
            client = NotifierClient(target)
            try:
                return [(await client.send([ring]))[ring.key].outcome for ring in rings]
            finally:
                await client.close()

        assert asyncio.run(hand_off()) == [Outcome.ACCEPTED] * len(rings)
        pushed = [first.delivered(user), second.delivered(user)]
        assert sum(map(len, pushed)) == len(rings)
        assert all(pushed), [len(p) for p in pushed]
