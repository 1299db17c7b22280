"""Reading a (minute, part) bucket on the dispatcher's own loop, on the real node."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from dispatcher.buckets import BucketReader
from reminders_svc.config import CassandraSettings
from reminders_svc.storage.loop_reactor import connected_on_loop


def test_a_bucket_of_many_pages_is_read_whole_without_blocking_the_loop(
    migrated_settings: CassandraSettings,
) -> None:
    """A busy minute holds more entries per part than one page (5,000 by default; 10
    here): the pages after the first are awaited, where the driver's own iteration
    blocked the loop that does its I/O, and the dispatcher froze at its busiest minute."""
    minute = datetime(2031, 1, 6, 14, 0, tzinfo=UTC) + timedelta(minutes=uuid.uuid4().int % 10_000)
    entries = {uuid.uuid4() for _ in range(25)}

    async def read() -> tuple[int, int]:
        async with connected_on_loop(migrated_settings) as connection:
            session = connection.session
            session.default_fetch_size = 10
            for reminder_id in entries:
                await asyncio.to_thread(
                    session.execute,
                    "INSERT INTO due_buckets (minute, part, written_at, reminder_id, user_id, due)"
                    " VALUES (%s, 0, now(), %s, 'u-pages', %s)",
                    (minute, reminder_id, minute),
                )
            reader = await asyncio.to_thread(BucketReader, session)
            async with asyncio.timeout(20):
                everything = await reader.read(minute, 0)
                since = await reader.read(minute, 0, datetime.now(UTC) - timedelta(hours=1))
            assert {entry.reminder_id for entry in everything} == entries
            return len(everything), len(since)

    assert asyncio.run(read()) == (25, 25)
