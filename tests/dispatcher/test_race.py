"""1,000 reminders due in one minute while users delete, snooze, edit and pause them.

Every API answer is recorded with the time it came back; then the notifier's recorded
pushes, the delivery history and the rows are checked against what the API promised.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.admin.parts import ceil_minute
from reminders_svc.config import CassandraSettings
from tests.dispatcher.stack import Stack, running_stack

USERS, PER_USER = 100, 10


# Creating the 1,000 reminders takes about 6 s on a development machine: their minute is
# the first one starting at least this far ahead, so a machine several times slower still
# creates them all before it (and the test waits 30 to 90 s for it).
CREATE_ROOM = timedelta(seconds=30)
# A snooze rings this long after it is sent: in this minute or the next (the stack's
# shortest snooze is 5 s).
SNOOZE_S = 10


@dataclass
class Tracked:
    user: str
    reminder_id: str
    dues: set[datetime]
    texts: dict[str, float] = field(default_factory=dict)  # text -> when it was answered
    edit_sent_at: float | None = None  # when the edit to "v2" was sent
    deleted_quietly_at: float | None = None  # a delete that answered "not in flight"
    deleted_in_flight: bool = False
    paused_at: float | None = None  # when the pause answered
    snoozed_to: datetime | None = None

    @property
    def untouched(self) -> bool:
        """Neither deleted nor paused: it must ring once per due it held."""
        return (
            self.deleted_quietly_at is None
            and not self.deleted_in_flight
            and self.paused_at is None
        )


@pytest.fixture
def stack(cassandra_settings: CassandraSettings, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with running_stack(cassandra_settings, "a", "b", request=request) as running:
        yield running


def _due_of(key: str) -> datetime:
    return datetime.strptime(key.split("/")[1], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _wait_for_rings(
    stack: Stack, expected: set[tuple[str, datetime]], timeout_s: float
) -> set[tuple[str, datetime]]:
    """Until every expected ring (reminder id, due) was pushed and its delivery recorded
    with the notifier's answer, or the timeout; what is still missing then."""
    deadline = time.monotonic() + timeout_s
    while True:
        pushed = {
            (p.idempotency_key.split("/")[0], _due_of(p.idempotency_key)) for p in stack.pushes()
        }
        rows = stack.db.session.execute("SELECT reminder_id, claim_due, answer FROM deliveries")
        answered = {(str(r.reminder_id), r.claim_due.replace(tzinfo=UTC)) for r in rows if r.answer}
        missing = expected - (pushed & answered)
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(1)


