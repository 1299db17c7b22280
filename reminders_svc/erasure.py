"""The account-data use case: an operator deletes everything of one user (issue 4, 10).

Rows go first (fenced against the user's creates, storage/purge.py), then the delivery
history. Each erasure runs in a task of its own, so that it finishes (fence lifted,
count right) when its caller goes away or its deadline passes; a caller asking again in
this process joins it. An audit trail says who erased whose data, asked and done (ids
only, never texts).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass

from reminders_svc.app import Clock, utc_now
from reminders_svc.domain.errors import InvalidArgument, Unavailable
from reminders_svc.domain.reminder import user_id_problem
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.purge import PURGE_UNDER_WAY, UserPurge

audit = logging.getLogger("reminders.audit")


@dataclass(frozen=True)
class ErasedUser:
    reminders: int  # rows removed, tombstones of deleted reminders included
    requests: int  # create records removed
    deliveries: int  # delivery history records removed
    # Rows whose ring was with the notifier: those rings may still reach the devices.
    rings_in_flight: int


class UserDataEraser:
    def __init__(self, purge: UserPurge, history: DeliveryHistory, clock: Clock = utc_now):
        self._purge = purge
        self._history = history
        self._clock = clock
        self._erasures: dict[str, asyncio.Task[ErasedUser]] = {}

    async def erase(self, operator: str, user_id: str) -> ErasedUser:
        """Everything of `user_id`; joins an erasure of it under way in this process."""
        if (problem := user_id_problem(user_id)) is not None:
            raise InvalidArgument("user_id", problem)
        erasure = self._erasures.get(user_id)
        if erasure is None:
            erasure = asyncio.create_task(self._erase(operator, user_id))
            self._erasures[user_id] = erasure
            erasure.add_done_callback(functools.partial(self._ended, operator, user_id))
        return await asyncio.shield(erasure)

    async def finish(self, timeout_s: float) -> None:
        """Let the erasures under way finish, for up to `timeout_s` (a shutdown's grace);
        cancel the rest, so the audit trail says which to run again before the process
        is killed."""
        if not self._erasures:
            return
        _, unfinished = await asyncio.wait(set(self._erasures.values()), timeout=timeout_s)
        for erasure in unfinished:
            erasure.cancel()
        if unfinished:
            await asyncio.wait(unfinished)

    async def _erase(self, operator: str, user_id: str) -> ErasedUser:
        audit.info("operator %r deletes all data of user %r", operator, user_id)
        purged = await self._purge.run(user_id, self._clock())
        # After the rows: a dispatcher whose ring was in flight finds its row gone and
        # removes the record it wrote (refinement 29); one it wrote before is removed here.
        deliveries = await self._history.purge_user(user_id)
        audit.info(
            "operator %r deleted all data of user %r: %d reminders (%d rings in flight),"
            " %d create records, %d deliveries",
            operator,
            user_id,
            purged.reminders,
            purged.rings_in_flight,
            purged.requests,
            deliveries,
        )
        return ErasedUser(
            reminders=purged.reminders,
            requests=purged.requests,
            deliveries=deliveries,
            rings_in_flight=purged.rings_in_flight,
        )

    def _ended(self, operator: str, user_id: str, erasure: asyncio.Task[ErasedUser]) -> None:
        del self._erasures[user_id]
        error = None if erasure.cancelled() else erasure.exception()
        if isinstance(error, Unavailable) and error.reason == PURGE_UNDER_WAY:
            # Not a failure: the purge holding the fence finishes the work.
            audit.info(
                "operator %r's deletion of all data of user %r found another under way (on"
                " another server): that one finishes it",
                operator,
                user_id,
            )
        elif erasure.cancelled() or error is not None:
            # Its caller may be gone: the audit trail says it did not finish.
            audit.warning(
                "operator %r's deletion of all data of user %r failed (%s); run it again:"
                " the user's creates stay refused until a deletion finishes (a new run"
                " takes this one's fence over 2 minutes after its last refresh)",
                operator,
                user_id,
                "the server stopped" if erasure.cancelled() else type(error).__name__,
            )
