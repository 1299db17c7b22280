"""The driver's sockets on the service's own event loop (storage.loop_reactor), on the node."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from cassandra import OperationTimedOut
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException
from cassandra.query import SimpleStatement

from reminders_svc.config import CassandraSettings
from reminders_svc.storage import aio
from reminders_svc.storage.loop_reactor import LoopConnection, connect_on_loop, connected_on_loop
from reminders_svc.storage.session import CassandraConnection
from tests.tcp_proxy import TcpProxy

T = TypeVar("T")


def on_loop(body: Callable[[CassandraConnection], Awaitable[T]], settings: CassandraSettings) -> T:
    async def main() -> T:
        async with connected_on_loop(settings) as connection:
            return await body(connection)

    return asyncio.run(main())


def test_the_connections_do_their_io_on_the_loop_thread(
    migrated_settings: CassandraSettings,
) -> None:
    async def body(connection: CassandraConnection) -> tuple[type, int | None, int]:
        await aio.execute(connection.session, "SELECT release_version FROM system.local")
        cls = connection.cluster.connection_class
        return cls, cls._loop_thread, threading.get_ident()

    cls, io_thread, loop_thread = on_loop(body, migrated_settings)

    assert issubclass(cls, LoopConnection)
    assert io_thread == loop_thread


def test_many_concurrent_statements_from_the_loop_and_blocking_ones_from_threads(
    migrated_settings: CassandraSettings,
) -> None:
    user = f"u-{uuid.uuid4()}"
    insert = "INSERT INTO reminders (user_id, reminder_id, body) VALUES (%s, %s, %s)"

    async def body(connection: CassandraConnection) -> int:
        session = connection.session
        ids = [uuid.uuid4() for _ in range(600)]
        from_loop = [aio.execute(session, insert, (user, i, "x")) for i in ids[:500]]

        def blocking(i: uuid.UUID) -> None:  # the driver's own API, off the loop
            session.execute(insert, (user, i, "y"))

        from_threads = [asyncio.to_thread(blocking, i) for i in ids[500:]]
        await asyncio.gather(*from_loop, *from_threads)
        count = "SELECT count(*) FROM reminders WHERE user_id = %s"
        row = (await aio.execute(session, count, (user,))).one()
        return int(row.count)

    assert on_loop(body, migrated_settings) == 600


def test_a_message_larger_than_a_send_round_trips(migrated_settings: CassandraSettings) -> None:
    user, reminder = f"u-{uuid.uuid4()}", uuid.uuid4()
    text = "abcdefghij" * 300_000  # 3 MB: many socket sends, the rest queued for the writer

    async def body(connection: CassandraConnection) -> str:
        session = connection.session
        await aio.execute(
            session,
            "INSERT INTO reminders (user_id, reminder_id, body) VALUES (%s, %s, %s)",
            (user, reminder, text),
        )
        select = "SELECT body FROM reminders WHERE user_id = %s AND reminder_id = %s"
        row = (await aio.execute(session, select, (user, reminder))).one()
        return str(row.body)

    assert on_loop(body, migrated_settings) == text


def test_a_request_timeout_fires_from_the_loop(migrated_settings: CassandraSettings) -> None:
    async def body(connection: CassandraConnection) -> None:
        # No node answers within a microsecond: the driver's timer must fire on the loop.
        with pytest.raises(OperationTimedOut):
            await aio.execute(
                connection.session,
                "SELECT * FROM system_schema.columns",
                timeout_s=1e-6,
            )
        # The connection is still usable afterwards.
        await aio.execute(connection.session, "SELECT release_version FROM system.local")

    on_loop(body, migrated_settings)


def test_a_connection_closed_mid_reply_fails_its_request_at_once(
    migrated_settings: CassandraSettings,
) -> None:
    """A node that dies while answering leaves half a frame in the buffer: the connection
    must close on the end of the stream (not wait for more of it, waking the loop for
    every empty read), so the request fails now, not at its timeout."""
    proxy = TcpProxy(migrated_settings.contact_points[0], migrated_settings.port)
    settings = dataclasses.replace(migrated_settings, port=proxy.port, request_timeout_s=60)

    async def body(connection: CassandraConnection) -> float:
        query = "SELECT * FROM system_schema.columns"  # a reply of many reads
        await aio.execute(connection.session, query)
        proxy.break_next_reply(min_bytes=4096)  # the query's reply is tens of KB
        began = time.monotonic()
        with pytest.raises((ConnectionException, NoHostAvailable, OperationTimedOut)):
            await aio.execute(connection.session, query)
        return time.monotonic() - began

    try:
        failed_after_s = on_loop(body, settings)
    finally:
        proxy.close()
    assert failed_after_s < 20  # the request timeout is 60 s


def test_closing_after_the_loop_is_gone_does_not_raise(
    migrated_settings: CassandraSettings,
) -> None:
    async def connect_only() -> CassandraConnection:
        connection = await connect_on_loop(migrated_settings)
        await aio.execute(connection.session, "SELECT release_version FROM system.local")
        return connection

    connection = asyncio.run(connect_only())
    connection.close()  # the loop is closed now; sockets are closed directly


def test_a_result_is_never_paged_by_blocking_on_the_loop(
    migrated_settings: CassandraSettings,
) -> None:
    """`execute` gives the first page and refuses to fetch more (a blocking fetch on the
    loop that does the driver's I/O would never return); `execute_all` awaits every page."""

    async def body(connection: CassandraConnection) -> tuple[int, int, int]:
        # The schema's own tables: other tests' keyspaces come and go between the reads.
        query = SimpleStatement(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = 'system_schema'",
            fetch_size=5,
        )
        all_rows = await aio.execute_all(connection.session, query)
        counted = await aio.count_all(connection.session, query)
        first_page = await aio.execute(connection.session, query)
        with pytest.raises(RuntimeError, match="execute_all"):
            list(first_page)
        return len(all_rows), counted, len(first_page.current_rows)

    every, counted, first = on_loop(body, migrated_settings)

    assert first == 5
    assert every > 5
    assert counted == every  # every page counted, none kept