@pytest.mark.slow
def test_a_busy_minute_under_concurrent_user_changes(stack: Stack) -> None:
    rng = random.Random(7)
    started = datetime.now(UTC)
    minute = ceil_minute(started + CREATE_ROOM)
    plan = [
        (f"race-{u}-{uuid.uuid4().hex[:6]}", minute + timedelta(seconds=rng.uniform(1, 55)))
        for u in range(USERS)
        for _ in range(PER_USER)
    ]

    def create(item: tuple[str, datetime]) -> Tracked:
        user, due = item
        due = due.replace(microsecond=0)  # the time engine keeps whole seconds
        created = stack.create_at(user, due, text="v1")
        return Tracked(user, created.id, {due}, {"v1": time.time()})

    with ThreadPoolExecutor(max_workers=16) as pool:
        tracked = list(pool.map(create, plan))
    created_in = datetime.now(UTC) - started
    assert datetime.now(UTC) < minute, f"creating took {created_in}: too long for this machine"

    def act(item: Tracked) -> None:
        md = stack.md(item.user)
        choice = rng.random()
        time.sleep(max(0.0, (minute - datetime.now(UTC)).total_seconds() + rng.uniform(0, 58)))
        try:
            if choice < 0.15:
                deleted = stack.api.DeleteReminder(
                    pb.DeleteReminderRequest(id=item.reminder_id), metadata=md
                )
                if deleted.was_sending:
                    item.deleted_in_flight = True
                else:
                    item.deleted_quietly_at = time.time()
            elif choice < 0.25:
                snoozed = stack.api.SnoozeReminder(
                    pb.SnoozeReminderRequest(
                        id=item.reminder_id, duration=Duration(seconds=SNOOZE_S)
                    ),
                    metadata=md,
                )
                item.snoozed_to = snoozed.snooze_until_time.ToDatetime(tzinfo=UTC)
                item.dues.add(item.snoozed_to)
            elif choice < 0.40:
                current = stack.api.GetReminder(
                    pb.GetReminderRequest(id=item.reminder_id), metadata=md
                )
                item.edit_sent_at = time.time()
                stack.api.UpdateReminder(
                    pb.UpdateReminderRequest(
                        reminder=pb.Reminder(
                            id=item.reminder_id, version=current.version, text="v2"
                        ),
                        update_mask=FieldMask(paths=["text"]),
                    ),
                    metadata=md,
                )
                item.texts["v2"] = time.time()
            elif choice < 0.50:
                stack.api.PauseReminder(pb.PauseReminderRequest(id=item.reminder_id), metadata=md)
                item.paused_at = time.time()
        except grpc.RpcError as error:
            refusals.append(error.code())

    refusals: list[grpc.StatusCode] = []
    with ThreadPoolExecutor(max_workers=64) as pool:
        list(pool.map(act, tracked))
    # Allowed refusals only: a version moved (ABORTED) or the state forbids it.
    allowed = {grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION}
    assert set(refusals) <= allowed, refusals

    # Every ring a reminder neither deleted nor paused must make (snoozes ring SNOOZE_S
    # later), pushed and recorded; then a little longer for any that must not come.
    last_due = max(max(t.dues) for t in tracked)
    expected = {(t.reminder_id, due) for t in tracked if t.untouched for due in t.dues}
    wait_s = max(0.0, (last_due - datetime.now(UTC)).total_seconds()) + 60
    missing = _wait_for_rings(stack, expected, timeout_s=wait_s)
    assert not missing, f"{len(missing)} rings never came, e.g. {sorted(missing)[:3]}"
    time.sleep(2)

    pushes = stack.pushes()
    by_reminder: dict[str, list[tuple[datetime, datetime, str]]] = defaultdict(list)
    for push in pushes:
        rid = push.idempotency_key.split("/")[0]
        by_reminder[rid].append(
            (_due_of(push.idempotency_key), push.push_time.ToDatetime(tzinfo=UTC), push.body)
        )
    keys = Counter(p.idempotency_key for p in pushes)
    assert all(count == 1 for count in keys.values()), "one delivery per key"

    checked: Counter[str] = Counter()  # each check below ran on some rings, not on none
    for item in tracked:
        rings = by_reminder.get(item.reminder_id, [])
        history = (
            stack.deliveries(item.user, item.reminder_id)
            if (item.deleted_quietly_at is None and not item.deleted_in_flight)
            else None
        )
        for due, pushed, body in rings:
            assert due in item.dues, "a ring for a due the row never held"
            assert pushed >= due, "rang early"
            assert body in item.texts, "a text that was never the reminder's"
        for delivery in history or []:
            claimed_at = delivery.claim_time.ToDatetime(tzinfo=UTC)
            assert claimed_at >= delivery.due_time.ToDatetime(tzinfo=UTC), "claimed early"
        # Claims are read from the table: a deleted reminder's history is not listed.
        claims = [
            claim.claimed_at.replace(tzinfo=UTC).timestamp()
            for claim in stack.db.session.execute(
                "SELECT claimed_at FROM deliveries WHERE user_id = %s AND reminder_id = %s",
                (item.user, uuid.UUID(item.reminder_id)),
            )
        ]
        if item.paused_at is not None:
            # (A one-off that has rung refuses a pause: paused ones rarely have claims.)
            assert all(at < item.paused_at for at in claims), "claimed after its pause"
        if item.deleted_quietly_at is not None:
            assert all(at < item.deleted_quietly_at for at in claims), (
                "claimed after a delete that answered 'not in flight'"
            )
            for _due, pushed, _body in rings:
                assert pushed.timestamp() < item.deleted_quietly_at, (
                    "rang after a delete that answered 'not in flight'"
                )
                checked["a ring before a quiet delete"] += 1
        if item.deleted_in_flight:
            assert len(rings) <= 1
        if item.untouched:
            assert sorted(d for d, _, _ in rings) == sorted(item.dues), (
                f"{item.reminder_id}: rang {len(rings)} times for dues {sorted(item.dues)}"
            )
            assert history is not None
            assert len(history) == len(item.dues)
        # The text rung is the claimed version's. Pushed before the edit was sent: claimed
        # before it, so the old text. Claimed after the edit answered: the new text.
        if item.edit_sent_at is not None:
            for _due, pushed, body in rings:
                if pushed.timestamp() < item.edit_sent_at:
                    assert body == "v1", "a ring claimed before the edit carried the edit's text"
                    checked["the old text"] += 1
        if "v2" in item.texts:
            for due, _pushed, body in rings:
                claimed = [d for d in (history or []) if d.due_time.ToDatetime(tzinfo=UTC) == due]
                if (
                    claimed
                    and claimed[0].claim_time.ToDatetime(tzinfo=UTC).timestamp()
                    > (item.texts["v2"])
                ):
                    assert body == "v2", "the ring carried a text older than its claim"
                    checked["the new text"] += 1
    assert set(checked) == {"a ring before a quiet delete", "the old text", "the new text"}, checked
