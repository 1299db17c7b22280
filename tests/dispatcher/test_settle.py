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

import pytest

from reminders_svc.config import Retention
from reminders_svc.domain import dispatch
from reminders_svc.domain.reminder import Reminder, Status, new_reminder, pause, snooze
from reminders_svc.schedule import parse_repeat
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import CassandraConnection
from tests.unknown_outcome import UnknownOutcome

DUE = datetime(2026, 10, 26, 13, tzinfo=UTC)
LEASE = timedelta(seconds=30)
UserChange = Callable[[Reminder, datetime], Reminder]


def _snooze(row: Reminder, now: datetime) -> Reminder:
    return snooze(row, now + timedelta(hours=1), now)


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

        async def a_users_change_lands() -> None:
            assert then is not None
            stored = await user_store.get_serial(row.user_id, row.reminder_id)
            assert stored is not None
            assert await user_store.replace(stored, then(stored.reminder, DUE), DUE)

        # Its only conditional write is the one under test (its bucket entry goes through).
        injector = UnknownOutcome(lands=lands, then=a_users_change_lands if then else None)
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

        assert await store.replace(stored, written, DUE) is settled_as

        after = await user_store.get_serial(row.user_id, row.reminder_id)
        assert after is not None
        if step == "claim" and settled_as:
            assert after.reminder.claim == written.claim  # landed once, under the snooze too
        if step == "finalize" and lands:
            assert (after.reminder.status, after.reminder.claim) == (Status.PENDING, None)

    asyncio.run(scenario())
