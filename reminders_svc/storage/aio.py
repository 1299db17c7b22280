"""Await cassandra-driver's futures on the asyncio loop, and settle LWTs of unknown outcome.

Coroutines never block on the driver. A result that arrives on another thread (the
driver's reactor thread) is handed to the loop with `call_soon_threadsafe`; one that
arrives on the loop's own thread (`loop_reactor.LoopConnection`) is delivered at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from cassandra import OperationTimedOut, WriteTimeout, WriteType
from cassandra.cluster import ResultSet, Session
from cassandra.connection import ConnectionException
from cassandra.protocol import ServerError

Params = Sequence[Any] | dict[str, Any] | None


async def execute(
    session: Session, statement: Any, params: Params = None, *, timeout_s: float | None = None
) -> ResultSet:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[ResultSet] = loop.create_future()
    response = session.execute_async(
        statement, params, timeout=timeout_s if timeout_s is not None else session.default_timeout
    )

    def deliver(rows: Any) -> None:
        if not done.done():
            done.set_result(ResultSet(response, rows))

    def fail(error: BaseException) -> None:
        if not done.done():
            done.set_exception(error)

    loop_thread = threading.get_ident()

    def on_loop(value: Any, settle: Callable[[Any], None]) -> None:
        if threading.get_ident() == loop_thread:
            settle(value)
        else:
            loop.call_soon_threadsafe(settle, value)

    response.add_callbacks(on_loop, on_loop, callback_args=(deliver,), errback_args=(fail,))
    return await done


def outcome_unknown(error: BaseException) -> bool:
    """True when an LWT may or may not have landed: settle it with a SERIAL read.

    A broken connection or a server error reaches the caller only for a request already
    sent (`storage.retry`), so it is as unknown as a timeout.
    """
    if isinstance(error, WriteTimeout):
        return error.write_type in (WriteType.CAS, WriteType.SIMPLE, WriteType.BATCH)
    return isinstance(error, OperationTimedOut | ConnectionException | ServerError)
