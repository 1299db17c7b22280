"""Bad input: the right code, the field at fault (google.rpc.BadRequest), nothing written."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.storage.session import CassandraConnection
from tests.api.conftest import SEED_NOW, Api, one_off, snapshot_of, weekly_monday_nine
from tests.grpc_errors import assert_refused

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NY = "America/New_York"
# The request_id of the reminder every case starts from (users are fresh per test).
EXISTING_REQUEST = "existing-request"
# Seconds of a Timestamp far outside its valid range (years 1 to 9999).
OUT_OF_RANGE_SECONDS = 2**62
# 9999-12-31T23:59:59Z and 0001-01-01T00:00:00Z: valid Timestamps at datetime's very edges.
LAST_SECOND = 253_402_300_799
FIRST_SECOND = -62_135_596_800


def _create(reminder: pb.Reminder, request_id: str = "req") -> Callable[[Api, str, str], Any]:
    return lambda api, rid, user: api.reminders.CreateReminder(
        pb.CreateReminderRequest(reminder=reminder, request_id=request_id),
        metadata=api.as_user(user),
    )


def _repeat(start_local_time: str = "2026-10-19T10:00:00", **fields: str) -> pb.Schedule:
    return pb.Schedule(time_zone=NY, repeat=pb.Repeat(start_local_time=start_local_time, **fields))


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
    return _at("2020-01-01T00:00:00Z")


def _once_at(instant: Timestamp) -> pb.Reminder:
    return pb.Reminder(
        text="t", schedule=pb.Schedule(time_zone=NY, once=pb.OneOff(instant=instant))
    )


def _preview_from(
    from_time: Timestamp, schedule: pb.Schedule | None = None
) -> Callable[[Api, str, str], Any]:
    return lambda api, rid, user: api.reminders.PreviewSchedule(
        pb.PreviewScheduleRequest(schedule=schedule or weekly_monday_nine(), from_time=from_time),
        metadata=api.as_user(user),
    )


def _at(text: str) -> Timestamp:
    stamp = Timestamp()
    stamp.FromJsonString(text)
    return stamp


def _daily_without_a_start(zone: str) -> pb.Schedule:
    """A repeat that begins where the preview does: at from_time's local time in `zone`."""
    return pb.Schedule(time_zone=zone, repeat=pb.Repeat(expression="every day 09:00"))


