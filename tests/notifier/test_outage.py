"""The notifier through a Cassandra outage that begins while it serves: health follows the
database, items it cannot record are answered RETRYABLE (never accepted or duplicate),
what it had recorded is still delivered (and then answered), and retried keys are
delivered exactly once."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genproto.notification.v1 import notification_pb2 as pb
from notifier.delivery.adapters import RecordingPushAdapter
from notifier.settings import NotifierSettings
from notifier.storage.schema import migrate_notifier
from reminders_svc.health import LIVENESS_SERVICE
from reminders_svc.storage import aio
from reminders_svc.storage.session import connect
from tests.notifier.conftest import (
    ACCEPTED,
    RETRYABLE,
    Client,
    HoldableRecordingAdapter,
    item,
    key_rows,
    running_notifier,
)
from tests.platform.helpers import REMINDERS, free_port
from tests.tcp_proxy import TcpProxy

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Long enough for every pre-outage item to have met the dead database several times.
OUTAGE_S = 4.0


@contextmanager
def notifier_behind_proxy(
    settings: NotifierSettings, adapter: RecordingPushAdapter
) -> Iterator[tuple[Client, TcpProxy]]:
    """A notifier (one push worker) reaching Cassandra through a proxy the test can cut."""
    cassandra = settings.cassandra
    proxy = TcpProxy(cassandra.contact_points[0], cassandra.port)
    proxied = dataclasses.replace(
        settings,
        push_workers=1,
        cassandra=dataclasses.replace(cassandra, port=proxy.port),
    )
    try:
        with running_notifier(proxied, adapter) as notifier:
            wait_health(notifier, SERVING, timeout_s=30)
            yield notifier, proxy
    finally:
        proxy.close()


def wait_health(notifier: Client, status: int, timeout_s: float, service: str = "") -> None:
    """Until the server answers `status`; every answer is also proof it is still running."""
    health = health_pb2_grpc.HealthStub(notifier.channel)
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        if seen == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"health still {seen} after {timeout_s} s, expected {status}")


def send_during_outage(notifier: Client, *items: pb.Notification) -> None:
    """A batch storage cannot take: each item is answered RETRYABLE (never accepted or
    duplicate), or the whole call is refused UNAVAILABLE; never INTERNAL or UNKNOWN."""
    refused: grpc.StatusCode | None = None
    try:
        results = notifier.send_batch(*items)
    except grpc.RpcError as error:
        refused = error.code()
    else:
        assert [r.idempotency_key for r in results] == [m.idempotency_key for m in items]
        assert [(r.outcome, r.reason.startswith("storage unavailable")) for r in results] == [
            (RETRYABLE, True)
        ] * len(items)
    assert refused in (None, grpc.StatusCode.UNAVAILABLE)


def wait_keys_landed(settings: NotifierSettings, keys: list[str], timeout_s: float = 30) -> None:
    """Until every key's row is on the node (read past the proxy): its write landed."""
    deadline = time.monotonic() + timeout_s
    while None in key_rows(settings, keys, "accept_id"):
        assert time.monotonic() < deadline, "the key writes never reached the node"
        time.sleep(0.05)


def send_with_answers_lost(
    settings: NotifierSettings, notifier: Client, proxy: TcpProxy, batch: list[pb.Notification]
) -> None:
    """The key writes reach the node, then the database is cut off before any answer
    (to the writes or to the reads settling them) comes back: answered RETRYABLE."""
    proxy.hold_replies()
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(send_during_outage, notifier, *batch)
        # Cut only once landed: cut sooner, the keys were never written, and the tests
        # below would check a send that never reached the node.
        wait_keys_landed(settings, [m.idempotency_key for m in batch])
        proxy.cut()
        sending.result(timeout=30)


def deliveries(notifier: Client, user: str) -> Counter[str]:
    return Counter(p.idempotency_key for p in notifier.delivered(user))


