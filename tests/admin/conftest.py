"""Admin tests: a migrated keyspace of their own (`own_keyspace`, shared with the
dispatcher tests: parts and leases are global state), the `reminders admin` command run
in-process against it, and rows made through the store."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

from reminders_svc.cli import main
from reminders_svc.config import CassandraSettings, Retention
from reminders_svc.domain.reminder import Reminder, new_reminder
from reminders_svc.schedule import Schedule, one_off_instant
from reminders_svc.storage import aio
from reminders_svc.storage.reminders_store import Executor, ReminderStore, StoredReminder
from reminders_svc.storage.session import CassandraConnection
from tests.dispatcher.conftest import own_keyspace

__all__ = ["own_keyspace"]  # a fixture, re-exported for this directory

T = TypeVar("T")
SECRET_TEXT = "call the bank about the mortgage"


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def cassandra_env(settings: CassandraSettings) -> dict[str, str]:
    """The REMINDERS_CASSANDRA_* a process needs to reach `settings`' keyspace."""
    return {
        "REMINDERS_CASSANDRA_CONTACT_POINTS": ",".join(settings.contact_points),
        "REMINDERS_CASSANDRA_PORT": str(settings.port),
        "REMINDERS_CASSANDRA_KEYSPACE": settings.keyspace,
        **({"REMINDERS_CASSANDRA_LOCAL_DC": settings.local_dc} if settings.local_dc else {}),
    }


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, self.err
        return json.loads(self.out)


AdminRunner = Callable[..., Outcome]


@pytest.fixture
def admin(
    own_keyspace: CassandraConnection,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> AdminRunner:
    """`admin("parts", "--json")` runs `reminders admin parts --json` on the test keyspace."""
    return admin_runner(own_keyspace.settings, monkeypatch, capsys)


def admin_runner(
    settings: CassandraSettings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> AdminRunner:
    for name, value in cassandra_env(settings).items():
        monkeypatch.setenv(name, value)

    def invoke(*args: str) -> Outcome:
        capsys.readouterr()
        code = main(["admin", *args])
        captured = capsys.readouterr()
        return Outcome(code, captured.out, captured.err)

    return invoke


def store_of(connection: CassandraConnection, executor: Executor = aio.execute) -> ReminderStore:
    """The store on `connection`, its statements run by `executor` (an injected fault)."""
    return ReminderStore(connection.session, Retention(), executor=executor)


def at_instant(
    user: str, due: datetime, now: datetime, schedule: Schedule | None = None
) -> Reminder:
    """A pending reminder due at `due`, as created at `now` (the entry goes to due's minute)."""
    return new_reminder(
        user, SECRET_TEXT, schedule or one_off_instant(due), due, now, reminder_id=uuid.uuid4()
    )


async def put(store: ReminderStore, reminder: Reminder) -> StoredReminder:
    assert await store.create(reminder, await store.active_count(reminder.user_id), 1000)
    stored = await store.get(reminder.user_id, reminder.reminder_id)
    assert stored is not None
    return stored


async def change(store: ReminderStore, stored: StoredReminder, after: Reminder) -> StoredReminder:
    """Write `after` over `stored` (as a writer would: LWT, bucket first) and read it back."""
    assert await store.replace(stored, after, datetime.now(UTC))
    again = await store.get(after.user_id, after.reminder_id)
    assert again is not None
    return again


def whole_minute(instant: datetime) -> str:
    return instant.strftime("%Y-%m-%dT%H:%MZ")


def minutes_ago(minutes: float) -> datetime:
    return (datetime.now(UTC) - timedelta(minutes=minutes)).replace(second=0, microsecond=0)
