"""Protobuf <-> domain, only here at the gRPC boundary.

Input errors name the request field at fault (its path in the request message).
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TypeVar

from google.protobuf.timestamp_pb2 import Timestamp

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.domain.delivery import Answer, Delivery
from reminders_svc.domain.errors import InvalidArgument
from reminders_svc.domain.reminder import Reminder, Status
from reminders_svc.schedule import (
    OneOff,
    Repeat,
    Schedule,
    ScheduleError,
    describe,
    load_zone,
    one_off_instant,
    one_off_local,
    parse_local_datetime,
    parse_repeat,
    parse_rrule,
)

_STATES = {
    Status.PENDING: pb.Reminder.STATE_PENDING,
    Status.SENDING: pb.Reminder.STATE_SENDING,
    Status.DONE: pb.Reminder.STATE_DONE,
    Status.PAUSED: pb.Reminder.STATE_PAUSED,
    Status.DELETED: pb.Reminder.STATE_DELETED,
}
_STATUS_OF = {state: status for status, state in _STATES.items()}
_ANSWERS = {
    Answer.ACCEPTED: pb.Delivery.ANSWER_ACCEPTED,
    Answer.DUPLICATE: pb.Delivery.ANSWER_DUPLICATE,
    Answer.REJECTED: pb.Delivery.ANSWER_REJECTED,
    Answer.ABANDONED: pb.Delivery.ANSWER_ABANDONED,
}
Cursor = TypeVar("Cursor")


def timestamp(instant: datetime | None) -> Timestamp | None:
    if instant is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(instant.astimezone(UTC))
    return stamp


def instant_of(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)


def reminder_id(text: str, field: str = "id") -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise InvalidArgument(field, "not a reminder id") from None


def local_time(text: str, field: str) -> datetime:
    """ISO 8601 local wall time without an offset, e.g. 2026-11-01T01:30:00."""
    try:
        return parse_local_datetime(text, field)
    except ScheduleError as error:
        raise InvalidArgument(field, error.message) from None


def state_filter(state: int) -> Status | None:
    if state == pb.Reminder.STATE_UNSPECIFIED:
        return None
    if state not in _STATUS_OF or state == pb.Reminder.STATE_DELETED:
        raise InvalidArgument("state", "not a state to list by")
    return _STATUS_OF[state]  # type: ignore[index]


def schedule_from_proto(message: pb.Schedule, now: datetime, field: str) -> Schedule:
    """Parse and validate a schedule; `now` is where a repeat without a start begins."""
    zone_field = f"{field}.time_zone"
    if not message.time_zone:
        raise InvalidArgument(zone_field, "required (an IANA zone such as Europe/Paris)")
    kind = message.WhichOneof("kind")
    with schedule_errors(message, field):
        zone = load_zone(message.time_zone)
        if kind == "once":
            return _one_off(message.once, message.time_zone, f"{field}.once")
        if kind == "repeat":
            return _repeat(message.repeat, message.time_zone, now.astimezone(zone), field)
    raise InvalidArgument(field, "one of once or repeat is required")


@contextlib.contextmanager
def schedule_errors(message: pb.Schedule, field: str) -> Iterator[None]:
    """Time-engine errors become InvalidArgument naming the request field at fault."""
    try:
        yield
    except ScheduleError as error:
        raise InvalidArgument(_schedule_field(error.field, message, field), error.message) from None


def _one_off(message: pb.OneOff, zone: str, field: str) -> OneOff:
    when = message.WhichOneof("when")
    if when == "local_time":
        return one_off_local(local_time(message.local_time, f"{field}.local_time"), zone)
    if when == "instant":
        return one_off_instant(instant_of(message.instant), zone)
    raise InvalidArgument(field, "one of local_time or instant is required")


def _repeat(message: pb.Repeat, zone: str, local_now: datetime, field: str) -> Repeat:
    start_field = f"{field}.repeat.start_local_time"
    start = (
        local_time(message.start_local_time, start_field)
        if message.start_local_time
        else local_now.replace(tzinfo=None, second=0, microsecond=0)
    )
    rule = message.WhichOneof("rule")
    if rule == "expression":
        return parse_repeat(message.expression, zone, start)
    if rule == "rrule":
        return parse_rrule(message.rrule, zone, start)
    raise InvalidArgument(f"{field}.repeat", "one of expression or rrule is required")


def _schedule_field(engine_field: str, message: pb.Schedule, field: str) -> str:
    rule_field = "repeat." + (message.repeat.WhichOneof("rule") or "expression")
    mapping = {
        "zone": "time_zone",
        "at": "once.local_time" if message.once.HasField("local_time") else "once.instant",
        "instant": "once.instant",
        "start": "repeat.start_local_time",
        "repeat": "repeat.expression",
        "rrule": "repeat.rrule",
    }
    return f"{field}.{mapping.get(engine_field, rule_field)}"


def schedule_to_proto(schedule: Schedule) -> pb.Schedule:
    message = pb.Schedule(time_zone=schedule.zone, description=describe(schedule))
    if isinstance(schedule, OneOff):
        if schedule.local is not None:
            message.once.local_time = schedule.local.isoformat()
        else:
            assert schedule.instant is not None
            message.once.instant.FromDatetime(schedule.instant)
    else:
        message.repeat.rrule = schedule.rrule
        message.repeat.canonical_rrule = schedule.rrule
        message.repeat.start_local_time = schedule.start.isoformat()
    return message


def reminder_to_proto(reminder: Reminder) -> pb.Reminder:
    return pb.Reminder(
        id=str(reminder.reminder_id),
        text=reminder.text,
        schedule=schedule_to_proto(reminder.schedule),
        next_ring_time=timestamp(reminder.due),
        next_occurrence_time=timestamp(reminder.occurrence),
        snooze_until_time=timestamp(reminder.snooze_until),
        state=_STATES[reminder.status],
        version=reminder.version,
        create_time=timestamp(reminder.created_at),
        update_time=timestamp(reminder.updated_at),
    )


def page_token(cursor: str | None, kind: str) -> str:
    """An opaque token for the next page of one listing (`kind` names listing and filter)."""
    if cursor is None:
        return ""
    raw = json.dumps({"v": 1, "k": kind, "c": cursor}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def page_cursor(token: str, kind: str, parse: Callable[[str], Cursor]) -> Cursor | None:
    """Decode a token made by `page_token` for the same listing, or refuse it."""
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if data["v"] != 1 or data["k"] != kind:
            raise ValueError(kind)
        return parse(data["c"])
    except (ValueError, KeyError, TypeError):
        raise InvalidArgument("page_token", "not a token from this listing") from None


def page_size(requested: int, default: int, largest: int) -> int:
    if requested < 0:
        raise InvalidArgument("page_size", "must not be negative")
    return min(requested or default, largest)


def delivery_to_proto(delivery: Delivery) -> pb.Delivery:
    message = pb.Delivery(
        due_time=timestamp(delivery.claim_due),
        claim_time=timestamp(delivery.claimed_at),
        hand_off_time=timestamp(delivery.handed_off_at),
        answer=_ANSWERS[delivery.answer] if delivery.answer else pb.Delivery.ANSWER_UNSPECIFIED,
        reason=delivery.reason or "",
        late=delivery.late,
    )
    if delivery.lateness_ms is not None:
        message.lateness.FromMilliseconds(delivery.lateness_ms)
    return message