def assert_delivered_once(notifier: Client, user: str, keys: list[str]) -> None:
    notifier.wait_delivered(len(keys), user, timeout_s=20)
    time.sleep(0.3)  # a second push, if any, would have landed by now
    assert deliveries(notifier, user) == Counter(keys)


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Outage errors are handled and logged in a line, by the notifier and by gRPC (whose
    traceback would mean an unhandled error in a servicer). The driver's own reconnection
    logging is left out: the proxy accepts a connection and then closes it, which the
    driver takes for a node back up, and it logs the failed pool with a traceback."""
    with_traceback = [
        r
        for r in caplog.records
        if (r.exc_info or r.exc_text) and r.name.partition(".")[0] != "cassandra"
    ]
    assert not with_traceback, [f"{r.name}: {r.getMessage()}" for r in with_traceback]


def test_an_outage_answers_retryable_and_loses_nothing_recorded_before_it(
    notifier_settings: NotifierSettings, user: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Serving, then the database gone for seconds, then back: nothing recorded before it
    is lost (each is answered ACCEPTED once pushed), nothing unrecorded is claimed,
    nothing is pushed twice, and the server keeps running."""
    caplog.set_level(logging.WARNING)
    adapter = HoldableRecordingAdapter()
    with (
        notifier_behind_proxy(notifier_settings, adapter) as (notifier, proxy),
        ThreadPoolExecutor(4) as callers,
    ):
        normal = item(user)
        [result] = notifier.send_batch(normal)
        assert result.outcome == ACCEPTED
        assert_delivered_once(notifier, user, [normal.idempotency_key])

        # The one worker holds the first of these in its push; the rest stay queued.
        adapter.hold()
        recorded_before = [item(user) for _ in range(4)]
        first = callers.submit(notifier.send_batch, recorded_before[0], timeout_s=120)
        assert adapter.push_waiting.wait(10)
        rest = callers.submit(notifier.send_batch, *recorded_before[1:], timeout_s=120)
        notifier.wait_queued(3)

        proxy.cut()
        wait_health(notifier, NOT_SERVING, timeout_s=5)
        retry_later = [item(user) for _ in range(5)]
        send_during_outage(notifier, *retry_later)
        adapter.release()  # the queued items now meet the dead database
        time.sleep(OUTAGE_S)
        assert deliveries(notifier, user) == Counter(
            m.idempotency_key for m in [normal, recorded_before[0]]
        )
        assert not rest.done()  # not answered: not delivered yet
        wait_health(notifier, NOT_SERVING, timeout_s=5)  # still running, still honest
        wait_health(notifier, SERVING, timeout_s=5, service=LIVENESS_SERVICE)

        proxy.restore()
        wait_health(notifier, SERVING, timeout_s=60)
        answered = first.result(timeout=60) + rest.result(timeout=60)
        assert [r.outcome for r in answered] == [ACCEPTED] * len(recorded_before)
        results = notifier.send_batch(*retry_later)
        assert [r.outcome for r in results] == [ACCEPTED] * len(retry_later)
        assert_delivered_once(
            notifier,
            user,
            [m.idempotency_key for m in [normal, *recorded_before, *retry_later]],
        )
    assert_no_traceback(caplog)


