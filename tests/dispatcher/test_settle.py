"""The dispatcher's LWTs of unknown outcome, settled on the real node by a SERIAL read.

Its claim and finalize keep the row's op_id (that names the last user change), so they
are settled by their claim token: a claim landed if the row holds its token, even under a
snooze written after it; a finalize landed if the claim it cleared is gone and no user
change came after.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cassandra import WriteTimeout, WriteType
from cassandra.cluster import ResultSet, Session

from reminders_svc.config import Retention
from reminders_svc.domain import dispatch
from reminders_svc.domain.reminder import Reminder, Status, new_reminder, pause, snooze
from reminders_svc.schedule import parse_repeat
from reminders_svc.storage import aio
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.retry import is_conditional
from reminders_svc.storage.session import CassandraConnection

DUE = datetime(2026, 10, 26, 13, tzinfo=UTC)
LEASE = timedelta(seconds=30)
UserChange = Callable[[Reminder, datetime], Reminder]


def _snooze(row: Reminder, now: datetime) -> Reminder:
    return snooze(row, now + timedelta(hours=1), now)


class _UnknownOutcome:
    """The first LWT runs for real (`lands`) or not at all, a user's change may land after
    it, and then its outcome is reported unknown."""

    def __init__(self, user_store: ReminderStore, lands: bool, then: UserChange | None) -> None:
        self._user_store = user_store
        self._lands = lands
        self._then = then
        self.row: tuple[str, uuid.UUID] | None = None

    async def __call__(self, session: Session, statement: Any, params: Any) -> ResultSet:
        if self.row is None or not is_conditional(statement):  # a bucket entry goes through
            return await aio.execute(session, statement, params)
        row, self.row = self.row, None
        if self._lands:
            await aio.execute(session, statement, params)
        if self._then is not None:
            stored = await self._user_store.get_serial(*row)
            assert stored is not None
            assert await self._user_store.replace(stored, self._then(stored.reminder, DUE), DUE)
        raise WriteTimeout("injected", write_type=WriteType.CAS)


@pytest.mark.parametrize(
    ("step", "lands", "then", "settled_as"),
    [
        ("claim", True, None, True),
        ("claim", False, None, False),
        ("claim", True, _snooze, True),  # the snooze leaves the claim standing
        ("claim", True, pause, False),  # the user took over: the row decides again
        ("finalize", True, None, True),
        ("finalize", False, None, False),
        ("finalize", False, pause, False),  # the claim is gone, but by the user's change
    ],
    ids=[
        "claim-landed",
        "claim-lost",
        "claim-landed-then-snoozed",
        "claim-landed-then-paused",
        "finalize-landed",
        "finalize-lost",
        "finalize-lost-user-took-over",
    ],
)
def test_a_dispatcher_write_of_unknown_outcome_is_settled_by_its_claim(
    own_keyspace: CassandraConnection,
    step: str,
    lands: bool,
    then: UserChange | None,
    settled_as: bool,
) -> None:
    async def scenario() -> None:
        session = own_keyspace.session
        user_store = ReminderStore(session, Retention())
        injector = _UnknownOutcome(user_store, lands, then)
        store = ReminderStore(session, Retention(), executor=injector)
        schedule = parse_repeat("every Monday 09:00", "America/New_York", datetime(2026, 10, 19))
        row = new_reminder("u-settle", "call mom", schedule, DUE, DUE - timedelta(days=1))
        assert await user_store.create(row, None, 100)
        stored = await user_store.get_serial(row.user_id, row.reminder_id)
        assert stored is not None
        if step == "finalize":
            claimed = dispatch.claimed(stored.reminder, uuid.uuid4(), DUE, LEASE)
            assert await user_store.replace(stored, claimed, DUE)
            stored = await user_store.get_serial(row.user_id, row.reminder_id)
            assert stored is not None
            written = dispatch.finalized(stored.reminder, DUE)
        else:
            written = dispatch.claimed(stored.reminder, uuid.uuid4(), DUE, LEASE)

        injector.row = (row.user_id, row.reminder_id)
        assert await store.replace(stored, written, DUE) is settled_as

        after = await user_store.get_serial(row.user_id, row.reminder_id)
        assert after is not None
        if step == "claim" and settled_as:
            assert after.reminder.claim == written.claim  # landed once, under the snooze too
        if step == "finalize" and lands:
            assert (after.reminder.status, after.reminder.claim) == (Status.PENDING, None)

    asyncio.run(scenario())
