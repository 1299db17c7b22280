"""The notifier's idempotency keys on the real node: which attempt a recorded key belongs to."""

from __future__ import annotations

import asyncio
import uuid

from notifier.domain.model import Notification, Priority
from notifier.settings import NotifierSettings
from notifier.storage.keys import KeyRecord, KeyStore
from reminders_svc.storage.session import connect


def test_a_key_is_this_attempts_own_when_the_row_holds_its_accept_id(
    notifier_settings: NotifierSettings,
) -> None:
    """A re-sent insert of an attempt whose first insert landed (its reply lost) finds the
    attempt's own row: that is "recorded, push it", not "duplicate, pushed before"."""
    settings = notifier_settings.cassandra
    item = Notification(f"k-{uuid.uuid4()}", "u-keys", Priority.URGENT, "title", "body")
    first_attempt, second_attempt = uuid.uuid4(), uuid.uuid4()

    async def record() -> list[KeyRecord]:
        with connect(settings) as connection:
            keys = KeyStore(connection.session, settings.keyspace, notifier_settings.key_ttl)
            return [
                await keys.record(item, first_attempt),
                await keys.record(item, first_attempt),  # the same insert, sent again
                await keys.record(item, second_attempt),  # another delivery of the same key
            ]

    assert asyncio.run(record()) == [
        KeyRecord.RECORDED,
        KeyRecord.RECORDED,
        KeyRecord.ALREADY_RECORDED,
    ]