def test_key_writes_cut_off_in_flight_are_accepted_once_when_sent_again(
    notifier_settings: NotifierSettings, user: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The key writes reach the node but their answers never come back: the notifier
    cannot tell whether they landed, so it answers RETRYABLE; the same keys sent again
    once the node is back must then be pushed, once, not taken for someone else's."""
    caplog.set_level(logging.WARNING)
    adapter = RecordingPushAdapter(capacity=1000)
    with notifier_behind_proxy(notifier_settings, adapter) as (notifier, proxy):
        batch = [item(user) for _ in range(5)]
        send_with_answers_lost(notifier_settings, notifier, proxy, batch)
        wait_health(notifier, NOT_SERVING, timeout_s=5)
        assert deliveries(notifier, user) == Counter()

        proxy.restore()
        wait_health(notifier, SERVING, timeout_s=60)
        results = notifier.send_batch(*batch)
        assert [r.outcome for r in results] == [ACCEPTED] * len(batch)
        assert_delivered_once(notifier, user, [m.idempotency_key for m in batch])
    assert_no_traceback(caplog)


def test_a_key_write_landed_unheard_on_one_replica_is_pushed_once_by_another(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """Replica A's key writes land, but neither their answers nor the reads settling them
    come back, so A answers RETRYABLE; the sender's retry reaches replica B, which cannot
    tell A's failed attempts from live ones: it answers RETRYABLE while A might still
    deliver, then takes the keys over and pushes each once (it used to answer DUPLICATE,
    and the rings were lost)."""
    # From A's writes landing to B's first judging of them: A's answer (after the cut, once
    # the cluster's CAS bound has passed: A's coordinator may still be at its write) and
    # B's call, with room for a slow machine (at 3 s, B once found the bound passed).
    with connect(notifier_settings.cassandra, keyspace="") as connection:
        cas_bound = timedelta(seconds=aio.cas_bound_s(connection.session))
    takeover_after = cas_bound + timedelta(seconds=15)
    settings = dataclasses.replace(notifier_settings, key_takeover_after=takeover_after)
    adapter = RecordingPushAdapter(capacity=1000)
    with (
        notifier_behind_proxy(settings, adapter) as (replica_a, proxy),
        running_notifier(settings) as replica_b,
    ):
        batch = [item(user) for _ in range(3)]
        send_with_answers_lost(settings, replica_a, proxy, batch)

        held = replica_b.send_batch(*batch)
        assert {(r.outcome, r.reason) for r in held} == {
            (RETRYABLE, "another attempt is delivering this key")
        }
        # Sent again, as the dispatcher does, until each has a final answer.
        final: dict[str, int] = {}
        deadline = time.monotonic() + takeover_after.total_seconds() + 10
        while len(final) < len(batch):
            assert time.monotonic() < deadline, "never taken over"
            time.sleep(0.5)
            for r in replica_b.send_batch(*(m for m in batch if m.idempotency_key not in final)):
                if r.outcome != RETRYABLE:
                    final[r.idempotency_key] = r.outcome
        assert set(final.values()) == {ACCEPTED}
        assert_delivered_once(replica_b, user, [m.idempotency_key for m in batch])
        assert adapter.delivered(user, "") == []


def test_a_notifier_started_before_its_database_waits_then_serves_or_stops_on_sigterm(
    notifier_settings: NotifierSettings, tmp_path: Path
) -> None:
    """Not a crash loop: it waits for the database (not listening, so not ready), serves
    once the database answers, and a SIGTERM while it waits ends it at once, cleanly."""
    settings = notifier_settings.cassandra
    proxy = TcpProxy(settings.contact_points[0], settings.port)
    proxy.cut()

    def spawn(port: int, log: int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "REMINDERS_ENV": "dev",
            "REMINDERS_CASSANDRA_PORT": str(proxy.port),
            "REMINDERS_NOTIFIER_KEYSPACE": settings.keyspace,
            "REMINDERS_NOTIFIER_PORT": str(port),
            "REMINDERS_NOTIFIER_METRICS_PORT": "0",
        }
        return subprocess.Popen([REMINDERS, "notifier"], env=env, stdout=log, stderr=log)

    log_path = tmp_path / "stopped_while_waiting.log"
    with log_path.open("wb") as log:
        stopped_while_waiting = spawn(free_port(), log.fileno())
    waiting = spawn(port := free_port())
    try:
        # Waiting, its signal handlers set (a loaded machine starts Python slowly).
        deadline = time.monotonic() + 60
        while "retrying in" not in log_path.read_text():
            assert stopped_while_waiting.poll() is None, "exited without its database"
            assert time.monotonic() < deadline, "never said it waits for its database"
            time.sleep(0.2)
        assert stopped_while_waiting.poll() is None, "exited without its database"
        stopped_while_waiting.send_signal(signal.SIGTERM)
        assert stopped_while_waiting.wait(10) == 0

        proxy.restore()

        deadline = time.monotonic() + 60
        status = None
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while status != SERVING and time.monotonic() < deadline:
                with contextlib.suppress(grpc.RpcError):
                    status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                time.sleep(0.3)
        assert status == SERVING
        waiting.send_signal(signal.SIGTERM)
        assert waiting.wait(30) == 0
    finally:
        for process in (stopped_while_waiting, waiting):
            if process.poll() is None:
                process.kill()
        proxy.close()


def test_a_notifier_stopped_while_another_migrator_holds_the_schema_lock_exits_at_once(
    notifier_settings: NotifierSettings, tmp_path: Path
) -> None:
    """Starting, it migrates its keyspace, and waits (up to 10 minutes) while another
    migrator holds the schema lock; a SIGTERM meanwhile ends it at once (it holds nothing
    that must be released), and the other's lock stays as it was."""
    settings = dataclasses.replace(
        notifier_settings.cassandra, keyspace=f"notifier_lock_{uuid.uuid4().hex[:8]}"
    )
    migrate_notifier(settings)  # the lock's table
    log_path = tmp_path / "notifier.log"
    with connect(settings) as connection:
        session = connection.session
        session.execute(
            "INSERT INTO schema_migration_lock (name, owner, acquired_at)"
            " VALUES ('migrate', 'another-migrator', toTimestamp(now())) USING TTL 120"
        )
        env = {
            **os.environ,
            "REMINDERS_ENV": "dev",
            "REMINDERS_NOTIFIER_KEYSPACE": settings.keyspace,
            "REMINDERS_NOTIFIER_PORT": str(free_port()),
            "REMINDERS_NOTIFIER_METRICS_PORT": "0",
        }
        with log_path.open("wb") as log:
            process = subprocess.Popen([REMINDERS, "notifier"], env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while "waiting for the schema lock, held by another-migrator" not in (
                log_path.read_text()
            ):
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "never waited for the lock"
                time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            assert process.wait(30) == 0, log_path.read_text()
            assert time.monotonic() - sent < 5
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            lock = session.execute("SELECT owner FROM schema_migration_lock").one()
            session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)
    assert lock.owner == "another-migrator"
    assert "Traceback" not in log_path.read_text()
