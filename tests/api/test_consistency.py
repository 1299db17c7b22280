"""Idempotent creates, version conflicts, races and LWTs of unknown outcome, on real Cassandra."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import grpc
import pytest
from cassandra import WriteTimeout, WriteType
from cassandra.cluster import Session
from cassandra.connection import ConnectionShutdown
from cassandra.query import BatchStatement
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.api.settings import Limits
from reminders_svc.app import RemindersApp
from reminders_svc.config import CassandraSettings, Retention
from reminders_svc.domain import dispatch
from reminders_svc.domain.reminder import Status
from reminders_svc.schedule import parse_repeat
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import CassandraConnection
from tests.api.conftest import (
    SEED_NOW,
    Api,
    FakeClock,
    code_of,
    one_off,
    start_api,
    weekly_monday_nine,
)
from tests.unknown_outcome import UnknownOutcome


def _request(request_id: str, text: str = "call mom") -> pb.CreateReminderRequest:
    return pb.CreateReminderRequest(
        reminder=pb.Reminder(text=text, schedule=weekly_monday_nine()), request_id=request_id
    )


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


def test_concurrent_replays_of_one_request_create_one_reminder(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    md = api.as_user(user)
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(
            pool.map(
                lambda _: api.reminders.CreateReminder(_request("same"), metadata=md), range(16)
            )
        )

    assert len({a.id for a in answers}) == 1
    rows = _rows(cassandra, user)
    assert len(rows) == 1
    assert rows[0].active_count == 1


def test_a_replay_after_a_crash_between_record_and_row_completes_the_row(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    # The first attempt recorded the request, then died before writing the row.
    request = _request("crashed")
    payload = pb.Reminder(text=request.reminder.text, schedule=request.reminder.schedule)
    orphan_id = uuid.uuid4()
    cassandra.session.execute(
        "INSERT INTO create_requests (user_id, request_id, payload_hash, reminder_id)"
        " VALUES (%s, %s, %s, %s)",
        (
            user,
            "crashed",
            hashlib.sha256(payload.SerializeToString(deterministic=True)).digest(),
            orphan_id,
        ),
    )

    replay = api.reminders.CreateReminder(request, metadata=api.as_user(user))

    assert replay.id == str(orphan_id)
    assert [r.reminder_id for r in _rows(cassandra, user)] == [orphan_id]


@pytest.fixture
def second_api(migrated_settings: CassandraSettings) -> Iterator[Api]:
    """Another server on the same keyspace: its calls race the first's only through LWTs
    (a server serializes one user's changes in-process, so one server alone never would)."""
    thread, api = start_api(migrated_settings, FakeClock(SEED_NOW))
    yield api
    api.channel.close()
    thread.stop()


@pytest.mark.parametrize("servers", [1, 2])
def test_concurrent_edits_snoozes_and_a_delete_end_in_an_allowed_state(
    api: Api, user: str, cassandra: CassandraConnection, servers: int, request: Any
) -> None:
    apis = [api] if servers == 1 else [api, request.getfixturevalue("second_api")]
    md = api.as_user(user)
    created = api.reminders.CreateReminder(_request("race"), metadata=md)

    def act(i: int) -> grpc.StatusCode:
        api = apis[i % len(apis)]
        if i == 10:
            return code_of(
                lambda: api.reminders.DeleteReminder(
                    pb.DeleteReminderRequest(id=created.id), metadata=md
                )
            )
        if i % 2:
            return code_of(
                lambda: api.reminders.SnoozeReminder(
                    pb.SnoozeReminderRequest(
                        id=created.id, duration=Duration(seconds=60 * (i + 1))
                    ),
                    metadata=md,
                )
            )
        try:
            version = api.reminders.GetReminder(
                pb.GetReminderRequest(id=created.id), metadata=md
            ).version
        except grpc.RpcError as error:
            return error.code()
        return code_of(
            lambda: api.reminders.UpdateReminder(
                pb.UpdateReminderRequest(
                    reminder=pb.Reminder(id=created.id, version=version, text=f"t{i}"),
                    update_mask=FieldMask(paths=["text"]),
                ),
                metadata=md,
            )
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(act, range(20)))

    allowed = {grpc.StatusCode.OK, grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND}
    assert set(codes) <= allowed, codes
    row = cassandra.session.execute(
        "SELECT status, version, due, claim_token, active_count FROM reminders"
        " WHERE user_id = %s AND reminder_id = %s",
        (user, uuid.UUID(created.id)),
    ).one()
    assert row.status == "deleted"  # the delete always lands: it needs no caller version
    assert row.due is None
    assert row.claim_token is None
    assert row.active_count == 0
    successes = codes.count(grpc.StatusCode.OK)
    assert row.version == 1 + successes  # every accepted change bumped the version once


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
def app_factory(cassandra: CassandraConnection) -> Any:
    def make(injector: UnknownOutcome) -> RemindersApp:
        store = ReminderStore(cassandra.session, Retention(), executor=injector)
        return RemindersApp(store, Limits(), FakeClock(SEED_NOW))

    return make


@UNKNOWN_OUTCOMES
@pytest.mark.parametrize("apply_first", [True, False], ids=["landed", "lost"])
def test_an_lwt_timeout_is_settled_by_a_serial_read(
    app_factory: Any, cassandra: CassandraConnection, user: str, apply_first: bool, error: Exception
) -> None:
    schedule = parse_repeat("every Monday 09:00", "America/New_York", datetime(2026, 10, 19, 10))
    honest = RemindersApp(
        ReminderStore(cassandra.session, Retention()), Limits(), FakeClock(SEED_NOW)
    )
    created = asyncio.run(honest.create(user, "r", "call mom", schedule, b"p"))

    injector = UnknownOutcome(lands=apply_first, error=error, targets=_is_row_lwt)
    app = app_factory(injector)
    paused = asyncio.run(app.pause(user, created.reminder_id, None))

    assert injector.injected == 1
    assert paused.status is Status.PAUSED
    row = cassandra.session.execute(
        "SELECT status, version FROM reminders WHERE user_id = %s AND reminder_id = %s",
        (user, created.reminder_id),
    ).one()
    # Landed: settled as applied, not applied twice. Lost: re-read and applied once.
    assert (row.status, row.version) == ("paused", 2)


def test_an_edit_of_unknown_outcome_is_applied_though_a_claim_landed_after_it(
    app_factory: Any, cassandra: CassandraConnection, user: str
) -> None:
    schedule = parse_repeat("every Monday 09:00", "America/New_York", datetime(2026, 10, 19, 10))
    honest_store = ReminderStore(cassandra.session, Retention())
    honest = RemindersApp(honest_store, Limits(), FakeClock(SEED_NOW))
    created = asyncio.run(honest.create(user, "r", "call mom", schedule, b"p"))

    async def a_dispatcher_claims_it() -> None:  # as at its due, before the settling read
        stored = await honest_store.get_serial(user, created.reminder_id)
        assert stored is not None
        assert stored.reminder.due is not None
        at = stored.reminder.due
        claim = dispatch.claimed(stored.reminder, uuid.uuid4(), at, timedelta(seconds=30))
        assert await honest_store.replace(stored, claim, at)

    injector = UnknownOutcome(lands=True, targets=_is_row_lwt, then=a_dispatcher_claims_it)
    app = app_factory(injector)

    edited = asyncio.run(app.update(user, created.reminder_id, 1, "call dad", None))

    assert injector.injected == 1
    # The edit landed: answered as applied, not ABORTED for a version its own write moved.
    assert (edited.text, edited.version) == ("call dad", 2)
    row = cassandra.session.execute(
        "SELECT body, version, status FROM reminders WHERE user_id = %s AND reminder_id = %s",
        (user, created.reminder_id),
    ).one()
    assert (row.body, row.version, row.status) == ("call dad", 2, "sending")


@UNKNOWN_OUTCOMES
@pytest.mark.parametrize("apply_first", [True, False], ids=["landed", "lost"])
def test_a_create_whose_lwt_timed_out_is_settled_and_written_once(
    app_factory: Any, cassandra: CassandraConnection, user: str, apply_first: bool, error: Exception
) -> None:
    schedule = parse_repeat("every Monday 09:00", "America/New_York", datetime(2026, 10, 19, 10))
    injector = UnknownOutcome(lands=apply_first, error=error, targets=_is_row_lwt)

    created = asyncio.run(app_factory(injector).create(user, "r", "call mom", schedule, b"p"))

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
    schedule = parse_repeat("every Monday 09:00", "America/New_York", datetime(2026, 10, 19, 10))
    one_slot = Limits(max_active_per_user=1)
    # The original recorded its request, then was slow to write its row.
    original_id = uuid.uuid4()
    cassandra.session.execute(
        "INSERT INTO create_requests (user_id, request_id, payload_hash, reminder_id)"
        " VALUES (%s, %s, %s, %s)",
        (user, "r", hashlib.sha256(b"p").digest(), original_id),
    )
    honest = RemindersApp(
        ReminderStore(cassandra.session, Retention()), one_slot, FakeClock(SEED_NOW)
    )
    racing = _OriginalLandsWhileTheReplayLooks(
        cassandra.session, honest, lambda app: app.create(user, "r", "call mom", schedule, b"p")
    )
    replay = RemindersApp(racing, one_slot, FakeClock(SEED_NOW))

    answer = asyncio.run(replay.create(user, "r", "call mom", schedule, b"p"))

    assert racing.landed
    assert answer.reminder_id == original_id
    assert [r.reminder_id for r in _rows(cassandra, user)] == [original_id]
    assert _create_records(cassandra, user) == {"r"}  # the original's record stands


def _create_records(connection: CassandraConnection, user: str) -> set[str]:
    rows = connection.session.execute(
        "SELECT request_id FROM create_requests WHERE user_id = %s", (user,)
    )
    return {r.request_id for r in rows}


def test_the_per_user_cap_holds_under_concurrent_creates(
    migrated_settings: CassandraSettings, cassandra: CassandraConnection, user: str
) -> None:
    thread, api = start_api(migrated_settings, FakeClock(SEED_NOW), Limits(max_active_per_user=3))
    try:
        md = api.as_user(user)
        with ThreadPoolExecutor(max_workers=6) as pool:
            codes = list(
                pool.map(
                    lambda i: code_of(
                        lambda: api.reminders.CreateReminder(_request(f"cap-{i}"), metadata=md)
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
        refused = next(f"cap-{i}" for i in range(6) if f"cap-{i}" not in accepted)

        api.reminders.DeleteReminder(
            pb.DeleteReminderRequest(id=str(rows[0].reminder_id)), metadata=md
        )
        reused = api.reminders.CreateReminder(_request(refused, "call dad"), metadata=md)
        assert reused.text == "call dad"
    finally:
        api.channel.close()
        thread.stop()
