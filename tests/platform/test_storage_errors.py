"""A compare-and-set whose connection breaks is never re-sent: its outcome is unknown,
and a SERIAL read settles it (storage.retry, storage.aio.outcome_unknown).

On the real node, through a proxy that lets the LWT land but loses its reply and then
breaks the connection, as a node restarting under a rolling upgrade does.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator

import pytest
from cassandra import ConsistencyLevel
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionShutdown
from cassandra.policies import RetryPolicy
from cassandra.protocol import OverloadedErrorMessage, ServerError
from cassandra.query import BatchStatement, SimpleStatement

from reminders_svc.config import CassandraSettings
from reminders_svc.storage import aio
from reminders_svc.storage.errors import STORAGE_ERRORS
from reminders_svc.storage.retry import NoConditionalResend, is_conditional
from reminders_svc.storage.session import CassandraConnection, connect
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
