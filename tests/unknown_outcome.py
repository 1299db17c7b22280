"""An LWT of unknown outcome, injected through `ReminderStore(executor=...)`.

The first statement `targets` picks runs for real (`lands`) or not at all; `then` runs
next (another writer's change landing before the settling read); then the statement's
outcome is reported unknown, as a lost reply, a lost request or a connection broken under
it would report it. Every other statement runs as usual.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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
