"""A user who has churned through many reminders: the rows they deleted expire into
tombstones that stay until compaction runs past gc_grace, and a read scanning them fails
past Cassandra's tombstone failure threshold (100,000 by default, as on the test node)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime

from cassandra.concurrent import execute_concurrent_with_args

from reminders_svc.app import RemindersApp
from reminders_svc.config import Retention
from reminders_svc.domain.limits import Limits
from reminders_svc.schedule import parse_repeat
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import CassandraConnection
from tests.api.conftest import SEED_NOW, FakeClock

# Rows whose cells have all expired, ~12 cells each: past the failure threshold.
EXPIRED_ROWS = 10_000


def _expired_rows_before_every_reminder(cassandra: CassandraConnection, user: str) -> None:
    """As many rows as a churning user leaves past the tombstone TTL, their ids sorting
    before any reminder's (a uuid4's first bytes zeroed), so that reaching the first live
    row scans them all, as it does for the rows that lie before it."""
    insert = cassandra.session.prepare(
        "INSERT INTO reminders (user_id, reminder_id, body, schedule_kind, zone, local_start,"
        " rrule, status, occurrence, due, version, op_id, updated_at, created_at)"
        " VALUES (?, ?, 'gone', 'repeat', 'UTC', '2026-01-01T09:00', 'FREQ=DAILY', 'deleted',"
        " ?, ?, 1, ?, ?, ?) USING TTL 1"
    )
    now = datetime(2026, 1, 1)
    rows = [
        (
            user,
            uuid.UUID(bytes=bytes(3) + uuid.uuid4().bytes[3:], version=4),
            now,
            now,
            uuid.uuid4(),
            now,
            now,
        )
        for _ in range(EXPIRED_ROWS)
    ]
    results = execute_concurrent_with_args(cassandra.session, insert, rows, concurrency=64)
    assert all(ok for ok, _ in results)
    time.sleep(1.5)  # past their TTL


def test_a_user_who_churned_through_thousands_of_reminders_can_still_create(
    cassandra: CassandraConnection, user: str
) -> None:
    """The active count was read with the partition's first live row (`LIMIT 1`), past
    every expired row before it: past 100,000 tombstones the read failed, and so did each
    of the user's creates. It is read through the partition's count row."""
    schedule = parse_repeat("every Monday 09:00", "America/New_York", datetime(2026, 10, 19, 10))
    app = RemindersApp(ReminderStore(cassandra.session, Retention()), Limits(), FakeClock(SEED_NOW))
    first = asyncio.run(app.create(user, "first", "water the plants", schedule, b"first"))
    _expired_rows_before_every_reminder(cassandra, user)

    again = asyncio.run(app.create(user, "again", "call mom", schedule, b"again"))

    assert again.reminder_id != first.reminder_id
    assert asyncio.run(ReminderStore(cassandra.session, Retention()).active_count(user)) == 2
