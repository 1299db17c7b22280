"""Await cassandra-driver's futures on the asyncio loop, and settle LWTs of unknown outcome.

Coroutines never block on the driver. A result that arrives on another thread (the
driver's reactor thread) is handed to the loop with `call_soon_threadsafe`; one that
arrives on the loop's own thread (`loop_reactor.LoopConnection`) is delivered at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from cassandra import OperationTimedOut, WriteFailure, WriteTimeout, WriteType
from cassandra.cluster import ResultSet, Session
from cassandra.connection import ConnectionException
from cassandra.protocol import ServerError

from reminders_svc.storage.errors import (
    STORAGE_ERRORS,
    CasWriteUnknown,
    WriteNotLanded,
    WriteOutcomeUnknown,
)

Params = Sequence[Any] | dict[str, Any] | None


class OnePage(ResultSet):  # type: ignore[misc]  # the driver is untyped
    """A result of `execute`: its first page only. The driver's ResultSet would fetch the
    next page by blocking on it, and on the loop that does the driver's I/O
    (`loop_reactor`) that wait never ends: a query that may return more than one page
    (`Session.default_fetch_size`, 5,000 rows) goes through `execute_all`."""

    def fetch_next_page(self) -> None:
        raise RuntimeError("a result of more than one page: read it with aio.execute_all")


async def execute(
    session: Session,
    statement: Any,
    params: Params = None,
    *,
    timeout_s: float | None = None,
    paging_state: bytes | None = None,
) -> ResultSet:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[ResultSet] = loop.create_future()
    # Without a timeout of the call's own, the execution profile's request_timeout
    # (REMINDERS_CASSANDRA_REQUEST_TIMEOUT) applies; session.default_timeout would
    # override it with the driver's legacy 10 s.
    timeout = {} if timeout_s is None else {"timeout": timeout_s}
    response = session.execute_async(statement, params, paging_state=paging_state, **timeout)

    def deliver(rows: Any) -> None:
        if not done.done():
            done.set_result(OnePage(response, rows))

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


async def database_now(session: Session, timeout_s: float | None = None) -> datetime:
    """The coordinator's clock, `toTimestamp(now())`: aware UTC, to the millisecond."""
    query = "SELECT toTimestamp(now()) AS now FROM system.local"
    row = (await execute(session, query, timeout_s=timeout_s)).one()
    now: datetime = row.now
    return now.replace(tzinfo=UTC)


async def pages(
    session: Session, statement: Any, params: Params = None, *, timeout_s: float | None = None
) -> AsyncIterator[list[Any]]:
    """The rows page by page, each page awaited (never a blocking fetch), none kept: a
    partition of millions of rows is read in the memory of one page."""
    paging_state: bytes | None = None
    while True:
        page = await execute(
            session, statement, params, timeout_s=timeout_s, paging_state=paging_state
        )
        yield page.current_rows
        if not page.has_more_pages:
            return
        paging_state = page.paging_state


async def execute_all(
    session: Session, statement: Any, params: Params = None, *, timeout_s: float | None = None
) -> list[Any]:
    """Every row, page after page (for results known to be small)."""
    return [
        row async for rows in pages(session, statement, params, timeout_s=timeout_s) for row in rows
    ]


async def count_all(session: Session, statement: Any, params: Params = None) -> int:
    """How many rows `statement` reads, counted page by page without keeping them."""
    return sum([len(rows) async for rows in pages(session, statement, params)])


def outcome_unknown(error: BaseException) -> bool:
    """True when an LWT may or may not have landed: settle it with a SERIAL read.

    A broken connection or a server error reaches the caller only for a request already
    sent (`storage.retry`), so it is as unknown as a timeout.
    """
    if isinstance(error, WriteTimeout | WriteFailure):
        # A failure too: some replicas may have accepted the Paxos proposal (Paxos v2).
        return error.write_type in (WriteType.CAS, WriteType.SIMPLE, WriteType.BATCH)
    return isinstance(
        error, OperationTimedOut | ConnectionException | ServerError | CasWriteUnknown
    )


def coordinator_unheard(error: BaseException) -> bool:
    """True when no coordinator answered the request (a connection broken under it, the
    driver's own timeout): that coordinator may still be working on it."""
    return isinstance(error, OperationTimedOut | ConnectionException)


# Cassandra's defaults: cas_contention_timeout 1 s plus write_request_timeout 2 s.
DEFAULT_CAS_BOUND_S = 3.0


def cas_bound_s(session: Session) -> float:
    """How long after an LWT is sent its coordinator may still be working on it: the
    cluster's `cas_contention_timeout` plus `write_request_timeout`, read when the session
    connected (`session.connect_cluster`); Cassandra's defaults for a session made
    otherwise."""
    profile = session.cluster.profile_manager.default
    return float(getattr(profile, "cas_bound_s", DEFAULT_CAS_BOUND_S))


_T = TypeVar("_T")


async def or_settled(
    session: Session, attempt: Awaitable[_T], settle: Callable[[], Awaitable[_T]]
) -> _T:
    """What the LWT `attempt` gives; when its outcome is unknown, what `settle` (a SERIAL
    read of the row it wrote) says instead. Never re-applied blindly (invariant 4).

    When no coordinator answered, the read waits until the cluster's CAS bound has passed
    since the statement was sent: a coordinator still in its contention loop would retry
    with a higher ballot after the read's, and land its change after the read said it had
    not (architecture.md, refinement 32). A coordinator that answered (a write timeout,
    an error) is done, and the read's Paxos round fixes the outcome at once."""
    sent = time.monotonic()
    try:
        return await attempt
    except Exception as error:
        if not outcome_unknown(error):
            raise
        if coordinator_unheard(error):
            await asyncio.sleep(max(0.0, sent + cas_bound_s(session) - time.monotonic()))
        try:
            return await settle()
        except (WriteOutcomeUnknown, WriteNotLanded):
            raise  # the read settled it as the row tells (or cannot): said as it is
        except STORAGE_ERRORS as unsettled:
            raise WriteOutcomeUnknown(
                f"a conditional write of unknown outcome ({type(error).__name__}) could not "
                f"be settled ({type(unsettled).__name__})"
            ) from unsettled


async def applied_or_settled(
    session: Session, attempt: Awaitable[ResultSet], settle: Callable[[], Awaitable[bool]]
) -> bool:
    """Whether the LWT `attempt` applied; when its outcome is unknown, what `settle` says."""

    async def applied() -> bool:
        return bool((await attempt).one().applied)

    return await or_settled(session, applied(), settle)
