"""1,000 reminders due in one minute while users delete, snooze, edit and pause them.

Every reminder's action and its time relative to the reminder's due are drawn up front
from one seeded generator, so a failing plan can be run again; each action is sent at its
own time, a good share before the due (before the claim), some around it (while the ring
is claimed and handed off) and some after. Every API answer is recorded with the time it
came back; then the notifier's recorded pushes, the delivery history and the rows are
checked against what the API promised, and each interleaving that matters must have
occurred often enough that no check passed on nothing.
"""

from __future__ import annotations

import enum
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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

SEED = 7
USERS, PER_USER = 100, 10
# Creating the 1,000 reminders takes about 6 s on a development machine: their minute is
# the first one starting at least this far ahead, so a machine several times slower still
# creates them all before the first action (and the test waits 30 to 90 s for it).
CREATE_ROOM = timedelta(seconds=30)
# Dues within the minute: late enough that actions before them need no earlier start,
# early enough that actions after them and their snoozes end soon after the minute.
DUE_FROM_S, DUE_TO_S = 1.0, 48.0
# A snooze rings this long after it is sent: in this minute or the next (the stack's
# shortest snooze is 5 s).
SNOOZE_S = 10
# Each interleaving counted below must have occurred at least this often, so that no check
# passes on nothing. Low: those sent DURING a ring (50-80 per run here) depend on how soon
# after its due this machine claims and finalizes, and a slower one sees fewer.
MIN_CASES = 5


class Action(enum.Enum):
    DELETE = "delete"
    SNOOZE = "snooze"
    EDIT = "edit"
    PAUSE = "pause"


# When an action is sent, from its reminder's due, in seconds. The dispatcher claims at
# the due and finalizes about 0.1 s later on a development machine (measured: 40 to 50 %
# of the deletes and snoozes sent in DURING find the row sending); DURING is where a
# delete answers "in flight" and a snooze lands on a sending row.
BEFORE, DURING, AFTER = (-5.0, -0.3), (0.0, 0.25), (0.25, 6.0)
# Per action: its share of the reminders, and the weights of BEFORE, DURING and AFTER
# for its time, leaning toward what it must exercise. The rest are left alone.
ACTION_MIX: dict[Action, tuple[float, tuple[float, float, float]]] = {
    Action.DELETE: (0.30, (0.35, 0.45, 0.20)),  # quiet before, in flight, after a ring
    Action.SNOOZE: (0.20, (0.10, 0.80, 0.10)),  # mostly onto a sending row
    Action.EDIT: (0.20, (0.50, 0.20, 0.30)),  # the new text before the claim, the old after
    Action.PAUSE: (0.20, (0.60, 0.25, 0.15)),
}


class Case(enum.Enum):
    """An interleaving the checks must have seen at least MIN_CASES times."""

    QUIET_DELETE_BEFORE_DUE = "a delete answered 'not in flight' before the due"
    DELETE_IN_FLIGHT = "a delete answered 'in flight'"
    PAUSE_BEFORE_CLAIM = "a pause answered before the due"
    SNOOZE_WHILE_SENDING = "a snooze that landed on a sending row"
    RING_BEFORE_QUIET_DELETE = "a ring before a delete answered 'not in flight'"
    OLD_TEXT = "a ring pushed before an edit was sent"
    NEW_TEXT = "a ring claimed after an edit answered"


@dataclass
class Tracked:
    user: str
    reminder_id: str
    due: datetime  # the due it was created with
    dues: set[datetime]
    texts: dict[str, float] = field(default_factory=dict)  # text -> when it was answered
    edit_sent_at: float | None = None  # when the edit to "v2" was sent
    deleted_quietly_at: float | None = None  # a delete that answered "not in flight"
    deleted_in_flight: bool = False
    paused_at: float | None = None  # when the pause answered
    snoozed_to: datetime | None = None
    snoozed_while_sending: bool = False  # the snooze's answer showed the row sending
    refused: grpc.StatusCode | None = None

    @property
    def untouched(self) -> bool:
        """Neither deleted nor paused: it must ring once per due it held."""
        return (
            self.deleted_quietly_at is None
            and not self.deleted_in_flight
            and self.paused_at is None
        )


