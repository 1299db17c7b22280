"""A compare-and-set whose connection breaks is never re-sent: its outcome is unknown,
and a SERIAL read settles it (storage.retry, storage.aio.outcome_unknown).

On the real node, through a proxy that lets the LWT land but loses its reply and then
breaks the connection, as a node restarting under a rolling upgrade does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import itertools
import logging
import struct
import time
import uuid
from collections.abc import Iterator

import pytest
from cassandra import (
    ConsistencyLevel,
    InvalidRequest,
    OperationTimedOut,
    ReadTimeout,
    Unavailable,
    WriteFailure,
    WriteTimeout,
    WriteType,
)
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionShutdown
from cassandra.policies import RetryPolicy
from cassandra.protocol import ErrorMessage, OverloadedErrorMessage, ServerError
from cassandra.query import BatchStatement, SimpleStatement

from reminders_svc.config import CassandraSettings
from reminders_svc.storage import aio
from reminders_svc.storage.errors import STORAGE_ERRORS, StorageUnavailable
from reminders_svc.storage.loop_reactor import connected_on_loop
from reminders_svc.storage.retry import NoConditionalResend, is_conditional
from reminders_svc.storage.session import RECONNECTION, CassandraConnection, connect
from tests.tcp_proxy import TcpProxy

CLAIM = (
    "UPDATE reminders SET status = 'sending' WHERE user_id = ? AND reminder_id = ?"
    " IF status = 'pending'"
)


@pytest.fixture
def proxied(migrated_settings: CassandraSettings) -> Iterator[tuple[TcpProxy, CassandraConnection]]:
    proxy = TcpProxy(migrated_settings.contact_points[0], migrated_settings.port)
    settings = dataclasses.replace(migrated_settings, port=proxy.port, request_timeout_s=30)
    try:
        with connect(settings) as connection:
            yield proxy, connection
    finally:
        proxy.close()


def _pending_row(cassandra: CassandraConnection) -> tuple[str, uuid.UUID]:
    user, reminder = f"u-{uuid.uuid4()}", uuid.uuid4()
    cassandra.session.execute(
        "INSERT INTO reminders (user_id, reminder_id, status, version)"
        " VALUES (%s, %s, 'pending', 1)",
        (user, reminder),
    )
    return user, reminder


def _status(cassandra: CassandraConnection, user: str, reminder: uuid.UUID) -> str:
    row = cassandra.session.execute(
        SimpleStatement(
            "SELECT status FROM reminders WHERE user_id = %s AND reminder_id = %s",
            consistency_level=ConsistencyLevel.SERIAL,
        ),
        (user, reminder),
    ).one()
    return str(row.status)


def test_an_lwt_whose_reply_is_lost_with_its_connection_is_unknown_not_re_sent(
    proxied: tuple[TcpProxy, CassandraConnection], cassandra: CassandraConnection
) -> None:
    proxy, through_proxy = proxied
    user, reminder = _pending_row(cassandra)
    claim = through_proxy.session.prepare(CLAIM)
    proxy.hold_replies()

    future = through_proxy.session.execute_async(claim, (user, reminder))
    deadline = time.monotonic() + 10
    while _status(cassandra, user, reminder) != "sending" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _status(cassandra, user, reminder) == "sending"  # it landed; its sender can't know
    proxy.cut()
    with pytest.raises(ConnectionShutdown) as raised:
        future.result()

    # The driver's default would re-send it (to the next node; here there is none, so
    # NoHostAvailable), and a re-send on a cluster answers "not applied" for a claim that
    # was ours. It is surfaced as what it is instead: unknown, settled by a SERIAL read.
    assert aio.outcome_unknown(raised.value)
    assert isinstance(raised.value, STORAGE_ERRORS)


def test_a_read_whose_connection_breaks_is_re_sent_as_before(
    proxied: tuple[TcpProxy, CassandraConnection],
) -> None:
    proxy, through_proxy = proxied
    proxy.hold_replies()
    future = through_proxy.session.execute_async("SELECT release_version FROM system.local")
    time.sleep(0.5)
    proxy.cut()
    with pytest.raises(NoHostAvailable) as raised:  # re-sent, to no node left here
        future.result()
    assert not aio.outcome_unknown(raised.value)
    assert isinstance(raised.value, STORAGE_ERRORS)


def test_which_statements_count_as_compare_and_set(cassandra: CassandraConnection) -> None:
    session = cassandra.session
    assert is_conditional(session.prepare(CLAIM).bind(("u", uuid.uuid4())))
    assert is_conditional(SimpleStatement("INSERT INTO t (k) VALUES (1) IF NOT EXISTS"))
    assert is_conditional("DELETE FROM t WHERE k = 1 if exists")
    assert is_conditional(BatchStatement())
    read = session.prepare("SELECT status FROM reminders WHERE user_id = ? AND reminder_id = ?")
    assert not is_conditional(read.bind(("u", uuid.uuid4())))
    assert not is_conditional(SimpleStatement("SELECT verified FROM modified_things"))


@pytest.mark.parametrize(
    ("error", "statement", "decision"),
    [
        (
            ConnectionShutdown("gone"),
            "UPDATE t SET a = 1 WHERE k = 1 IF a = 0",
            RetryPolicy.RETHROW,
        ),
        (
            ServerError(0, "boom", None),
            "INSERT INTO t (k) VALUES (1) IF NOT EXISTS",
            RetryPolicy.RETHROW,
        ),
        # An overloaded node refused the request: re-sending even a CAS is safe.
        (
            OverloadedErrorMessage(0, "busy", None),
            "UPDATE t SET a = 1 WHERE k = 1 IF a = 0",
            RetryPolicy.RETRY_NEXT_HOST,
        ),
        (ConnectionShutdown("gone"), "SELECT a FROM t WHERE k = 1", RetryPolicy.RETRY_NEXT_HOST),
    ],
)
def test_the_retry_decisions(error: Exception, statement: str, decision: int) -> None:
    chosen, _ = NoConditionalResend().on_request_error(
        SimpleStatement(statement), ConsistencyLevel.QUORUM, error, 0
    )
    assert chosen == decision


def test_a_missing_keyspace_is_storage_unavailable_and_named(
    cassandra_settings: CassandraSettings,
) -> None:
    """Processes wait (not ready) for a keyspace not migrated yet, as for a node not up."""
    missing = dataclasses.replace(cassandra_settings, keyspace=f"nosuch_{uuid.uuid4().hex[:8]}")
    with pytest.raises(StorageUnavailable, match=missing.keyspace) as raised:
        connect(missing)
    assert "reminders migrate" in str(raised.value)


def test_a_node_behind_a_proxy_that_hangs_up_is_not_taken_for_back_up(
    migrated_settings: CassandraSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """A balancer in front of a node that is down accepts connections and closes them. That
    is a failed connect, backed off, not a "successful reconnection" every second; and once
    the node answers again, the process is back within the reconnection cap (10 s)."""
    proxy = TcpProxy(migrated_settings.contact_points[0], migrated_settings.port)
    settings = dataclasses.replace(migrated_settings, port=proxy.port)

    def reconnections() -> int:
        return sum("Successful reconnection" in r.getMessage() for r in caplog.records)

    async def outage() -> tuple[int, float]:
        async with connected_on_loop(settings) as connection:
            probe = "SELECT release_version FROM system.local"
            await aio.execute(connection.session, probe)
            proxy.cut()
            cut_until = time.monotonic() + 8
            while time.monotonic() < cut_until:  # callers keep asking meanwhile
                with contextlib.suppress(*STORAGE_ERRORS):
                    await aio.execute(connection.session, probe)
                await asyncio.sleep(0.5)
            during = reconnections()
            proxy.restore()
            restored = time.monotonic()
            while time.monotonic() < restored + 60:  # past it: never back, as the check says
                try:
                    await aio.execute(connection.session, probe)
                    break
                except STORAGE_ERRORS:
                    await asyncio.sleep(0.2)
            return during, time.monotonic() - restored

    caplog.set_level(logging.INFO, logger="cassandra")
    try:
        reconnected_during_outage, back_after_s = asyncio.run(outage())
    finally:
        proxy.close()

    assert reconnected_during_outage == 0
    # At most one capped wait (the driver keeps its jitter within the cap), and then the
    # reconnection itself, given seconds on a loaded machine.
    assert back_after_s < RECONNECTION.max_delay + 5


def test_reconnection_never_gives_up_and_never_waits_long(cassandra: CassandraConnection) -> None:
    delays = list(itertools.islice(cassandra.cluster.reconnection_policy.new_schedule(), 200))
    assert len(delays) == 200  # the driver's default stops after 64 attempts
    assert max(delays) <= 10 * 1.15  # its default waits up to 600 s (+/- 15% jitter)


def _as_received(code: int, message: str, info: bytes) -> Exception:
    """An ERROR message as the driver decodes it off the wire (protocol v5)."""
    body = struct.pack(">iH", code, len(message)) + message.encode() + info
    decoded: Exception = ErrorMessage.recv_body(io.BytesIO(body), 5, None, None)
    return decoded


# CAS_WRITE_UNKNOWN: consistency SERIAL (0x0008), 1 of 2 replies.
CAS_WRITE_UNKNOWN = _as_received(0x1700, "CAS write unknown", struct.pack(">Hii", 8, 1, 2))


@pytest.mark.parametrize(
    ("error", "unknown", "storage"),
    [
        (WriteTimeout("t", write_type=WriteType.CAS), True, True),
        (WriteFailure("f", write_type=WriteType.CAS), True, True),  # Paxos v2: some accepted
        (CAS_WRITE_UNKNOWN, True, True),  # as decoded from the wire
        (ConnectionShutdown("gone"), True, True),
        (ReadTimeout("t"), False, True),
        (Unavailable("u"), False, True),
        (NoHostAvailable("none", {}), False, True),  # nothing was sent
        (OverloadedErrorMessage(0x1001, "busy", None), False, True),  # refused, not tried
        (InvalidRequest("a bug"), False, False),  # retrying a bug helps nobody
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else None,
)
def test_which_errors_leave_a_write_unknown_and_which_mean_storage_is_away(
    error: Exception, unknown: bool, storage: bool
) -> None:
    assert aio.outcome_unknown(error) is unknown
    assert isinstance(error, STORAGE_ERRORS) is storage


def test_a_statement_without_a_timeout_of_its_own_times_out_per_the_settings(
    migrated_settings: CassandraSettings,
) -> None:
    """REMINDERS_CASSANDRA_REQUEST_TIMEOUT bounds every statement that names no timeout
    (not the driver's legacy 10 s default)."""
    proxy = TcpProxy(migrated_settings.contact_points[0], migrated_settings.port)
    settings = dataclasses.replace(migrated_settings, port=proxy.port, request_timeout_s=1)
    try:
        with connect(settings) as connection:
            proxy.hold_replies()

            async def unanswered() -> float:
                started = time.monotonic()
                with pytest.raises(OperationTimedOut):
                    await aio.execute(
                        connection.session, "SELECT release_version FROM system.local"
                    )
                return time.monotonic() - started

            assert asyncio.run(unanswered()) < 5
    finally:
        proxy.close()