def _token(cursor: object, kind: str) -> str:
    """A well-formed page token, as the server encodes them, around any cursor."""
    raw = json.dumps({"v": 1, "k": kind, "c": cursor}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _list_after(cursor: object) -> Callable[[Api, str, str], Any]:
    return lambda api, rid, user: api.reminders.ListReminders(
        pb.ListRemindersRequest(page_token=_token(cursor, "reminders:")),
        metadata=api.as_user(user),
    )


def _deliveries_before(cursor: object) -> Callable[[Api, str, str], Any]:
    return lambda api, rid, user: api.reminders.ListDeliveries(
        pb.ListDeliveriesRequest(reminder_id=rid, page_token=_token(cursor, f"deliveries:{rid}")),
        metadata=api.as_user(user),
    )


def _at_version(rpc: str, version: int) -> Callable[[Api, str, str], Any]:
    request = getattr(pb, f"{rpc}Request")
    return lambda api, rid, user: getattr(api.reminders, rpc)(
        request(id=rid, version=version), metadata=api.as_user(user)
    )


@dataclass(frozen=True)
class _Purge:
    """DeleteUserData of the user `target` names, given the caller's id: a call whose
    data at stake is another user's, so the test checks that user's data too."""

    target: Callable[[str], str]

    def __call__(self, api: Api, rid: str, user: str) -> Any:
        return api.admin.DeleteUserData(
            pb.DeleteUserDataRequest(user_id=self.target(user)), metadata=api.as_admin()
        )


def _users_named(call: Callable[[Api, str, str], Any], user: str) -> list[str]:
    """The caller, and any other user `call` names whose data it could change."""
    # An empty id names no partition: Cassandra holds no data under an empty key.
    if isinstance(call, _Purge) and (target := call.target(user)):
        return [user, target]
    return [user]


def _record_a_delivery(cassandra: CassandraConnection, user: str, reminder_id: str) -> None:
    """A ring of `reminder_id` in `user`'s delivery history, as a dispatcher records it."""
    cassandra.session.execute(
        "INSERT INTO deliveries (user_id, reminder_id, claim_due, answer) VALUES (%s, %s, %s, %s)",
        (user, uuid.UUID(reminder_id), SEED_NOW, "accepted"),
    )


GOOD = pb.Reminder(text="ok", schedule=weekly_monday_nine())

COSTLY = pb.Schedule(
    time_zone="America/New_York",
    repeat=pb.Repeat(
        rrule="FREQ=YEARLY;INTERVAL=3;BYMONTHDAY="
        + ",".join(map(str, range(1, 32)))
        + ";BYSETPOS=-1",
        start_local_time="2026-12-04T09:00",
    ),
)

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
    ("no schedule", _create(pb.Reminder(text="t")), "reminder.schedule"),
    (
        "the placeholder zone Factory",
        _create(pb.Reminder(text="t", schedule=one_off("2026-11-01T09:00:00", "Factory"))),
        "reminder.schedule.time_zone",
    ),
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
        # str.lower() makes "İ" two characters: the position of the error was past the end.
        "expression with a letter that lowercases to two",
        _create(pb.Reminder(text="t", schedule=_repeat(expression="every day 09:00 İ"))),
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
        # Valid from its start, but its end passed before now: the rule the caller sent.
        "rrule that ended before now",
        _create(
            pb.Reminder(
                text="t",
                schedule=_repeat("2026-10-01T10:00:00", rrule="FREQ=DAILY;UNTIL=20261010T000000Z"),
            )
        ),
        "reminder.schedule.repeat.rrule",
    ),
    (
        "expression that ended before now",
        _create(
            pb.Reminder(
                text="t",
                schedule=_repeat(
                    "2026-10-01T10:00:00", expression="every day 09:00 until 2026-10-10"
                ),
            )
        ),
        "reminder.schedule.repeat.expression",
    ),
    (
        "rrule UNTIL in year 9999",
        _create(pb.Reminder(text="t", schedule=_repeat(rrule="FREQ=DAILY;UNTIL=99991231"))),
        "reminder.schedule.repeat.rrule",
    ),
    (
        "expression until year 9999",
        _create(
            pb.Reminder(text="t", schedule=_repeat(expression="every day 09:00 until 9999-12-31"))
        ),
        "reminder.schedule.repeat.expression",
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
    # A request refused on its own fields whatever the system holds is refused for them,
    # not for reusing a request_id (that answer depends on what an earlier request made).
    (
        "once in the past, request_id used for another reminder",
        _create(pb.Reminder(text="t", schedule=one_off("2020-01-01T09:00:00")), EXISTING_REQUEST),
        "reminder.schedule.once.local_time",
    ),
    (
        "unknown zone, request_id used for another reminder",
        _create(
            pb.Reminder(text="t", schedule=one_off("2026-11-01T09:00:00", "Mars/Olympus")),
            EXISTING_REQUEST,
        ),
        "reminder.schedule.time_zone",
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
    # Refused for the time whatever the row: not NOT_FOUND, not ABORTED (the caller would
    # re-read and send the same bad time again).
    (
        "update: time in the past",
        _update(pb.Reminder(version=1, schedule=one_off("2020-01-01T09:00:00")), ["schedule"]),
        "reminder.schedule.once.local_time",
    ),
    (
        "update: time in the past, at a stale version",
        _update(pb.Reminder(version=99, schedule=one_off("2020-01-01T09:00:00")), ["schedule"]),
        "reminder.schedule.once.local_time",
    ),
    (
        "update: time in the past, of a reminder that does not exist",
        _update(
            pb.Reminder(id=str(uuid.uuid4()), version=1, schedule=one_off("2020-01-01T09:00:00")),
            ["schedule"],
        ),
        "reminder.schedule.once.local_time",
    ),
    ("snooze: no time", _snooze(), "until"),
    ("snooze: 30 seconds", _snooze(duration=Duration(seconds=30)), "duration"),
    (
        "snooze: 30 seconds, of a reminder that does not exist",
        lambda api, rid, user: _snooze(duration=Duration(seconds=30))(api, str(uuid.uuid4()), user),
        "duration",
    ),
    ("snooze: 8 days", _snooze(duration=Duration(seconds=8 * 86400)), "duration"),
    ("snooze: to the past", _snooze(snooze_until_time=_past()), "snooze_until_time"),
    (
        "snooze: to the past, of a reminder that does not exist",
        lambda api, rid, user: _snooze(snooze_until_time=_past())(api, str(uuid.uuid4()), user),
        "snooze_until_time",
    ),
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
        # The last day of every third year: ~1,000 expansion steps a ring, so 100 rings
        # cost more than one call may spend.
        "preview: 100 rings of a costly rule",
        lambda api, rid, user: api.reminders.PreviewSchedule(
            pb.PreviewScheduleRequest(schedule=COSTLY, count=100), metadata=api.as_user(user)
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
        "get: an id spelled as no answer spells it",
        lambda api, rid, user: api.reminders.GetReminder(
            pb.GetReminderRequest(id=f"urn:uuid:{rid}"), metadata=api.as_user(user)
        ),
        "id",
    ),
    (
        "delete: an id without its dashes",
        lambda api, rid, user: api.reminders.DeleteReminder(
            pb.DeleteReminderRequest(id=rid.replace("-", "")), metadata=api.as_user(user)
        ),
        "id",
    ),
    (
        "delete: bad id",
        lambda api, rid, user: api.reminders.DeleteReminder(
            pb.DeleteReminderRequest(id="1234"), metadata=api.as_user(user)
        ),
        "id",
    ),
    # Timestamps outside their range, or at datetime's edges where zone shifts overflow.
    (
        "once instant out of range",
        _create(_once_at(Timestamp(seconds=OUT_OF_RANGE_SECONDS))),
        "reminder.schedule.once.instant",
    ),
    (
        "once instant with negative nanos",
        _create(_once_at(Timestamp(seconds=1_900_000_000, nanos=-5))),
        "reminder.schedule.once.instant",
    ),
    (
        # Its bucket entry's TTL would pass Cassandra's 20-year maximum.
        "once local time more than 10 years ahead",
        _create(pb.Reminder(text="t", schedule=one_off("2047-01-01T09:00:00"))),
        "reminder.schedule.once.local_time",
    ),
    (
        "edit to a time more than 10 years ahead",
        _update(pb.Reminder(version=1, schedule=one_off("2040-01-01T09:00:00")), ["schedule"]),
        "reminder.schedule.once.local_time",
    ),
    (
        "once local time in year 9999",
        _create(pb.Reminder(text="t", schedule=one_off("9999-12-31T23:00:00"))),
        "reminder.schedule.once.local_time",
    ),
    (
        "repeat starting in year 1",
        _create(
            pb.Reminder(
                text="t", schedule=_repeat("0001-01-01T00:00:00", expression="every day 08:00")
            )
        ),
        "reminder.schedule.repeat.start_local_time",
    ),
    (
        "snooze: until out of range",
        _snooze(snooze_until_time=Timestamp(seconds=-OUT_OF_RANGE_SECONDS)),
        "snooze_until_time",
    ),
    (
        "snooze: local time in year 9999",
        _snooze(snooze_until_local_time="9999-12-31T23:00:00"),
        "snooze_until_local_time",
    ),
    (
        "preview: from out of range",
        _preview_from(Timestamp(seconds=OUT_OF_RANGE_SECONDS)),
        "from_time",
    ),
    ("preview: from year 1", _preview_from(Timestamp(seconds=FIRST_SECOND)), "from_time"),
    ("preview: from year 9999", _preview_from(Timestamp(seconds=LAST_SECOND)), "from_time"),
    # In range in UTC, but a repeat without a start begins at the local time: year 9000 in
    # Kiritimati (UTC+14), 1899 in Etc/GMT+12. The rule is not at fault.
    (
        "preview: from the end of 8999 in UTC+14",
        _preview_from(_at("8999-12-31T23:59:59Z"), _daily_without_a_start("Pacific/Kiritimati")),
        "from_time",
    ),
    (
        "preview: from the start of 1900 in UTC-12",
        _preview_from(_at("1900-01-01T00:00:00Z"), _daily_without_a_start("Etc/GMT+12")),
        "from_time",
    ),
    # Durations too long for any instant to be that far from now.
    ("snooze: 10,000 years", _snooze(duration=Duration(seconds=315_576_000_000)), "duration"),
    (
        "snooze: minus 10,000 years",
        _snooze(duration=Duration(seconds=-315_576_000_000)),
        "duration",
    ),
    ("snooze: 2**62 seconds", _snooze(duration=Duration(seconds=2**62)), "duration"),
    (
        "snooze: nanos of another sign",
        _snooze(duration=Duration(seconds=600, nanos=-1)),
        "duration",
    ),
    # Well-formed page tokens that are not what the server wrote.
    ("list: token with a number cursor", _list_after(5), "page_token"),
    (
        "list: token nested too deep to decode",
        lambda api, rid, user: api.reminders.ListReminders(
            pb.ListRemindersRequest(page_token=base64.urlsafe_b64encode(b"[" * 20_000).decode()),
            metadata=api.as_user(user),
        ),
        "page_token",
    ),
    (
        # The next ring's bucket entry would outlive Cassandra's 20-year TTL.
        "repeat whose rings are 11 years apart",
        _create(pb.Reminder(text="t", schedule=_repeat(rrule="FREQ=YEARLY;INTERVAL=11"))),
        "reminder.schedule.repeat.rrule",
    ),
    ("list: token with a list cursor", _list_after([]), "page_token"),
    (
        "list: token with a braced uuid",
        _list_after("{" + str(uuid.UUID(int=1)) + "}"),
        "page_token",
    ),
    ("deliveries: token with a number cursor", _deliveries_before(5), "page_token"),
    (
        "deliveries: token with a local time",
        _deliveries_before("2026-10-26T13:00:00"),
        "page_token",
    ),
    # Large bad values: the error must still reach the caller, naming the field.
    (
        "once local time of 20 KB",
        _create(pb.Reminder(text="t", schedule=one_off("9" * 20_000))),
        "reminder.schedule.once.local_time",
    ),
    (
        "expression of 40 KB",
        _create(pb.Reminder(text="t", schedule=_repeat(expression="every " + "x" * 40_000))),
        "reminder.schedule.repeat.expression",
    ),
    (
        "rrule of 40 KB",
        _create(pb.Reminder(text="t", schedule=_repeat(rrule="FREQ=DAILY;X=" + "1" * 40_000))),
        "reminder.schedule.repeat.rrule",
    ),
    (
        "zone of 40 KB",
        _create(pb.Reminder(text="t", schedule=one_off("2026-11-01T09:00:00", "Z" * 40_000))),
        "reminder.schedule.time_zone",
    ),
    (
        "snooze: local time of 20 KB",
        _snooze(snooze_until_local_time="l" * 20_000),
        "snooze_until_local_time",
    ),
    (
        "update: unknown path of 40 KB",
        _update(pb.Reminder(version=1), ["p" * 40_000]),
        "update_mask",
    ),
    # Negative versions: 0 means "any version", below that is malformed.
    (
        "update: version -1",
        _update(pb.Reminder(version=-1, text="x"), ["text"]),
        "reminder.version",
    ),
    ("delete: version -1", _at_version("DeleteReminder", -1), "version"),
    ("pause: version -1", _at_version("PauseReminder", -1), "version"),
    ("resume: version -1", _at_version("ResumeReminder", -1), "version"),
    ("purge: no user_id", _Purge(lambda user: ""), "user_id"),
    # No user has such an id (a token's subject is at most 256 bytes), and the audit log
    # would carry it whole.
    ("purge: user_id over 256 bytes", _Purge(lambda user: user + "x" * 256), "user_id"),
]

# Rejections with another code than INVALID_ARGUMENT still name the field at fault.
REFUSALS: list[Any] = [
    *(pytest.param(call, INVALID, field, "INVALID_FIELD", id=name) for name, call, field in CASES),
    pytest.param(
        _create(pb.Reminder(text="another", schedule=weekly_monday_nine()), EXISTING_REQUEST),
        grpc.StatusCode.FAILED_PRECONDITION,
        "request_id",
        "REQUEST_ID_REUSED",
        id="create: request_id reused for another reminder",
    ),
    pytest.param(
        _at_version("ResumeReminder", 0),
        grpc.StatusCode.FAILED_PRECONDITION,
        "id",
        "NOT_PAUSED",
        id="resume: a reminder that is not paused",
    ),
]


def test_the_table_has_at_least_30_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize(("call", "code", "field", "reason"), REFUSALS)
def test_bad_input_is_refused_with_its_field_and_changes_nothing(
    api: Api,
    user: str,
    cassandra: CassandraConnection,
    call: Callable[[Api, str, str], Any],
    code: grpc.StatusCode,
    field: str,
    reason: str,
) -> None:
    existing = api.reminders.CreateReminder(
        pb.CreateReminderRequest(reminder=GOOD, request_id=EXISTING_REQUEST),
        metadata=api.as_user(user),
    )
    named = _users_named(call, user)
    # History for every user named, so that a delete of their data shows, not only a write.
    for someone in named:
        _record_a_delivery(cassandra, someone, existing.id)
    before = snapshot_of(cassandra, *named)

    with pytest.raises(grpc.RpcError) as refused:
        call(api, existing.id, user)

    assert_refused(refused.value, code, field, reason)
    assert snapshot_of(cassandra, *named) == before


def test_resuming_a_passed_one_off_names_the_reminder_and_changes_nothing(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    md = api.as_user(user)
    created = api.reminders.CreateReminder(
        pb.CreateReminderRequest(
            reminder=pb.Reminder(text="t", schedule=one_off("2026-10-20T09:00:00")), request_id="r"
        ),
        metadata=md,
    )
    api.reminders.PauseReminder(pb.PauseReminderRequest(id=created.id), metadata=md)
    api.clock.advance(timedelta(days=2))
    before = snapshot_of(cassandra, user)

    with pytest.raises(grpc.RpcError) as refused:
        api.reminders.ResumeReminder(pb.ResumeReminderRequest(id=created.id), metadata=md)

    assert_refused(refused.value, grpc.StatusCode.FAILED_PRECONDITION, "id", "ONE_OFF_PASSED")
    assert snapshot_of(cassandra, user) == before


def test_snoozing_a_paused_reminder_names_the_reminder_and_changes_nothing(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    md = api.as_user(user)
    created = api.reminders.CreateReminder(
        pb.CreateReminderRequest(reminder=GOOD, request_id="r"), metadata=md
    )
    api.reminders.PauseReminder(pb.PauseReminderRequest(id=created.id), metadata=md)
    before = snapshot_of(cassandra, user)

    with pytest.raises(grpc.RpcError) as refused:
        _snooze(duration=Duration(seconds=600))(api, created.id, user)

    assert_refused(refused.value, grpc.StatusCode.FAILED_PRECONDITION, "id", "NOT_SNOOZABLE")
    assert snapshot_of(cassandra, user) == before


def test_an_oversized_message_is_refused_before_it_reaches_the_service(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    huge = pb.Reminder(text="x" * 200_000, schedule=weekly_monday_nine())
    with pytest.raises(grpc.RpcError) as refused:
        _create(huge)(api, "", user)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert snapshot_of(cassandra, user) == []


def test_bytes_that_are_not_the_request_message_are_an_invalid_argument(
    api: Api, user: str
) -> None:
    """Not a GetReminderRequest (a string field holding bytes that are not UTF-8): gRPC
    itself answered UNKNOWN with the parser's exception and logged a traceback per call."""
    raw: grpc.UnaryUnaryMultiCallable[bytes, bytes] = api.channel.unary_unary(
        "/reminders.v1.RemindersService/GetReminder"
    )
    with pytest.raises(grpc.RpcError) as refused:
        raw(b"\x0a\x02\xff\xfe", metadata=api.as_user(user))
    assert_refused(refused.value, INVALID, "request", "INVALID_FIELD")