@dataclass(frozen=True)
class Draw:
    """One reminder's share of the seeded plan."""

    user: str
    due: datetime
    action: Action | None  # None: left alone
    offset: timedelta  # when the action is sent, from the due


@dataclass(frozen=True)
class Planned:
    at: datetime
    action: Action
    item: Tracked


@pytest.fixture
def stack(cassandra_settings: CassandraSettings, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with running_stack(cassandra_settings, "a", "b", request=request) as running:
        yield running


def _due_of(key: str) -> datetime:
    return datetime.strptime(key.split("/")[1], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _draw(rng: random.Random, user: str, minute: datetime) -> Draw:
    # The time engine keeps whole seconds.
    due = (minute + timedelta(seconds=rng.uniform(DUE_FROM_S, DUE_TO_S))).replace(microsecond=0)
    shares = [share for share, _ in ACTION_MIX.values()]
    action = rng.choices([*ACTION_MIX, None], [*shares, 1 - sum(shares)])[0]
    if action is None:
        return Draw(user, due, None, timedelta())
    low_s, high_s = rng.choices((BEFORE, DURING, AFTER), ACTION_MIX[action][1])[0]
    return Draw(user, due, action, timedelta(seconds=rng.uniform(low_s, high_s)))


def _act(stack: Stack, planned: Planned) -> None:
    """Send the planned action and record its answer on the reminder."""
    item, md = planned.item, stack.md(planned.item.user)
    try:
        if planned.action is Action.DELETE:
            deleted = stack.api.DeleteReminder(
                pb.DeleteReminderRequest(id=item.reminder_id), metadata=md
            )
            if deleted.was_sending:
                item.deleted_in_flight = True
            else:
                item.deleted_quietly_at = time.time()
        elif planned.action is Action.SNOOZE:
            snoozed = stack.api.SnoozeReminder(
                pb.SnoozeReminderRequest(id=item.reminder_id, duration=Duration(seconds=SNOOZE_S)),
                metadata=md,
            )
            item.snoozed_to = snoozed.snooze_until_time.ToDatetime(tzinfo=UTC)
            item.dues.add(item.snoozed_to)
            item.snoozed_while_sending = snoozed.state == pb.Reminder.STATE_SENDING
        elif planned.action is Action.EDIT:
            current = stack.api.GetReminder(pb.GetReminderRequest(id=item.reminder_id), metadata=md)
            item.edit_sent_at = time.time()
            stack.api.UpdateReminder(
                pb.UpdateReminderRequest(
                    reminder=pb.Reminder(id=item.reminder_id, version=current.version, text="v2"),
                    update_mask=FieldMask(paths=["text"]),
                ),
                metadata=md,
            )
            item.texts["v2"] = time.time()
        elif planned.action is Action.PAUSE:
            stack.api.PauseReminder(pb.PauseReminderRequest(id=item.reminder_id), metadata=md)
            item.paused_at = time.time()
    except grpc.RpcError as error:
        item.refused = error.code()


def _run_on_time(stack: Stack, plan: list[Planned]) -> None:
    """Each action submitted at its own time, so none waits behind another's sleep."""
    futures: list[Future[None]] = []
    with ThreadPoolExecutor(max_workers=32) as pool:
        for planned in sorted(plan, key=lambda p: p.at):
            time.sleep(max(0.0, (planned.at - datetime.now(UTC)).total_seconds()))
            futures.append(pool.submit(_act, stack, planned))
    for future in futures:
        future.result()


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
    rng = random.Random(SEED)
    started = datetime.now(UTC)
    minute = ceil_minute(started + CREATE_ROOM)
    # Everything random is drawn here, in order, before any thread runs: the seed
    # replays the plan (the interleavings the clock makes of it still vary).
    draws = [
        _draw(rng, f"race-{u}-{rng.randbytes(3).hex()}", minute)
        for u in range(USERS)
        for _ in range(PER_USER)
    ]

    def create(draw: Draw) -> Tracked:
        created = stack.create_at(draw.user, draw.due, text="v1")
        return Tracked(draw.user, created.id, draw.due, {draw.due}, {"v1": time.time()})

    with ThreadPoolExecutor(max_workers=16) as pool:
        tracked = list(pool.map(create, draws))
    plan = [
        Planned(item.due + draw.offset, draw.action, item)
        for item, draw in zip(tracked, draws, strict=True)
        if draw.action is not None
    ]
    created_in = datetime.now(UTC) - started
    too_slow = f"creating took {created_in}: too long for this machine"
    assert datetime.now(UTC) < min(p.at for p in plan), too_slow

    _run_on_time(stack, plan)
    refusals = [t.refused for t in tracked if t.refused is not None]
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

    occurred: Counter[Case] = Counter()  # so that no check below passes on nothing
    for item in tracked:
        rings = by_reminder.get(item.reminder_id, [])
        due_at = item.due.timestamp()
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
            assert all(at < item.paused_at for at in claims), "claimed after its pause"
            if item.paused_at < due_at:
                assert not rings, "rang after a pause that answered before its due"
                occurred[Case.PAUSE_BEFORE_CLAIM] += 1
        if item.deleted_quietly_at is not None:
            assert all(at < item.deleted_quietly_at for at in claims), (
                "claimed after a delete that answered 'not in flight'"
            )
            for _due, pushed, _body in rings:
                assert pushed.timestamp() < item.deleted_quietly_at, (
                    "rang after a delete that answered 'not in flight'"
                )
                occurred[Case.RING_BEFORE_QUIET_DELETE] += 1
            if item.deleted_quietly_at < due_at:
                assert not rings, "rang after a delete that answered before its due"
                occurred[Case.QUIET_DELETE_BEFORE_DUE] += 1
        if item.deleted_in_flight:
            assert len(rings) <= 1
            occurred[Case.DELETE_IN_FLIGHT] += 1
        if item.untouched:
            assert sorted(d for d, _, _ in rings) == sorted(item.dues), (
                f"{item.reminder_id}: rang {len(rings)} times for dues {sorted(item.dues)}"
            )
            assert history is not None
            assert len(history) == len(item.dues)
            if item.snoozed_while_sending:
                occurred[Case.SNOOZE_WHILE_SENDING] += 1
        # The text rung is the claimed version's. Pushed before the edit was sent: claimed
        # before it, so the old text. Claimed after the edit answered: the new text.
        if item.edit_sent_at is not None:
            for _due, pushed, body in rings:
                if pushed.timestamp() < item.edit_sent_at:
                    assert body == "v1", "a ring claimed before the edit carried the edit's text"
                    occurred[Case.OLD_TEXT] += 1
        if "v2" in item.texts:
            for due, _pushed, body in rings:
                claimed = [d for d in (history or []) if d.due_time.ToDatetime(tzinfo=UTC) == due]
                if (
                    claimed
                    and claimed[0].claim_time.ToDatetime(tzinfo=UTC).timestamp()
                    > (item.texts["v2"])
                ):
                    assert body == "v2", "the ring carried a text older than its claim"
                    occurred[Case.NEW_TEXT] += 1
    print(f"seed {SEED}: " + ", ".join(f"{case.name} {occurred[case]}" for case in Case))
    rare = {case.value: occurred[case] for case in Case if occurred[case] < MIN_CASES}
    assert not rare, f"interleavings seen under {MIN_CASES} times (seed {SEED}): {rare}"
