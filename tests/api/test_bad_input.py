"""Bad input: the right code, the field at fault (google.rpc.BadRequest), nothing written."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.storage.session import CassandraConnection
from tests.api.conftest import Api, one_off, weekly_monday_nine

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NY = "America/New_York"


def _create(reminder: pb.Reminder, request_id: str = "req") -> Callable[[Api, str, str], Any]:
    return lambda api, rid, user: api.reminders.CreateReminder(
        pb.CreateReminderRequest(reminder=reminder, request_id=request_id),
        metadata=api.as_user(user),
    )


def _repeat(**fields: str) -> pb.Schedule:
    return pb.Schedule(
        time_zone=NY, repeat=pb.Repeat(start_local_time="2026-10-19T10:00:00", **fields)
    )


def _update(reminder: pb.Reminder, paths: list[str]) -> Callable[[Api, str, str], Any]:
    def call(api: Api, rid: str, user: str) -> Any:
        target = pb.Reminder()
        target.CopyFrom(reminder)
        target.id = target.id or rid
        return api.reminders.UpdateReminder(
            pb.UpdateReminderRequest(reminder=target, update_mask=FieldMask(paths=paths)),
            metadata=api.as_user(user),
        )

    return call


def _snooze(**fields: Any) -> Callable[[Api, str, str], Any]:
    return lambda api, rid, user: api.reminders.SnoozeReminder(
        pb.SnoozeReminderRequest(id=rid, **fields), metadata=api.as_user(user)
    )


def _past() -> Timestamp:
    stamp = Timestamp()
    stamp.FromJsonString("2020-01-01T00:00:00Z")
    return stamp


GOOD = pb.Reminder(text="ok", schedule=weekly_monday_nine())

CASES: list[tuple[str, Callable[[Api, str, str], Any], str]] = [
    ("empty text", _create(pb.Reminder(text="", schedule=weekly_monday_nine())), "reminder.text"),
    (
        "blank text",
        _create(pb.Reminder(text="   ", schedule=weekly_monday_nine())),
        "reminder.text",
    ),
    (
        "501 characters",
        _create(pb.Reminder(text="x" * 501, schedule=weekly_monday_nine())),
        "reminder.text",
    ),
    ("no schedule", _create(pb.Reminder(text="t")), "reminder.schedule.time_zone"),
    (
        "unknown zone",
        _create(pb.Reminder(text="t", schedule=one_off("2026-11-01T09:00:00", "Mars/Olympus"))),
        "reminder.schedule.time_zone",
    ),
    (
        "zone but no kind",
        _create(pb.Reminder(text="t", schedule=pb.Schedule(time_zone=NY))),
        "reminder.schedule",
    ),
    (
        "once without a time",
        _create(pb.Reminder(text="t", schedule=pb.Schedule(time_zone=NY, once=pb.OneOff()))),
        "reminder.schedule.once",
    ),
    (
        "once at 'tomorrow'",
        _create(pb.Reminder(text="t", schedule=one_off("tomorrow"))),
        "reminder.schedule.once.local_time",
    ),
    (
        "once local time with an offset",
        _create(pb.Reminder(text="t", schedule=one_off("2026-11-01T09:00:00+01:00"))),
        "reminder.schedule.once.local_time",
    ),
    (
        "once in the past",
        _create(pb.Reminder(text="t", schedule=one_off("2020-01-01T09:00:00"))),
        "reminder.schedule.once.local_time",
    ),
    (
        "instant in the past",
        _create(
            pb.Reminder(
                text="t", schedule=pb.Schedule(time_zone=NY, once=pb.OneOff(instant=_past()))
            )
        ),
        "reminder.schedule.once.instant",
    ),
    (
        "repeat without a rule",
        _create(pb.Reminder(text="t", schedule=_repeat())),
        "reminder.schedule.repeat",
    ),
    (
        "expression that does not parse",
        _create(pb.Reminder(text="t", schedule=_repeat(expression="every blursday at noonish"))),
        "reminder.schedule.repeat.expression",
    ),
    (
        "rrule more often than hourly",
        _create(pb.Reminder(text="t", schedule=_repeat(rrule="FREQ=MINUTELY"))),
        "reminder.schedule.repeat.rrule",
    ),
    (
        "rrule COUNT=0",
        _create(pb.Reminder(text="t", schedule=_repeat(rrule="FREQ=DAILY;COUNT=0"))),
        "reminder.schedule.repeat.rrule",
    ),
    (
        "rrule unknown part",
        _create(pb.Reminder(text="t", schedule=_repeat(rrule="FREQ=DAILY;BYFOO=1"))),
        "reminder.schedule.repeat.rrule",
    ),
    (
        "rrule UNTIL before start",
        _create(pb.Reminder(text="t", schedule=_repeat(rrule="FREQ=DAILY;UNTIL=20200101T000000Z"))),
        "reminder.schedule.repeat.rrule",
    ),
    (
        "rrule that never occurs",
        _create(
            pb.Reminder(text="t", schedule=_repeat(rrule="FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30"))
        ),
        "reminder.schedule.repeat.rrule",
    ),
    (
        "malformed start",
        _create(
            pb.Reminder(
                text="t",
                schedule=pb.Schedule(
                    time_zone=NY,
                    repeat=pb.Repeat(expression="every day 08:00", start_local_time="soon"),
                ),
            )
        ),
        "reminder.schedule.repeat.start_local_time",
    ),
    ("missing request_id", _create(GOOD, request_id=""), "request_id"),
    ("request_id too long", _create(GOOD, request_id="r" * 129), "request_id"),
    (
        "get: id not a uuid",
        lambda api, rid, user: api.reminders.GetReminder(
            pb.GetReminderRequest(id="r2"), metadata=api.as_user(user)
        ),
        "id",
    ),
    ("update: no mask", _update(pb.Reminder(version=1, text="x"), []), "update_mask"),
    ("update: unknown path", _update(pb.Reminder(version=1), ["state"]), "update_mask"),
    ("update: no version", _update(pb.Reminder(text="x"), ["text"]), "reminder.version"),
    (
        "update: bad id",
        _update(pb.Reminder(id="nope", version=1, text="x"), ["text"]),
        "reminder.id",
    ),
    (
        "update: text too long",
        _update(pb.Reminder(version=1, text="y" * 501), ["text"]),
        "reminder.text",
    ),
    (
        "update: bad zone",
        _update(
            pb.Reminder(version=1, schedule=one_off("2026-11-01T09:00:00", "Nowhere/Land")),
            ["schedule"],
        ),
        "reminder.schedule.time_zone",
    ),
    ("snooze: no time", _snooze(), "until"),
    ("snooze: 30 seconds", _snooze(duration=Duration(seconds=30)), "duration"),
    ("snooze: 8 days", _snooze(duration=Duration(seconds=8 * 86400)), "duration"),
    ("snooze: to the past", _snooze(snooze_until_time=_past()), "snooze_until_time"),
    (
        "snooze: malformed local time",
        _snooze(snooze_until_local_time="later"),
        "snooze_until_local_time",
    ),
    (
        "list: negative page size",
        lambda api, rid, user: api.reminders.ListReminders(
            pb.ListRemindersRequest(page_size=-1), metadata=api.as_user(user)
        ),
        "page_size",
    ),
    (
        "list: forged page token",
        lambda api, rid, user: api.reminders.ListReminders(
            pb.ListRemindersRequest(page_token="not-a-token"), metadata=api.as_user(user)
        ),
        "page_token",
    ),
    (
        "list: by deleted state",
        lambda api, rid, user: api.reminders.ListReminders(
            pb.ListRemindersRequest(state=pb.Reminder.STATE_DELETED), metadata=api.as_user(user)
        ),
        "state",
    ),
    (
        "preview: 1000 occurrences",
        lambda api, rid, user: api.reminders.PreviewSchedule(
            pb.PreviewScheduleRequest(schedule=weekly_monday_nine(), count=1000),
            metadata=api.as_user(user),
        ),
        "count",
    ),
    (
        "deliveries: bad id",
        lambda api, rid, user: api.reminders.ListDeliveries(
            pb.ListDeliveriesRequest(reminder_id="x"), metadata=api.as_user(user)
        ),
        "reminder_id",
    ),
    (
        "delete: bad id",
        lambda api, rid, user: api.reminders.DeleteReminder(
            pb.DeleteReminderRequest(id="1234"), metadata=api.as_user(user)
        ),
        "id",
    ),
]


def _snapshot(cassandra: CassandraConnection, user: str) -> list[tuple[Any, ...]]:
    rows = cassandra.session.execute("SELECT * FROM reminders WHERE user_id = %s", (user,))
    requests = cassandra.session.execute(
        "SELECT * FROM create_requests WHERE user_id = %s", (user,)
    )
    return [tuple(r) for r in rows] + [tuple(r) for r in requests]


def test_the_table_has_at_least_30_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize(("name", "call", "field"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_with_its_field_and_changes_nothing(
    api: Api,
    user: str,
    cassandra: CassandraConnection,
    name: str,
    call: Callable[[Api, str, str], Any],
    field: str,
) -> None:
    existing = api.reminders.CreateReminder(
        pb.CreateReminderRequest(reminder=GOOD, request_id=uuid.uuid4().hex),
        metadata=api.as_user(user),
    )
    before = _snapshot(cassandra, user)

    with pytest.raises(grpc.RpcError) as refused:
        call(api, existing.id, user)

    assert refused.value.code() == INVALID, refused.value.details()
    status = rpc_status.from_call(refused.value)
    assert status is not None, "no google.rpc.Status in the trailers"
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert [v.field for v in bad_request.field_violations] == [field]
    assert _snapshot(cassandra, user) == before


def test_an_oversized_message_is_refused_before_it_reaches_the_service(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    huge = pb.Reminder(text="x" * 200_000, schedule=weekly_monday_nine())
    with pytest.raises(grpc.RpcError) as refused:
        _create(huge)(api, "", user)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _snapshot(cassandra, user) == []
