"""Await cassandra-driver's futures on the asyncio loop, and settle LWTs of unknown outcome.

The driver runs its I/O on its own thread; results are handed to the loop with
`call_soon_threadsafe`, so coroutines never block on the driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from cassandra import OperationTimedOut, WriteTimeout, WriteType
from cassandra.cluster import ResultSet, Session

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

    response.add_callbacks(
        lambda rows: loop.call_soon_threadsafe(deliver, rows),
        lambda error: loop.call_soon_threadsafe(fail, error),
    )
    return await done


def outcome_unknown(error: BaseException) -> bool:
    """True when an LWT may or may not have landed: settle it with a SERIAL read."""
    if isinstance(error, WriteTimeout):
        return error.write_type in (WriteType.CAS, WriteType.SIMPLE, WriteType.BATCH)
    return isinstance(error, OperationTimedOut)
