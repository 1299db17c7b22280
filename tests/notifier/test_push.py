"""What a push carries to APNs / FCM, without a database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from notifier.domain.model import MAX_KEY_BYTES, Device, Notification, Platform, Priority
from notifier.domain.push import MAX_COLLAPSE_ID_BYTES, collapse_id, push_message
from reminders_svc.domain import dispatch
from reminders_svc.domain.reminder import new_reminder
from reminders_svc.schedule import one_off_local


def test_a_reminder_key_is_its_own_collapse_id() -> None:
    due = datetime(2026, 10, 26, 13, 0, 0, 123456, tzinfo=UTC)
    schedule = one_off_local(datetime(2026, 10, 26, 9, 0), "America/New_York")
    row = new_reminder("u", "call mom", schedule, due, due - timedelta(days=1))
    key = dispatch.idempotency_key(dispatch.claimed(row, uuid.uuid4(), due, timedelta(30)))
    assert len(key.encode()) == MAX_COLLAPSE_ID_BYTES
    assert collapse_id(key) == key


def test_a_longer_key_gets_a_stable_digest_within_the_apns_limit() -> None:
    long_keys = ["newsletter/" + "x" * 60, "é" * (MAX_KEY_BYTES // 2), "k" * MAX_KEY_BYTES]
    ids = [collapse_id(key) for key in long_keys]
    assert all(len(id_.encode()) <= MAX_COLLAPSE_ID_BYTES for id_ in ids)
    assert ids == [collapse_id(key) for key in long_keys]  # every retry collapses alike
    assert len(set(ids)) == len(ids)
    assert collapse_id("k" * (MAX_KEY_BYTES - 1)) not in ids


def test_a_push_keeps_the_key_and_carries_its_collapse_id() -> None:
    key = "campaign-2026-12/" + "u" * 80
    notification = Notification(key, "alice", Priority.BULK, "title", "body")
    message = push_message(notification, Device("token", Platform.APNS, datetime.now(UTC)))
    assert message.idempotency_key == key
    assert message.collapse_id == collapse_id(key) != key


def test_a_key_that_is_not_printable_ascii_gets_a_digest_a_header_can_carry() -> None:
    """APNs takes the collapse id as an HTTP/2 header: a short key in another script (or
    with a control character) went into it as it was."""
    for key in ("rappel-é", "tab\there"):
        id_ = collapse_id(key)
        assert id_ != key
        assert id_.isascii()
        assert id_.isprintable()
        assert len(id_) <= MAX_COLLAPSE_ID_BYTES
