"""An LWT of unknown outcome, injected through `ReminderStore(executor=...)`.

The first statement `targets` picks runs for real (`lands`) or not at all; `then` runs
next (another writer's change landing before the settling read); then the statement's
outcome is reported unknown, as a lost reply, a lost request or a connection broken under
it would report it. Every other statement runs as usual.

`LandsLate` is the coordinator that goes on after its connection broke: the statement
lands `after_s` later, or just before the next conditional write if that comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from cassandra import WriteTimeout, WriteType
from cassandra.cluster import ResultSet, Session

from reminders_svc.storage import aio
from reminders_svc.storage.retry import is_conditional


class UnknownOutcome:
    def __init__(
        self,
        *,
        lands: bool,
        error: Exception | None = None,
        targets: Callable[[Any], bool] = is_conditional,
        then: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._lands = lands
        self._error = error or WriteTimeout("injected", write_type=WriteType.CAS)
        self._targets = targets
        self._then = then
        self.injected = 0

    async def __call__(self, session: Session, statement: Any, params: Any) -> ResultSet:
        if self.injected or not self._targets(statement):
            return await aio.execute(session, statement, params)
        self.injected += 1
        if self._lands:
            await aio.execute(session, statement, params)
        if self._then is not None:
            await self._then()
        raise self._error


class LandsLate:
    """The first statement `targets` picks is answered `error` at once and lands `after_s`
    later, in the background, or just before the next statement `targets` picks, whichever
    comes first: a coordinator still in its contention loop when the connection broke,
    whose retry lands after the caller heard the error."""

    def __init__(
        self, *, error: Exception, after_s: float, targets: Callable[[Any], bool] = is_conditional
    ) -> None:
        self._error = error
        self._after_s = after_s
        self._targets = targets
        self._next = asyncio.Event()  # the next targeted statement came
        self._landing: asyncio.Task[None] | None = None

    async def __call__(self, session: Session, statement: Any, params: Any) -> ResultSet:
        if not self._targets(statement):
            return await aio.execute(session, statement, params)
        if self._landing is not None:
            self._next.set()
            await self._landing  # lands first: it was still under way
            return await aio.execute(session, statement, params)

        async def land_later() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._next.wait(), self._after_s)
            await aio.execute(session, statement, params)

        self._landing = asyncio.create_task(land_later())
        raise self._error

    async def landed(self) -> None:
        assert self._landing is not None
        await self._landing


@contextlib.contextmanager
def cas_bound(session: Session, seconds: float) -> Iterator[None]:
    """The session's cluster CAS bound (`aio.cas_bound_s`) set to `seconds` for a while."""
    profile = session.cluster.profile_manager.default
    before = profile.cas_bound_s
    profile.cas_bound_s = seconds
    try:
        yield
    finally:
        profile.cas_bound_s = before
