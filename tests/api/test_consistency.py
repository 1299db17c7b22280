"""Idempotent creates, version conflicts, races and LWTs of unknown outcome, on real Cassandra."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import grpc
import pytest
from cassandra import OperationTimedOut, WriteTimeout, WriteType
from cassandra.cluster import Session
from cassandra.connection import ConnectionShutdown
from cassandra.query import BatchStatement
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.api.auth import Authenticator
from reminders_svc.api.service import ApiServicers, RemindersServicer, build_servicers
from reminders_svc.api.settings import ApiSettings
from reminders_svc.app import RemindersApp
from reminders_svc.config import CassandraSettings, Retention
from reminders_svc.deliveries import DeliveryRecords
from reminders_svc.domain import dispatch
from reminders_svc.domain.errors import QuotaExceeded, VersionConflict
from reminders_svc.domain.limits import Limits
from reminders_svc.domain.reminder import Reminder, Status
from reminders_svc.schedule import parse_repeat
from reminders_svc.storage import aio
from reminders_svc.storage.errors import WriteOutcomeUnknown
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.reminders_store import CreateRecord, ReminderStore, StoredReminder
from reminders_svc.storage.rows import utc
from reminders_svc.storage.session import CassandraConnection
from tests.api.conftest import (
    SEED_NOW,
    Api,
    FakeClock,
    code_of,
    one_off,
    running_api,
    weekly_monday_nine,
)
from tests.grpc_errors import error_info_of
from tests.unknown_outcome import LandsLate, UnknownOutcome, cas_bound


def _request(request_id: str, text: str = "call mom") -> pb.CreateReminderRequest:
    return pb.CreateReminderRequest(
        reminder=pb.Reminder(text=text, schedule=weekly_monday_nine()), request_id=request_id
    )


_WEEKLY = parse_repeat("every Monday 09:00", "America/New_York", datetime(2026, 10, 19, 10))


def _recorded_by_an_earlier_attempt(
    connection: CassandraConnection, user: str, request_id: str, payload: bytes
) -> uuid.UUID:
    """A create record as an earlier attempt left it, with no row yet; its reminder id."""
    reminder_id = uuid.uuid4()
    connection.session.execute(
        "INSERT INTO create_requests (user_id, request_id, payload_hash, reminder_id)"
        " VALUES (%s, %s, %s, %s)",
        (user, request_id, hashlib.sha256(payload).digest(), reminder_id),
    )
    return reminder_id


def _rows(connection: CassandraConnection, user: str) -> list[Any]:
    rows = connection.session.execute(
        "SELECT reminder_id, status, version, active_count FROM reminders WHERE user_id = %s",
        (user,),
    )
    return [r for r in rows if r.status is not None]


def test_replaying_a_create_returns_the_same_reminder_and_writes_nothing_new(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    md = api.as_user(user)
    first = api.reminders.CreateReminder(_request("req-1"), metadata=md)
    again = api.reminders.CreateReminder(_request("req-1"), metadata=md)

    assert again == first
    assert len(_rows(cassandra, user)) == 1


def test_a_reused_request_id_with_another_payload_is_refused(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    md = api.as_user(user)
    api.reminders.CreateReminder(_request("req-1", "call mom"), metadata=md)
    with pytest.raises(grpc.RpcError) as refused:
        api.reminders.CreateReminder(_request("req-1", "call dad"), metadata=md)

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert len(_rows(cassandra, user)) == 1


def _respelled(schedule: pb.Schedule, how: str) -> pb.Schedule:
    """The same schedule as a client rebuilding its retry from an answer may spell it."""
    again = pb.Schedule()
    again.CopyFrom(schedule)
    if how == "seconds-added":
        again.once.local_time += ":00"
    elif how == "description-echoed":
        again.description = "Once, on 10 January 2027 at 10:00"
    elif how == "canonical-rrule-echoed":
        again.repeat.canonical_rrule = "FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0"
    elif how == "nanos-added":
        again.once.instant.nanos = 500_000_000
    return again


@pytest.mark.parametrize(
    ("schedule", "how"),
    [
        (one_off("2027-01-10T10:00"), "seconds-added"),
        (one_off("2027-01-10T10:00:00"), "description-echoed"),
        (weekly_monday_nine(), "canonical-rrule-echoed"),
        (
            pb.Schedule(time_zone="UTC", once=pb.OneOff(instant=Timestamp(seconds=1_800_000_000))),
            "nanos-added",
        ),
    ],
    ids=["seconds-added", "description-echoed", "canonical-rrule-echoed", "nanos-added"],
)
def test_a_replay_spelled_as_the_answer_spells_it_is_the_same_request(
    api: Api, user: str, cassandra: CassandraConnection, schedule: pb.Schedule, how: str
) -> None:
    """A retry rebuilt from the answer (a wall time with its seconds, an output-only field
    echoed, nanos a client's clock added) asks for the same thing: it gets the same
    reminder, where it was refused as a reused request_id."""
    md = api.as_user(user)
    first = api.reminders.CreateReminder(
        pb.CreateReminderRequest(reminder=pb.Reminder(text="t", schedule=schedule), request_id="r"),
        metadata=md,
    )
    retried = pb.Reminder(text="t", schedule=_respelled(schedule, how))
    again = api.reminders.CreateReminder(
        pb.CreateReminderRequest(reminder=retried, request_id="r"), metadata=md
    )

    assert again == first
    assert len(_rows(cassandra, user)) == 1


def test_a_replay_after_a_crash_between_record_and_row_completes_the_row(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    # The first attempt recorded the request, then died before writing the row.
    request = _request("crashed")
    payload = pb.Reminder(text=request.reminder.text, schedule=request.reminder.schedule)
    orphan_id = _recorded_by_an_earlier_attempt(
        cassandra, user, "crashed", payload.SerializeToString(deterministic=True)
    )

    replay = api.reminders.CreateReminder(request, metadata=api.as_user(user))

    assert replay.id == str(orphan_id)
    assert [r.reminder_id for r in _rows(cassandra, user)] == [orphan_id]


@pytest.fixture
def second_api(migrated_settings: CassandraSettings) -> Iterator[Api]:
    """Another server on the same keyspace: its calls race the first's only through LWTs
    (a server serializes one user's changes in-process, so one server alone never would)."""
    with running_api(migrated_settings, FakeClock(SEED_NOW)) as api:
        yield api


def _apis(api: Api, servers: int, request: Any) -> list[Api]:
    return [api] if servers == 1 else [api, request.getfixturevalue("second_api")]


@pytest.mark.parametrize("servers", [1, 2])
def test_concurrent_replays_of_one_request_create_one_reminder(
    api: Api, user: str, cassandra: CassandraConnection, servers: int, request: Any
) -> None:
    """16 replays on 8 threads, alternating between the servers: across two, they race
    for the request's record (its LWT), not for one server's lock on the user."""
    apis, md = _apis(api, servers, request), api.as_user(user)
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(
            pool.map(
                lambda i: apis[i % servers].reminders.CreateReminder(_request("same"), metadata=md),
                range(16),
            )
        )

    assert len({a.id for a in answers}) == 1
    rows = _rows(cassandra, user)
    assert len(rows) == 1
    assert rows[0].active_count == 1
    assert _create_records(cassandra, user) == {"same"}
    # No replay wrote a bucket entry for a reminder of its own: every one is the record's.
    assert _orphan_bucket_entries(cassandra, user) == []


@dataclass(frozen=True)
class _Answer:
    """What one task of a race asked for, and what it was answered."""

    task: int
    kind: str  # "edit" | "snooze" | "delete"
    code: grpc.StatusCode
    reminder: pb.Reminder | None  # the reminder as the accepted change left it (OK only)
    conflicts: int = 0  # an edit's attempts ABORTED for a version moved under it


# The one task of a race that deletes the reminder, when the race has a delete.
_DELETER = 10


def _snooze_for(task: int) -> timedelta:
    """How long task `task` of a race snoozes the reminder for."""
    return timedelta(minutes=task + 1)


def _snoozed_until(task: int) -> datetime:
    """Where task `task`'s snooze (a duration from the server's fixed clock) puts the ring."""
    return SEED_NOW + _snooze_for(task)


def _race(
    apis: list[Api], md: Any, reminder_id: str, *, delete: bool, edit_attempts: int = 1
) -> list[_Answer]:
    """20 tasks on 8 threads change one reminder at once: odd ones snooze it (no version
    needed), even ones read its version and edit its text with it, and with `delete` task
    10 deletes it instead. An edit ABORTED for a stale version reads the version again and
    retries, up to `edit_attempts` attempts in all. Calls alternate between the servers in
    `apis`."""

    def answer(
        task: int,
        kind: str,
        call: Callable[[], pb.Reminder | pb.DeleteReminderResponse],
        conflicts: int = 0,
    ) -> _Answer:
        try:
            answered = call()
        except grpc.RpcError as error:
            return _Answer(task, kind, error.code(), None, conflicts)
        if isinstance(answered, pb.DeleteReminderResponse):
            answered = answered.reminder
        return _Answer(task, kind, grpc.StatusCode.OK, answered, conflicts)

    def edit(api: Api, i: int) -> _Answer:
        for conflicts in range(edit_attempts):
            try:
                version = api.reminders.GetReminder(
                    pb.GetReminderRequest(id=reminder_id), metadata=md
                ).version
            except grpc.RpcError as error:
                return _Answer(i, "edit", error.code(), None, conflicts)
            update = pb.UpdateReminderRequest(
                reminder=pb.Reminder(id=reminder_id, version=version, text=f"t{i}"),
                update_mask=FieldMask(paths=["text"]),
            )
            edited = answer(
                i, "edit", partial(api.reminders.UpdateReminder, update, metadata=md), conflicts
            )
            if edited.code != grpc.StatusCode.ABORTED:
                return edited
        return edited

    def act(i: int) -> _Answer:
        api = apis[i % len(apis)]
        if delete and i == _DELETER:
            return answer(
                i,
                "delete",
                lambda: api.reminders.DeleteReminder(
                    pb.DeleteReminderRequest(id=reminder_id), metadata=md
                ),
            )
        if i % 2:
            return answer(
                i,
                "snooze",
                lambda: api.reminders.SnoozeReminder(
                    pb.SnoozeReminderRequest(
                        id=reminder_id,
                        duration=Duration(seconds=int(_snooze_for(i).total_seconds())),
                    ),
                    metadata=md,
                ),
            )
        return edit(api, i)

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(act, range(20)))


def _accepted_in_order(answers: list[_Answer]) -> list[_Answer]:
    """The accepted changes by the version each answer carries, checked to be 2, 3, ...:
    every accepted change bumped the version once, and no two answered the same version
    (one would be a lost update)."""
    accepted = [a for a in answers if a.code == grpc.StatusCode.OK]
    ordered = sorted(accepted, key=lambda a: a.reminder.version if a.reminder else 0)
    versions = [a.reminder.version for a in ordered if a.reminder is not None]
    assert versions == list(range(2, 2 + len(accepted))), answers
    return ordered


def _snooze_of(reminder: pb.Reminder) -> datetime | None:
    if not reminder.HasField("snooze_until_time"):
        return None
    return reminder.snooze_until_time.ToDatetime(tzinfo=UTC)


def _bucket_entries(connection: CassandraConnection, user: str) -> list[Any]:
    """Every bucket entry of `user`'s reminders, in any minute and part."""
    # Buckets are partitioned by minute: a scan, fine on the test keyspace.
    return list(
        connection.session.execute(
            "SELECT minute, part, reminder_id, due FROM due_buckets"
            " WHERE user_id = %s ALLOW FILTERING",
            (user,),
        )
    )


def _race_row(connection: CassandraConnection, user: str, reminder_id: str) -> Any:
    return connection.session.execute(
        "SELECT status, version, body, occurrence, snooze_until, due, claim_token,"
        " claim_due, active_count FROM reminders WHERE user_id = %s AND reminder_id = %s",
        (user, uuid.UUID(reminder_id)),
    ).one()


@pytest.mark.parametrize("servers", [1, 2])
def test_concurrent_edits_snoozes_and_a_delete_end_in_an_allowed_state(
    api: Api, user: str, cassandra: CassandraConnection, servers: int, request: Any
) -> None:
    md = api.as_user(user)
    created = api.reminders.CreateReminder(_request("race"), metadata=md)

    answers = _race(_apis(api, servers, request), md, created.id, delete=True)

    allowed = {grpc.StatusCode.OK, grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND}
    assert {a.code for a in answers} <= allowed, answers
    # The delete always lands: it needs no caller version. Nothing is accepted after it.
    accepted = _accepted_in_order(answers)
    assert accepted[-1].kind == "delete", accepted
    row = _race_row(cassandra, user, created.id)
    assert row.status == "deleted"
    assert row.due is None
    assert row.claim_token is None
    assert row.active_count == 0
    assert row.version == 1 + len(accepted)  # every accepted change bumped the version once


# Enough for every edit to land once the other tasks are done (each round of conflicts
# lets at least one change through).
_EDIT_ATTEMPTS = 50


@pytest.mark.parametrize("servers", [1, 2])
def test_concurrent_edits_and_snoozes_end_in_the_state_their_answers_describe(
    api: Api, user: str, cassandra: CassandraConnection, servers: int, request: Any
) -> None:
    md = api.as_user(user)
    created = api.reminders.CreateReminder(_request("race"), metadata=md)
    occurrence = created.next_occurrence_time.ToDatetime(tzinfo=UTC)

    answers = _race(
        _apis(api, servers, request), md, created.id, delete=False, edit_attempts=_EDIT_ATTEMPTS
    )

    # A snooze needs no version: it lands. An edit is ABORTED while others move the
    # version it read, and lands once it reads the version that stands.
    assert all(a.code == grpc.StatusCode.OK for a in answers), answers
    # Replaying the accepted changes in version order gives every answer: an edit keeps
    # the snooze before it, a snooze keeps the text before it, neither moves the series.
    text, snooze_until = "call mom", None
    accepted = _accepted_in_order(answers)
    for change in accepted:
        if change.kind == "edit":
            text = f"t{change.task}"
        else:
            snooze_until = _snoozed_until(change.task)
        reminder = change.reminder
        assert reminder is not None
        assert reminder.text == text, change
        assert _snooze_of(reminder) == snooze_until, change
        assert reminder.next_occurrence_time.ToDatetime(tzinfo=UTC) == occurrence, change
        assert reminder.state == pb.Reminder.STATE_PENDING, change
    assert snooze_until is not None
    last = accepted[-1].reminder
    assert last is not None

    # The row is the state the last accepted change answered, and one the state machine
    # allows: pending, its series untouched, due at the earlier of occurrence and snooze,
    # no claim, counted once. No ABORTED attempt wrote anything: 20 changes, 20 versions.
    row = _race_row(cassandra, user, created.id)
    assert row.status == "pending"
    assert row.version == last.version == 1 + len(answers)
    assert row.body == text
    assert utc(row.snooze_until) == snooze_until
    assert utc(row.occurrence) == occurrence
    assert utc(row.due) == min(occurrence, snooze_until)
    assert (row.claim_token, row.claim_due) == (None, None)
    assert row.active_count == 1
    # Bucket first, row second: an entry points at the row's due (invariant 2).
    dues = {
        utc(entry.due)
        for entry in _bucket_entries(cassandra, user)
        if entry.reminder_id == uuid.UUID(created.id)
    }
    assert utc(row.due) in dues
    # And the API reads back the reminder the last accepted change answered.
    assert api.reminders.GetReminder(pb.GetReminderRequest(id=created.id), metadata=md) == last


def _is_row_lwt(statement: Any) -> bool:
    """A conditional write of a reminder row: an LWT update, or the create's batch."""
    if isinstance(statement, BatchStatement):
        return True
    query = str(getattr(statement, "query_string", statement))
    return "UPDATE reminders" in query and " IF " in query


UNKNOWN_OUTCOMES = pytest.mark.parametrize(
    "error",
    [WriteTimeout("injected", write_type=WriteType.CAS), ConnectionShutdown("injected")],
    ids=["timeout", "connection-broke"],
)


@pytest.fixture
def app_factory(cassandra: CassandraConnection) -> Iterator[Any]:
    def make(injector: UnknownOutcome) -> RemindersApp:
        store = ReminderStore(cassandra.session, Retention(), executor=injector)
        return RemindersApp(store, Limits(), FakeClock(SEED_NOW))

    # An injected outcome lands at once or never: a settling read after a broken
    # connection need not wait out the development node's generous bound (15 s).
    with cas_bound(cassandra.session, 1.0):
        yield make


@UNKNOWN_OUTCOMES
@pytest.mark.parametrize("apply_first", [True, False], ids=["landed", "lost"])
def test_an_lwt_timeout_is_settled_by_a_serial_read(
    app_factory: Any, cassandra: CassandraConnection, user: str, apply_first: bool, error: Exception
) -> None:
    honest = RemindersApp(
        ReminderStore(cassandra.session, Retention()), Limits(), FakeClock(SEED_NOW)
    )
    created = asyncio.run(honest.create(user, "r", "call mom", _WEEKLY, b"p"))

    injector = UnknownOutcome(lands=apply_first, error=error, targets=_is_row_lwt)
    app = app_factory(injector)
    paused = asyncio.run(app.pause(user, created.reminder_id, None)).reminder

    assert injector.injected == 1
    assert paused.status is Status.PAUSED
    row = cassandra.session.execute(
        "SELECT status, version FROM reminders WHERE user_id = %s AND reminder_id = %s",
        (user, created.reminder_id),
    ).one()
    # Landed: settled as applied, not applied twice. Lost: re-read and applied once.
    assert (row.status, row.version) == ("paused", 2)


def test_an_edit_whose_connection_broke_is_settled_once_its_coordinator_is_done(
    cassandra: CassandraConnection, user: str
) -> None:
    """A connection broken under an edit: its coordinator may still be in its contention
    loop, and its retry land after a settling read that said "not applied". The app would
    then retry the edit, lose to its own change, and answer ABORTED for an edit that
    landed. The read waits out the cluster's CAS bound (here 1.5 s; the change lands 0.5 s
    after the break, or as the app's retry arrives, whichever is first)."""
    session = cassandra.session
    honest = RemindersApp(ReminderStore(session, Retention()), Limits(), FakeClock(SEED_NOW))
    created = asyncio.run(honest.create(user, "r", "call mom", _WEEKLY, b"p"))
    late = LandsLate(error=ConnectionShutdown("injected"), after_s=0.5, targets=_is_row_lwt)
    app = RemindersApp(
        ReminderStore(session, Retention(), executor=late), Limits(), FakeClock(SEED_NOW)
    )

    async def edit() -> Reminder:
        edited = (await app.update(user, created.reminder_id, 1, "call dad", None)).reminder
        await late.landed()
        return edited

    with cas_bound(session, 1.5):
        edited = asyncio.run(edit())

    assert (edited.text, edited.version) == ("call dad", 2)
    row = session.execute(
        "SELECT body, version FROM reminders WHERE user_id = %s AND reminder_id = %s",
        (user, created.reminder_id),
    ).one()
    assert (row.body, row.version) == ("call dad", 2)


def test_an_edit_of_unknown_outcome_is_applied_though_a_claim_landed_after_it(
    app_factory: Any, cassandra: CassandraConnection, user: str
) -> None:
    honest_store = ReminderStore(cassandra.session, Retention())
    honest = RemindersApp(honest_store, Limits(), FakeClock(SEED_NOW))
    created = asyncio.run(honest.create(user, "r", "call mom", _WEEKLY, b"p"))

    async def a_dispatcher_claims_it() -> None:  # as at its due, before the settling read
        stored = await honest_store.get_serial(user, created.reminder_id)
        assert stored is not None
        assert stored.reminder.due is not None
        at = stored.reminder.due
        claim = dispatch.claimed(stored.reminder, uuid.uuid4(), at, timedelta(seconds=30))
        assert await honest_store.replace(stored, claim, at)

    injector = UnknownOutcome(lands=True, targets=_is_row_lwt, then=a_dispatcher_claims_it)
    app = app_factory(injector)

    edited = asyncio.run(app.update(user, created.reminder_id, 1, "call dad", None)).reminder

    assert injector.injected == 1
    # The edit landed: answered as applied, not ABORTED for a version its own write moved.
    assert (edited.text, edited.version) == ("call dad", 2)
    row = cassandra.session.execute(
        "SELECT body, version, status FROM reminders WHERE user_id = %s AND reminder_id = %s",
        (user, created.reminder_id),
    ).one()
    assert (row.body, row.version, row.status) == ("call dad", 2, "sending")


def test_a_resume_of_unknown_outcome_hidden_by_a_later_pause_is_not_applied_again(
    app_factory: Any, cassandra: CassandraConnection, user: str
) -> None:
    """The resume landed, unheard; another replica's pause came after it. The row cannot
    say whether the resume landed (its op id is gone): re-applying it would undo the
    later pause, so the caller hears "may have been applied", and the pause stands."""
    honest = RemindersApp(
        ReminderStore(cassandra.session, Retention()), Limits(), FakeClock(SEED_NOW)
    )
    created = asyncio.run(honest.create(user, "r", "call mom", _WEEKLY, b"p"))
    asyncio.run(honest.pause(user, created.reminder_id, None))

    async def paused_again_elsewhere() -> None:
        await honest.pause(user, created.reminder_id, None)

    injector = UnknownOutcome(lands=True, targets=_is_row_lwt, then=paused_again_elsewhere)
    with pytest.raises(WriteOutcomeUnknown):
        asyncio.run(app_factory(injector).resume(user, created.reminder_id, None))

    assert injector.injected == 1
    row = cassandra.session.execute(
        "SELECT status, version FROM reminders WHERE user_id = %s AND reminder_id = %s",
        (user, created.reminder_id),
    ).one()
    assert (row.status, row.version) == ("paused", 4)  # created, paused, resumed, paused


def test_a_resume_of_unknown_outcome_that_lost_to_another_change_is_applied_after_it(
    app_factory: Any, cassandra: CassandraConnection, user: str
) -> None:
    """The resume did not land: another replica's edit won the same compare. The row says
    so (the edit's op id at the version the resume would have written), so the resume is
    applied on top of the edit, once."""
    honest = RemindersApp(
        ReminderStore(cassandra.session, Retention()), Limits(), FakeClock(SEED_NOW)
    )
    created = asyncio.run(honest.create(user, "r", "call mom", _WEEKLY, b"p"))
    asyncio.run(honest.pause(user, created.reminder_id, None))

    async def edited_elsewhere() -> None:
        await honest.update(user, created.reminder_id, 2, "call dad", None)

    injector = UnknownOutcome(lands=False, targets=_is_row_lwt, then=edited_elsewhere)
    resumed = asyncio.run(app_factory(injector).resume(user, created.reminder_id, None)).reminder

    assert injector.injected == 1
    assert (resumed.status, resumed.text, resumed.version) == (Status.PENDING, "call dad", 4)


class _RenewedBeforeTheWrite(ReminderStore):
    """The dispatcher renews its claim (before another hand-off attempt) between a user
    change's read of the row and its write."""

    def __init__(self, session: Session, renewed_until: datetime) -> None:
        super().__init__(session, Retention())
        self._renewed_until = renewed_until
        self.renewed = False

    async def replace(self, before: StoredReminder, after: Reminder, now: datetime) -> bool:
        claim = before.reminder.claim
        if not self.renewed and claim is not None and after.claim is None:
            self.renewed = True
            row = before.reminder
            renew = self.set_claim_expiry(
                row.user_id, row.reminder_id, claim.token, self._renewed_until
            )
            assert await renew
        return await super().replace(before, after, now)


def test_a_pause_racing_a_claim_renewal_keeps_the_renewed_expiry_for_a_later_delete(
    cassandra: CassandraConnection, user: str
) -> None:
    """The claim was renewed (another hand-off attempt under way) after the pause read it:
    the pause must not keep the older expiry, or a delete between the two would answer
    that no ring is in flight while one is."""
    clock = FakeClock(SEED_NOW)
    honest_store = ReminderStore(cassandra.session, Retention())
    created = asyncio.run(
        RemindersApp(honest_store, Limits(), clock).create(user, "r", "call mom", _WEEKLY, b"p")
    )

    async def claim_it() -> None:
        stored = await honest_store.get_serial(user, created.reminder_id)
        assert stored is not None
        lease = timedelta(seconds=30)
        assert await honest_store.replace(
            stored, dispatch.claimed(stored.reminder, uuid.uuid4(), SEED_NOW, lease), SEED_NOW
        )

    asyncio.run(claim_it())
    store = _RenewedBeforeTheWrite(cassandra.session, SEED_NOW + timedelta(seconds=60))
    app = RemindersApp(store, Limits(), clock)
    asyncio.run(app.pause(user, created.reminder_id, None))
    clock.advance(timedelta(seconds=45))  # past the first expiry, before the renewed one
    deleted = asyncio.run(app.delete(user, created.reminder_id, None))

    assert store.renewed
    assert deleted.was_sending


@UNKNOWN_OUTCOMES
@pytest.mark.parametrize("apply_first", [True, False], ids=["landed", "lost"])
def test_a_create_whose_lwt_timed_out_is_settled_and_written_once(
    app_factory: Any, cassandra: CassandraConnection, user: str, apply_first: bool, error: Exception
) -> None:
    injector = UnknownOutcome(lands=apply_first, error=error, targets=_is_row_lwt)

    created = asyncio.run(app_factory(injector).create(user, "r", "call mom", _WEEKLY, b"p"))

    assert injector.injected == 1
    rows = _rows(cassandra, user)
    assert [r.reminder_id for r in rows] == [created.reminder_id]
    assert (rows[0].status, rows[0].version, rows[0].active_count) == ("pending", 1, 1)


def test_a_replay_answers_with_its_reminder_after_the_reminder_s_time_has_passed(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    md = api.as_user(user)
    request = pb.CreateReminderRequest(
        reminder=pb.Reminder(text="call mom", schedule=one_off("2026-10-19T09:00:00")),
        request_id="soon",
    )
    first = api.reminders.CreateReminder(request, metadata=md)
    api.clock.advance(timedelta(days=1))  # its time (13:00Z) has passed: a new create would fail

    again = api.reminders.CreateReminder(request, metadata=md)

    assert again == first
    assert len(_rows(cassandra, user)) == 1


def test_a_replay_of_a_repeat_without_a_start_answers_with_its_reminder_once_its_end_passed(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    """A repeat without a start begins when it is created, so the replay's own parse (from
    the replay's now) finds the end before the start: still the original's answer."""
    md = api.as_user(user)
    schedule = pb.Schedule(
        time_zone="America/New_York",
        repeat=pb.Repeat(expression="every day 18:00 until 2026-10-19"),
    )
    request = pb.CreateReminderRequest(
        reminder=pb.Reminder(text="call mom", schedule=schedule), request_id="until-today"
    )
    first = api.reminders.CreateReminder(request, metadata=md)
    api.clock.advance(timedelta(days=1))

    again = api.reminders.CreateReminder(request, metadata=md)

    assert again == first
    assert len(_rows(cassandra, user)) == 1
    # Not a way around validation: another payload under that request_id is refused for
    # its schedule (wrong whatever the request_id found), and writes nothing.
    request.reminder.text = "call dad"
    with pytest.raises(grpc.RpcError) as refused:
        api.reminders.CreateReminder(request, metadata=md)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "before the start" in (refused.value.details() or "")
    assert len(_rows(cassandra, user)) == 1


class _OriginalLandsWhileTheReplayLooks(ReminderStore):
    """The first time a replay finds no row behind the record, the original request's row
    lands right after (its create was still running), taking the user's last slot."""

    def __init__(self, session: Session, original: RemindersApp, create: Any) -> None:
        super().__init__(session, Retention())
        self._original = original
        self._create_original = create
        self.landed = False

    async def get_serial(self, user_id: str, reminder_id: uuid.UUID) -> Any:
        found = await super().get_serial(user_id, reminder_id)
        if found is None and not self.landed:
            self.landed = True
            await self._create_original(self._original)
        return found


def test_a_replay_racing_its_original_to_the_last_slot_answers_with_the_original(
    cassandra: CassandraConnection, user: str
) -> None:
    one_slot = Limits(max_active_per_user=1)
    # The original recorded its request, then was slow to write its row.
    original_id = _recorded_by_an_earlier_attempt(cassandra, user, "r", b"p")
    honest = RemindersApp(
        ReminderStore(cassandra.session, Retention()), one_slot, FakeClock(SEED_NOW)
    )
    racing = _OriginalLandsWhileTheReplayLooks(
        cassandra.session, honest, lambda app: app.create(user, "r", "call mom", _WEEKLY, b"p")
    )
    replay = RemindersApp(racing, one_slot, FakeClock(SEED_NOW))

    answer = asyncio.run(replay.create(user, "r", "call mom", _WEEKLY, b"p"))

    assert racing.landed
    assert answer.reminder_id == original_id
    assert [r.reminder_id for r in _rows(cassandra, user)] == [original_id]
    assert _create_records(cassandra, user) == {"r"}  # the original's record stands


def _one_slot_app(store: ReminderStore) -> RemindersApp:
    return RemindersApp(store, Limits(max_active_per_user=1), FakeClock(SEED_NOW))


def _create(app: RemindersApp, user: str, request_id: str) -> Coroutine[Any, Any, Reminder]:
    return app.create(user, request_id, "call mom", _WEEKLY, request_id.encode())


def _active_rows(connection: CassandraConnection, user: str) -> list[uuid.UUID]:
    return [r.reminder_id for r in _rows(connection, user) if r.status != Status.DELETED.value]


class _CountReadLagsOnce(ReminderStore):
    """While `count_lags`: the next plain read of the active count lags once (room, it
    says), so a create at the cap records its request before the cap refuses it."""

    count_lags = False

    async def active_count(self, user_id: str, *, serial: bool = False) -> int | None:
        if self.count_lags and not serial:
            self.count_lags = False
            return 0
        return await super().active_count(user_id, serial=serial)


class _ReplayedWhileRefused(_CountReadLagsOnce):
    """The original create, its first count read lagging (room, it says), records its
    request and is refused at the cap; about to take its record back, just then the user
    deletes a reminder and a replay of the create on another server finds the record, no
    row behind it, and makes the row in the slot freed."""

    def __init__(self, session: Session, other_server: RemindersApp, freed: uuid.UUID) -> None:
        super().__init__(session, Retention())
        self._other_server = other_server
        self._freed = freed
        self.replayed: Reminder | None = None
        self.count_lags = True

    async def forget_create_request(self, user_id: str, request_id: str, record: Any) -> None:
        await self._other_server.delete(user_id, self._freed, None)
        self.replayed = await _create(self._other_server, user_id, request_id)
        await super().forget_create_request(user_id, request_id, record)


def test_a_create_refused_at_the_cap_keeps_its_record_for_the_row_its_replay_made(
    cassandra: CassandraConnection, user: str
) -> None:
    other_server = _one_slot_app(ReminderStore(cassandra.session, Retention()))
    occupying = asyncio.run(_create(other_server, user, "older"))
    racing = _ReplayedWhileRefused(cassandra.session, other_server, occupying.reminder_id)

    with pytest.raises(QuotaExceeded):
        asyncio.run(_create(_one_slot_app(racing), user, "r"))

    assert racing.replayed is not None
    assert _active_rows(cassandra, user) == [racing.replayed.reminder_id]
    # The record still leads a third attempt to the replay's reminder, not to a second one
    # (or, with the user now at the cap, to a refusal of a request that made a reminder).
    third = asyncio.run(_create(other_server, user, "r"))
    assert third.reminder_id == racing.replayed.reminder_id
    assert _active_rows(cassandra, user) == [racing.replayed.reminder_id]


class _TakingBackTimesOut(ReminderStore):
    async def forget_create_request(self, user_id: str, request_id: str, record: Any) -> None:
        raise OperationTimedOut("injected")


def test_a_create_refused_at_the_cap_is_answered_so_though_taking_its_record_back_fails(
    cassandra: CassandraConnection, user: str
) -> None:
    """The take-back's timeout replaced the refusal: "unavailable; retry" for a request
    no retry can make succeed."""
    other_server = _one_slot_app(ReminderStore(cassandra.session, Retention()))
    occupying = asyncio.run(_create(other_server, user, "older"))

    refusing = _one_slot_app(_TakingBackTimesOut(cassandra.session, Retention()))
    with pytest.raises(QuotaExceeded):
        asyncio.run(_create(refusing, user, "r"))

    assert _active_rows(cassandra, user) == [occupying.reminder_id]


class _TakingBackOutlastsTheDeadline(_CountReadLagsOnce):
    """Taking a refused create's record back takes `deadline`, so the call's write
    deadline, begun before, fires meanwhile."""

    def __init__(self, session: Session, deadline: timedelta) -> None:
        super().__init__(session, Retention())
        self._deadline = deadline

    async def forget_create_request(self, user_id: str, request_id: str, record: Any) -> None:
        await asyncio.sleep(self._deadline.total_seconds())
        await super().forget_create_request(user_id, request_id, record)


def test_a_create_refused_at_the_cap_is_answered_so_though_the_deadline_fires_meanwhile(
    migrated_settings: CassandraSettings, cassandra: CassandraConnection, user: str
) -> None:
    """The write deadline cancelled the take-back of a refused create's record: answered
    DEADLINE_EXCEEDED, "may have been applied", for a create that made nothing, and the
    record stood, so the request_id was refused as reused for another reminder."""
    stores: list[_TakingBackOutlastsTheDeadline] = []

    def build(
        connection: CassandraConnection, auth: Authenticator, api: ApiSettings, clock: FakeClock
    ) -> ApiServicers:
        short = dataclasses.replace(api, write_deadline=timedelta(seconds=2))
        stores.append(_TakingBackOutlastsTheDeadline(connection.session, short.write_deadline))
        app = RemindersApp(stores[-1], api.limits, clock, api.still_pushed_for)
        history = DeliveryHistory(connection.session, api.retention.history)
        reminders = RemindersServicer(app, DeliveryRecords(app, history), auth, short, clock)
        return dataclasses.replace(
            build_servicers(connection, auth, api, clock), reminders=reminders
        )

    one_slot = Limits(max_active_per_user=1)
    with running_api(migrated_settings, FakeClock(SEED_NOW), one_slot, build=build) as api:
        md = api.as_user(user)
        older = api.reminders.CreateReminder(_request("older"), metadata=md)
        stores[0].count_lags = True

        refusal = error_info_of(lambda: api.reminders.CreateReminder(_request("r"), metadata=md))

        assert refusal.reason == "ACTIVE_REMINDERS_CAP"
        assert _create_records(cassandra, user) == {"older"}  # taken back
        api.reminders.DeleteReminder(pb.DeleteReminderRequest(id=older.id), metadata=md)
        made = api.reminders.CreateReminder(_request("r", "call dad"), metadata=md)
        assert made.text == "call dad"  # the request_id was free for another reminder


def test_a_create_refused_at_the_cap_writes_nothing(
    cassandra: CassandraConnection, user: str
) -> None:
    """Its record was written and then taken back: two Paxos rounds and a tombstone in
    the user's records for every refusal, piling up under a client retrying at the cap."""
    asyncio.run(_create(_one_slot_app(ReminderStore(cassandra.session, Retention())), user, "a"))
    written: list[str] = []

    async def recording(session: Session, statement: Any, params: Any) -> Any:
        query = str(getattr(statement, "query_string", statement))
        if not query.lstrip().upper().startswith("SELECT"):
            written.append(query)
        return await aio.execute(session, statement, params)

    refusing = _one_slot_app(ReminderStore(cassandra.session, Retention(), executor=recording))
    with pytest.raises(QuotaExceeded):
        asyncio.run(_create(refusing, user, "b"))

    assert written == []


class _RefusedWhileTheReplayLooks(ReminderStore):
    """A replay finds the original's record and no row behind it; just then the original,
    refused at the cap, takes its record back, and the user deletes a reminder."""

    def __init__(self, session: Session, other_server: RemindersApp, freed: uuid.UUID) -> None:
        super().__init__(session, Retention())
        self._other_server = other_server
        self._freed = freed
        self.refused: CreateRecord | None = None

    async def get_serial(self, user_id: str, reminder_id: uuid.UUID) -> Any:
        found = await super().get_serial(user_id, reminder_id)
        if found is None and self.refused is None:
            self.refused = refused = await super().create_record(user_id, "r")
            assert refused is not None
            await super().forget_create_request(user_id, "r", refused)
            await self._other_server.delete(user_id, self._freed, None)
        return found


def test_a_replay_whose_original_took_its_record_back_is_made_as_a_new_request(
    cassandra: CassandraConnection, user: str
) -> None:
    other_server = _one_slot_app(ReminderStore(cassandra.session, Retention()))
    occupying = asyncio.run(_create(other_server, user, "older"))
    # The original recorded its request (and is about to be refused at the cap).
    original_id = _recorded_by_an_earlier_attempt(cassandra, user, "r", b"r")
    racing = _RefusedWhileTheReplayLooks(cassandra.session, other_server, occupying.reminder_id)

    answer = asyncio.run(_create(_one_slot_app(racing), user, "r"))

    assert racing.refused is not None
    assert racing.refused.reminder_id == original_id
    assert answer.reminder_id != original_id  # the refused original's id was never used
    assert _active_rows(cassandra, user) == [answer.reminder_id]
    third = asyncio.run(_create(other_server, user, "r"))
    assert third.reminder_id == answer.reminder_id


def _create_records(connection: CassandraConnection, user: str) -> set[str]:
    rows = connection.session.execute(
        "SELECT request_id FROM create_requests WHERE user_id = %s", (user,)
    )
    return {r.request_id for r in rows}


def _orphan_bucket_entries(connection: CassandraConnection, user: str) -> list[Any]:
    """The user's bucket entries pointing at a reminder id that has no row (a deleted
    reminder's tombstone row counts as a row)."""
    rows = {r.reminder_id for r in _rows(connection, user)}
    return [entry for entry in _bucket_entries(connection, user) if entry.reminder_id not in rows]


@pytest.mark.parametrize("servers", [1, 2])
def test_the_per_user_cap_holds_under_concurrent_creates(
    migrated_settings: CassandraSettings, cassandra: CassandraConnection, user: str, servers: int
) -> None:
    with contextlib.ExitStack() as servers_running:
        apis = [
            servers_running.enter_context(
                running_api(migrated_settings, FakeClock(SEED_NOW), Limits(max_active_per_user=3))
            )
            for _ in range(servers)
        ]
        api = apis[0]
        md = api.as_user(user)
        with ThreadPoolExecutor(max_workers=6) as pool:
            codes = list(
                pool.map(
                    lambda i: code_of(
                        lambda: apis[i % servers].reminders.CreateReminder(
                            _request(f"cap-{i}"), metadata=md
                        )
                    ),
                    range(6),
                )
            )
        assert codes.count(grpc.StatusCode.OK) == 3
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 3
        rows = _rows(cassandra, user)
        assert len(rows) == 3
        # A refused create leaves no record: its request_id is free for another reminder.
        accepted = {f"cap-{i}" for i, code in enumerate(codes) if code == grpc.StatusCode.OK}
        assert _create_records(cassandra, user) == accepted
        if servers == 1:
            # One server runs a user's creates one at a time, so each refused create read
            # the full count and wrote no bucket entry either. (Across servers, one that
            # loses the last slot after its count read leaves its entry behind, pointing
            # at no row: docs/architecture.md, "Limits known and left".)
            assert _orphan_bucket_entries(cassandra, user) == []
        refused = next(f"cap-{i}" for i in range(6) if f"cap-{i}" not in accepted)

        # The refusal names the quota used up (google.rpc.QuotaFailure, AIP-193).
        with pytest.raises(grpc.RpcError) as at_cap:
            api.reminders.CreateReminder(_request(refused), metadata=md)
        status = rpc_status.from_call(at_cap.value)
        assert status is not None
        info, failure = error_details_pb2.ErrorInfo(), error_details_pb2.QuotaFailure()
        assert status.details[0].Unpack(info)
        assert info.reason == "ACTIVE_REMINDERS_CAP"
        assert status.details[1].Unpack(failure)
        assert [(v.subject, v.description) for v in failure.violations] == [
            ("user", "at most 3 active reminders per user")
        ]

        api.reminders.DeleteReminder(
            pb.DeleteReminderRequest(id=str(rows[0].reminder_id)), metadata=md
        )
        reused = api.reminders.CreateReminder(_request(refused, "call dad"), metadata=md)
        assert reused.text == "call dad"


class _LastSlotTakenAfterTheCountRead(ReminderStore):
    """The race for the last slot, made deterministic: right after this store's first
    create has read the user's count (a slot free), before it writes anything, another API
    server's create (`take_last_slot`) takes that slot."""

    def __init__(self, session: Session, take_last_slot: Callable[[], Awaitable[Any]]) -> None:
        super().__init__(session, Retention())
        self._take_last_slot = take_last_slot
        self.proposed: list[uuid.UUID] = []  # the ids this store's creates tried

    async def create(self, reminder: Reminder, active_count: int | None, max_active: int) -> bool:
        self.proposed.append(reminder.reminder_id)
        if len(self.proposed) == 1:
            assert (active_count or 0) < max_active  # it read a free slot
            await self._take_last_slot()
        return await super().create(reminder, active_count, max_active)


def _lose_the_last_slot(
    connection: CassandraConnection, user: str
) -> _LastSlotTakenAfterTheCountRead:
    """Two API servers' creates race for a user's only slot; the one through the returned
    store reads the count first and loses. Returns that store, once its create is refused."""
    one_slot = Limits(max_active_per_user=1)
    other = RemindersApp(
        ReminderStore(connection.session, Retention()), one_slot, FakeClock(SEED_NOW)
    )
    store = _LastSlotTakenAfterTheCountRead(
        connection.session, lambda: other.create(user, "other", "call dad", _WEEKLY, b"other")
    )
    losing = RemindersApp(store, one_slot, FakeClock(SEED_NOW))
    with pytest.raises(QuotaExceeded):
        asyncio.run(losing.create(user, "mine", "call mom", _WEEKLY, b"mine"))
    return store


def test_a_create_that_loses_the_last_slot_is_refused_and_leaves_no_record(
    cassandra: CassandraConnection, user: str
) -> None:
    store = _lose_the_last_slot(cassandra, user)

    assert store.proposed  # it tried, and lost the slot it had read free
    rows = _rows(cassandra, user)
    assert len(rows) == 1
    assert rows[0].reminder_id not in store.proposed  # the other server's reminder
    assert rows[0].active_count == 1
    assert _create_records(cassandra, user) == {"other"}


class _LaggingReplicas(ReminderStore):
    """Plain reads answered from what another data centre's replicas held a moment ago
    (`lagging`: id -> that row, None for not there yet); reads through Paxos (SERIAL) see
    every committed change, as they do across data centres."""

    def __init__(self, session: Session) -> None:
        super().__init__(session, Retention())
        self.lagging: dict[uuid.UUID, StoredReminder | None] = {}

        # user id -> the active count a plain read still answers
        self.lagging_counts: dict[str, int | None] = {}

    async def get(self, user_id: str, reminder_id: uuid.UUID) -> StoredReminder | None:
        if reminder_id in self.lagging:
            return self.lagging[reminder_id]
        return await super().get(user_id, reminder_id)

    async def active_count(self, user_id: str, *, serial: bool = False) -> int | None:
        if not serial and user_id in self.lagging_counts:
            return self.lagging_counts[user_id]
        return await super().active_count(user_id, serial=serial)


def test_a_read_that_lags_another_data_centres_change_answers_from_paxos(
    cassandra: CassandraConnection, user: str
) -> None:
    """A reminder just made, or a version just returned, through an API server in one data
    centre is found, and accepted, by one in another whose plain read still lags: never
    NOT_FOUND for what exists, nor ABORTED for the version the caller was just given."""
    store = _LaggingReplicas(cassandra.session)
    app = RemindersApp(store, Limits(), FakeClock(SEED_NOW))

    async def scenario() -> None:
        made = await app.create(user, "lag", "call mom", _WEEKLY, b"lag")
        store.lagging[made.reminder_id] = None  # not replicated here yet
        assert (await app.get(user, made.reminder_id)).text == "call mom"

        first = await store.get_serial(user, made.reminder_id)
        edited = (await app.update(user, made.reminder_id, made.version, "call dad", None)).reminder
        store.lagging[made.reminder_id] = first  # still at the version before the edit
        again = (
            await app.update(user, made.reminder_id, edited.version, "call mum", None)
        ).reminder
        assert (again.text, again.version) == ("call mum", edited.version + 1)

        # A caller that is itself behind is refused with the version that is current.
        with pytest.raises(VersionConflict, match=f"at version {again.version}$"):
            await app.update(user, made.reminder_id, made.version, "call gran", None)

    asyncio.run(scenario())
    [row] = _rows(cassandra, user)
    assert row.version == 3


def test_a_create_whose_count_read_lags_another_data_centre_is_made_from_paxos(
    cassandra: CassandraConnection, user: str
) -> None:
    """The user's count moved in another data centre (a create there) and this one's
    plain read still answers the old count: the create's compare loses once, then reads
    the count through Paxos and is made, instead of losing every retry (CONTENTION)."""
    store = _LaggingReplicas(cassandra.session)
    app = RemindersApp(store, Limits(), FakeClock(SEED_NOW))

    async def scenario() -> Reminder:
        await app.create(user, "elsewhere", "call mom", _WEEKLY, b"elsewhere")
        store.lagging_counts[user] = None  # the first create not replicated here yet
        return await app.create(user, "here", "call dad", _WEEKLY, b"here")

    made = asyncio.run(scenario())
    assert made.text == "call dad"
    assert len(_rows(cassandra, user)) == 2


class _LaggingCountReplica(ReminderStore):
    """A plain read of the user's count answers one more than it is (a replica that has
    not seen a delete yet); a read through Paxos answers the truth."""

    async def active_count(self, user_id: str, *, serial: bool = False) -> int | None:
        count = await super().active_count(user_id, serial=serial)
        return count if serial or count is None else count + 1


def test_a_create_is_not_refused_at_the_cap_on_a_lagging_replicas_count(
    cassandra: CassandraConnection, user: str
) -> None:
    """The cap refused at once on a plain read of the count: a user one below it, whose
    last delete a replica had not seen yet, was told RESOURCE_EXHAUSTED for nothing."""
    app = RemindersApp(
        _LaggingCountReplica(cassandra.session, Retention()),
        Limits(max_active_per_user=2),
        FakeClock(SEED_NOW),
    )
    asyncio.run(_create(app, user, "first"))

    second = asyncio.run(_create(app, user, "second"))

    assert second.reminder_id in _active_rows(cassandra, user)
    assert len(_active_rows(cassandra, user)) == 2
    with pytest.raises(QuotaExceeded):  # at the cap now, read through Paxos too
        asyncio.run(_create(app, user, "third"))
