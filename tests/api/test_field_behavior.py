"""The contract's field behaviours (google.api.field_behavior, AIP-203) are what the
service does: a REQUIRED field left out is INVALID_ARGUMENT naming it, with nothing
written; OUTPUT_ONLY fields sent in a request are ignored, as AIP-203 asks of a server.
The annotations are read from the generated descriptors, so a field marked REQUIRED that
the service does not require (or names otherwise) fails here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.api import field_behavior_pb2
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.storage.session import CassandraConnection
from tests.api.conftest import Api, code_of, snapshot_of, weekly_monday_nine
from tests.grpc_errors import assert_refused

REQUIRED = field_behavior_pb2.FieldBehavior.REQUIRED
OUTPUT_ONLY = field_behavior_pb2.FieldBehavior.OUTPUT_ONLY


def _behaviours(field: Any) -> list[int]:
    return list(field.GetOptions().Extensions[field_behavior_pb2.field_behavior])


def required_paths(message: Message, prefix: str = "") -> Iterator[str]:
    """The paths of the REQUIRED fields of `message` and of the messages set in it."""
    for field in message.DESCRIPTOR.fields:
        path = f"{prefix}{field.name}"
        if REQUIRED in _behaviours(field):
            yield path
        if field.message_type is not None and message.HasField(field.name):
            yield from required_paths(getattr(message, field.name), f"{path}.")


def without(message: Message, path: str) -> Message:
    copy = type(message)()
    copy.CopyFrom(message)
    *parents, name = path.split(".")
    holder = copy
    for parent in parents:
        holder = getattr(holder, parent)
    holder.ClearField(name)
    return copy


def existing_of(api: Api, user: str) -> pb.Reminder:
    """A reminder of the test's user, to aim the requests at."""
    return api.reminders.CreateReminder(
        pb.CreateReminderRequest(
            reminder=pb.Reminder(text="ok", schedule=weekly_monday_nine()),
            request_id="existing",
        ),
        metadata=api.as_user(user),
    )


# Per RPC: a valid request, made from the existing reminder and the user.
VALID: dict[str, Callable[[pb.Reminder, str], Message]] = {
    "CreateReminder": lambda r, user: pb.CreateReminderRequest(
        reminder=pb.Reminder(text="new", schedule=weekly_monday_nine()), request_id="new"
    ),
    "GetReminder": lambda r, user: pb.GetReminderRequest(id=r.id),
    "ListReminders": lambda r, user: pb.ListRemindersRequest(),
    "UpdateReminder": lambda r, user: pb.UpdateReminderRequest(
        reminder=pb.Reminder(id=r.id, version=r.version, text="new", schedule=r.schedule),
        update_mask=FieldMask(paths=["*"]),
    ),
    "DeleteReminder": lambda r, user: pb.DeleteReminderRequest(id=r.id),
    "SnoozeReminder": lambda r, user: pb.SnoozeReminderRequest(
        id=r.id, duration=Duration(seconds=600)
    ),
    "PauseReminder": lambda r, user: pb.PauseReminderRequest(id=r.id),
    "ResumeReminder": lambda r, user: pb.ResumeReminderRequest(id=r.id),
    "PreviewSchedule": lambda r, user: pb.PreviewScheduleRequest(schedule=weekly_monday_nine()),
    "ListDeliveries": lambda r, user: pb.ListDeliveriesRequest(reminder_id=r.id),
    "DeleteUserData": lambda r, user: pb.DeleteUserDataRequest(user_id=user),
}


# Valid, but refused for the state the reminder is in, which writes nothing either.
_ANSWER_TO_VALID = {"ResumeReminder": grpc.StatusCode.FAILED_PRECONDITION}


def _stub_and_metadata(api: Api, rpc: str, user: str) -> tuple[Any, Any]:
    if rpc == "DeleteUserData":
        return api.admin, api.as_admin()
    return api.reminders, api.as_user(user)


def test_every_rpc_of_the_contract_has_a_valid_request_here() -> None:
    services = pb.DESCRIPTOR.services_by_name.values()
    assert {method.name for service in services for method in service.methods} == set(VALID)


@pytest.mark.parametrize("rpc", sorted(VALID))
def test_each_required_field_left_out_is_refused_by_its_path_and_changes_nothing(
    api: Api, user: str, cassandra: CassandraConnection, rpc: str
) -> None:
    existing = existing_of(api, user)
    stub, metadata = _stub_and_metadata(api, rpc, user)
    call = getattr(stub, rpc)
    valid = VALID[rpc](existing, user)
    before = snapshot_of(cassandra, user)

    for path in required_paths(valid):
        with pytest.raises(grpc.RpcError) as refused:
            call(without(valid, path), metadata=metadata)
        assert_refused(refused.value, grpc.StatusCode.INVALID_ARGUMENT, path, "INVALID_FIELD")
        assert snapshot_of(cassandra, user) == before, path

    # The request the fields were taken from is not itself refused as invalid.
    assert code_of(lambda: call(valid, metadata=metadata)) == _ANSWER_TO_VALID.get(
        rpc, grpc.StatusCode.OK
    )


def _with_output_only_fields_set(reminder: pb.Reminder) -> pb.Reminder:
    """`reminder` carrying a value in every OUTPUT_ONLY field, all of them wrong."""
    junk = pb.Reminder()
    junk.CopyFrom(reminder)
    stamp = Timestamp(seconds=1_000_000_000)
    for holder in (junk, junk.schedule, junk.schedule.repeat):
        for field in holder.DESCRIPTOR.fields:
            if OUTPUT_ONLY not in _behaviours(field):
                continue
            if field.message_type is not None:
                getattr(holder, field.name).CopyFrom(stamp)
            elif field.enum_type is not None:
                setattr(holder, field.name, pb.Reminder.STATE_PAUSED)
            elif field.type == field.TYPE_BOOL:
                setattr(holder, field.name, True)
            else:
                setattr(holder, field.name, "FREQ=DAILY")
    return junk


def _as_answered(reminder: pb.Reminder) -> pb.Reminder:
    """What two answers for one schedule share: all but the id, version and clock stamps."""
    copy = pb.Reminder()
    copy.CopyFrom(reminder)
    for name in ("id", "version", "create_time", "update_time"):
        copy.ClearField(name)
    return copy


def test_output_only_fields_in_a_create_or_an_update_are_ignored(api: Api, user: str) -> None:
    md = api.as_user(user)
    sent = pb.Reminder(text="ok", schedule=weekly_monday_nine())
    junk = _with_output_only_fields_set(sent)
    assert junk.schedule.repeat.canonical_rrule
    assert junk.state == pb.Reminder.STATE_PAUSED
    assert junk.ring_in_flight

    plain = api.reminders.CreateReminder(
        pb.CreateReminderRequest(reminder=sent, request_id="plain"), metadata=md
    )
    with_junk = api.reminders.CreateReminder(
        pb.CreateReminderRequest(reminder=junk, request_id="junk"), metadata=md
    )
    assert _as_answered(with_junk) == _as_answered(plain)

    junk.id, junk.version = with_junk.id, with_junk.version
    updated = api.reminders.UpdateReminder(
        pb.UpdateReminderRequest(reminder=junk, update_mask=FieldMask(paths=["*"])), metadata=md
    )
    assert _as_answered(updated) == _as_answered(plain)
    fetched = api.reminders.GetReminder(pb.GetReminderRequest(id=with_junk.id), metadata=md)
    assert _as_answered(fetched) == _as_answered(plain)
