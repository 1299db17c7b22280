"""A real notifier (grpc.aio on its own event loop and thread) on the real Cassandra, in a
keyspace of its own per test session, and a sync client for the tests."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from genproto.notification.v1 import notification_pb2 as pb
from genproto.notification.v1 import notification_pb2_grpc as pb_grpc
from notifier.delivery.adapters import RecordingPushAdapter
from notifier.domain.push import PushAdapter, PushMessage, PushResult
from notifier.rpc.client import list_delivered
from notifier.rpc.server import NotifierServer
from notifier.settings import NotifierSettings
from notifier.storage.schema import migrate_notifier
from reminders_svc.config import CassandraSettings
from reminders_svc.storage.session import connect
from tests.servers import ServerThread

DEV_ENV = {"REMINDERS_ENV": "dev"}
# A SendResult's outcomes, as the tests compare them.
ACCEPTED = pb.SendResult.OUTCOME_ACCEPTED
DUPLICATE = pb.SendResult.OUTCOME_DUPLICATE
REJECTED = pb.SendResult.OUTCOME_REJECTED
RETRYABLE = pb.SendResult.OUTCOME_RETRYABLE
# Metric samples by name and labels.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Client:
    target: str
    metrics_port: int
    channel: grpc.Channel
    stub: pb_grpc.NotificationServiceStub
    server: NotifierServer
    loop: asyncio.AbstractEventLoop

    def tasks(self) -> int:
        """Tasks alive on the notifier's event loop."""

        async def count() -> int:
            return len(asyncio.all_tasks())

        return asyncio.run_coroutine_threadsafe(count(), self.loop).result(10)

    def send_batch(self, *items: pb.Notification, timeout_s: float = 30) -> list[pb.SendResult]:
        """Answered once every item's delivery ended (pushed, or given up on)."""
        reply = self.stub.SendBatch(pb.SendBatchRequest(notifications=items), timeout=timeout_s)
        return list(reply.results)

    def queued(self) -> float:
        """Items waiting for a push worker, of both priorities."""
        metrics = self.metrics()
        return sum(
            metrics[("notifier_queue_depth", frozenset({("priority", p)}))]
            for p in ("urgent", "bulk")
        )

    def wait_queued(self, count: float, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while self.queued() < count:
            assert time.monotonic() < deadline, f"fewer than {count} items ever queued"
            time.sleep(0.02)

    def delivered(self, user_id: str = "", key: str = "") -> list[pb.Delivered]:
        return list_delivered(self.stub, user_id, key)

    def wait_delivered(self, count: int, user_id: str, timeout_s: float = 10) -> list[pb.Delivered]:
        deadline = time.monotonic() + timeout_s
        while True:
            pushed = self.delivered(user_id)
            if len(pushed) >= count or time.monotonic() > deadline:
                return pushed
            time.sleep(0.05)

    def metrics(self) -> Samples:
        """As /metrics serves them."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return samples(reply.read().decode())

    def metrics_after_stop(self) -> Samples:
        """What the stopped process counted last (its /metrics is closed by then)."""
        return samples(generate_latest(self.server.registry).decode())


def samples(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture(scope="session")
def notifier_settings(cassandra_settings: CassandraSettings) -> Iterator[NotifierSettings]:
    """Development settings on a migrated keyspace of this session, any free ports."""
    base = NotifierSettings.from_env(DEV_ENV)
    keyspace = f"notifier_{uuid.uuid4().hex[:8]}"
    settings = dataclasses.replace(
        base,
        port=0,
        metrics_port=0,
        cassandra=dataclasses.replace(cassandra_settings, keyspace=keyspace),
        health_probe_interval=timedelta(seconds=0.5),
        shutdown_grace=timedelta(seconds=5),
        push_retry_backoff=timedelta(seconds=0.05),
    )
    migrate_notifier(settings.cassandra)
    yield settings
    with connect(settings.cassandra, keyspace="") as connection:
        connection.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


@contextmanager
def running_notifier(
    settings: NotifierSettings, adapter: PushAdapter | None = None
) -> Iterator[Client]:
    server = NotifierServer(settings, adapter)
    with ServerThread(server) as thread:
        target = f"127.0.0.1:{server.port}"
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.NotificationServiceStub(channel)
            yield Client(target, server.metrics_port, channel, stub, server, thread.loop)


@pytest.fixture
def notifier(notifier_settings: NotifierSettings) -> Iterator[Client]:
    with running_notifier(notifier_settings) as client:
        yield client


@pytest.fixture
def user() -> str:
    return f"user-{uuid.uuid4().hex[:10]}"


def leave_unsettled_key(
    settings: NotifierSettings, key: str, user_id: str, accepted_ago: timedelta = timedelta(0)
) -> datetime:
    """The row a notifier that recorded `key` `accepted_ago` and then died (before pushing
    it) leaves behind: held by an attempt nobody runs, never settled. Returns its
    accepted_at, stamped once connected (a connect can take seconds on a slow machine)."""
    cassandra = settings.cassandra
    with connect(cassandra) as connection:
        accepted_at = datetime.now(UTC) - accepted_ago
        connection.session.execute(
            f"INSERT INTO {cassandra.keyspace}.notification_keys"
            " (idempotency_key, user_id, accept_id, accepted_at) VALUES (%s, %s, %s, %s)",
            (key, user_id, uuid.uuid4(), accepted_at),
        )
    return accepted_at


def reminder_key() -> str:
    """As the dispatcher builds them: "<reminder_id>/<due as RFC 3339>"."""
    due = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return f"{uuid.uuid4()}/{due}"


def item(
    user_id: str,
    key: str | None = None,
    *,
    priority: int = pb.PRIORITY_URGENT,
    title: str = "Call mom",
    body: str = "It is 18:00",
    expire_in: timedelta | None = timedelta(minutes=5),
) -> pb.Notification:
    message = pb.Notification(
        idempotency_key=reminder_key() if key is None else key,
        user_id=user_id,
        priority=priority,  # type: ignore[arg-type]
        title=title,
        body=body,
        data={"reminder_id": "r-1"},
    )
    now = datetime.now(UTC)
    message.due_time.FromDatetime(now)
    if expire_in is not None:
        message.expire_time.FromDatetime(now + expire_in)
    return message


class HoldableRecordingAdapter(RecordingPushAdapter):
    """Records; while held, a push waits for `release()`, so what is accepted meanwhile
    stays queued behind it (in whatever order the queue keeps it)."""

    def __init__(self, held: bool = False) -> None:
        super().__init__(capacity=1000)
        self._released = threading.Event()
        if not held:
            self._released.set()
        self.push_waiting = threading.Event()

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def push(self, message: PushMessage) -> PushResult:
        if not self._released.is_set():
            self.push_waiting.set()
            await asyncio.to_thread(self._released.wait, 30)
        return await super().push(message)


@dataclass
class HeldNotifier:
    """A notifier with one push worker, held inside the push of a first bulk item
    ("bulk-0/<user>") until the test calls `adapter.release()`. Calls are answered once
    their items are pushed, so they are made from `callers`."""

    notifier: Client
    adapter: HoldableRecordingAdapter
    callers: ThreadPoolExecutor

    def send(self, message: pb.Notification) -> Future[list[pb.SendResult]]:
        return self.callers.submit(self.notifier.send_batch, message)

    def send_queued(self, message: pb.Notification) -> Future[list[pb.SendResult]]:
        """Send, and return once the item waits in the queue (so items queue in order)."""
        before = self.notifier.queued()
        answer = self.send(message)
        self.notifier.wait_queued(before + 1)
        return answer


@contextmanager
def one_worker_held(settings: NotifierSettings, user: str) -> Iterator[HeldNotifier]:
    adapter = HoldableRecordingAdapter(held=True)
    one_worker = dataclasses.replace(settings, push_workers=1)
    with running_notifier(one_worker, adapter) as notifier, ThreadPoolExecutor(8) as callers:
        held = HeldNotifier(notifier, adapter, callers)
        held.send(item(user, f"bulk-0/{user}", priority=pb.PRIORITY_BULK))
        assert adapter.push_waiting.wait(10)
        try:
            yield held
        finally:
            adapter.release()


def key_rows(settings: NotifierSettings, keys: list[str], columns: str) -> list[Any]:
    """The notification_keys row of each key (its `columns`), None where there is none."""
    cassandra = settings.cassandra
    query = (
        f"SELECT {columns} FROM {cassandra.keyspace}.notification_keys WHERE idempotency_key = %s"
    )
    with connect(cassandra) as connection:
        return [connection.session.execute(query, (key,)).one() for key in keys]
