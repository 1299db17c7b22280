"""Rings end to end through real processes: API, dispatcher, notifier, on real Cassandra."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, timedelta

import pytest
from google.protobuf.duration_pb2 import Duration

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.config import CassandraSettings
from tests.dispatcher.stack import Stack, move_due, pushed_early, running_stack, soon
from tests.tracing import scanned


@pytest.fixture(scope="module")
def stack(cassandra_settings: CassandraSettings, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with running_stack(cassandra_settings, "d1", request=request) as running:
        yield running


@pytest.fixture
def user() -> str:
    return f"u-{uuid.uuid4().hex[:10]}"


def _push_times(stack: Stack, key_prefix: str) -> list[float]:
    return [p.push_time.ToDatetime(tzinfo=UTC).timestamp() for p in stack.pushes("", key_prefix)]


def test_a_one_off_created_3_s_ahead_rings_once_not_early(stack: Stack, user: str) -> None:
    due = soon(3)
    created = stack.create_at(user, due)

    pushes = stack.wait_for_pushes(1, user, created.id)
    time.sleep(2)  # would a second push come?

    assert len(stack.pushes(user, created.id)) == 1
    pushed = pushes[0].push_time.ToDatetime(tzinfo=UTC)
    assert due <= pushed < due + timedelta(seconds=5)
    assert stack.row(user, created.id).status == "done"  # type: ignore[attr-defined]
    history = stack.deliveries(user, created.id)
    assert [d.answer for d in history] == [pb.Delivery.ANSWER_ACCEPTED]
    assert history[0].reason == ""
    assert history[0].lateness.ToMilliseconds() >= 0
    # Claimed at its due, not when its entry was read ahead of it (prefetch).
    assert history[0].claim_time.ToDatetime(tzinfo=UTC) >= due
    # The history row holds no null (a tombstone cell every ListDeliveries would scan).
    query = "SELECT * FROM deliveries WHERE user_id = %s"
    assert scanned(stack.db.session, query, (user,)) == ["Read 1 live rows and 0 tombstone cells"]


def test_a_one_off_that_has_rung_can_be_snoozed_to_ring_again(stack: Stack, user: str) -> None:
    created = stack.create_at(user, soon(2))
    assert len(stack.wait_for_pushes(1, user, created.id)) == 1
    assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]

    snoozed = stack.api.SnoozeReminder(
        pb.SnoozeReminderRequest(id=created.id, duration=Duration(seconds=6)),
        metadata=stack.md(user),
    )

    assert snoozed.state == pb.Reminder.STATE_PENDING
    assert snoozed.next_ring_time == snoozed.snooze_until_time
    snooze_until = snoozed.snooze_until_time.ToDatetime(tzinfo=UTC)
    pushes = stack.wait_for_pushes(2, user, created.id)
    assert len(pushes) == 2, "the snooze did not ring"
    # Its own ring (a key of its own), at or after the snooze's time, not before.
    assert len({p.idempotency_key for p in pushes}) == 2
    assert max(p.push_time.ToDatetime(tzinfo=UTC) for p in pushes) >= snooze_until
    assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]


def test_a_repeat_rings_and_re_arms_at_its_next_occurrence(stack: Stack, user: str) -> None:
    start = soon(65).replace(second=0) + timedelta(minutes=1)
    local = start.strftime("%Y-%m-%dT%H:%M:%S")
    created = stack.create_repeat(user, local)
    assert created.next_ring_time.ToDatetime(tzinfo=UTC) == start
    # Bring the first ring close by, as an outage would leave it: bucket first, row second.
    move_due(stack, user, created.id, soon(2))

    assert len(stack.wait_for_pushes(1, user, created.id)) == 1
    row = stack.wait_status(user, created.id, "pending")  # finalized: re-armed
    assert row.status == "pending"  # type: ignore[attr-defined]
    # The next occurrence after now, from the series (whole hours from its start).
    assert row.due.replace(tzinfo=UTC) == start  # type: ignore[attr-defined]


def test_deleted_before_its_claim_never_rings(stack: Stack, user: str) -> None:
    due = soon(4)
    created = stack.create_at(user, due)
    sibling = stack.create_at(user, due)  # rings: the minute was worked past that due
    answer = stack.api.DeleteReminder(
        pb.DeleteReminderRequest(id=created.id), metadata=stack.md(user)
    )
    assert not answer.was_sending
    assert len(stack.wait_for_pushes(1, user, sibling.id)) == 1
    time.sleep(2)
    assert stack.pushes(user, created.id) == []


def test_one_user_with_50_reminders_in_one_minute_all_ring_once(stack: Stack, user: str) -> None:
    due = soon(20)  # room for 50 creates, one after another, on a slow machine
    created = [stack.create_at(user, due + timedelta(milliseconds=10 * i)) for i in range(50)]

    stack.wait_for_pushes(50, user, timeout_s=50)
    time.sleep(1)

    pushes = stack.pushes(user)
    keys = [p.idempotency_key for p in pushes]
    assert len(keys) == 50
    assert not pushed_early(pushes), pushed_early(pushes)
    assert {k.split("/")[0] for k in keys} == {c.id for c in created}
    # Handed off once each: a second hand-off is deduplicated by its key, so it shows only
    # as the notifier's "duplicate" answer, never as a second push.
    assert stack.notifier_answers().get("duplicate", 0) == 0
