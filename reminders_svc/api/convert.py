"""Protobuf <-> domain, only here at the gRPC boundary.

Input errors name the request field at fault (its path in the request message). Every
Timestamp, Duration and schedule text is range- or length-checked here, before any
arithmetic or parsing can fail on it in a way that is not the caller's error.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.domain.delivery import Answer, Delivery
from reminders_svc.domain.errors import InvalidArgument
from reminders_svc.domain.reminder import Reminder, Status, as_seen
from reminders_svc.schedule import (
    OneOff,
    Repeat,
    Schedule,
    ScheduleError,
    check_year,
    describe,
    named_at,
    one_off_instant,
    one_off_local,
    parse_local_datetime,
    parse_repeat,
    parse_rrule,
)
from reminders_svc.schedule.zones import load_place, start_from
from reminders_svc.timestamps import timestamp

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
# The longest accepted text of each schedule input: generous for every real value (the
# longest IANA zone name has 32 characters), and short enough to parse cheaply.
MAX_ZONE_CHARS = 64
MAX_LOCAL_TIME_CHARS = 32
MAX_EXPRESSION_CHARS = 256
MAX_RRULE_CHARS = 1024


def instant_of(stamp: Timestamp, field: str) -> datetime:
    """A Timestamp input as an aware UTC datetime, or InvalidArgument on `field`."""
    try:
        instant = stamp.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise InvalidArgument(field, "not a valid timestamp") from None
    return _within_years(instant, field)


def duration_of(message: Duration, field: str, longest: timedelta) -> timedelta:
    """A Duration input of at most `longest` either way, checked before any arithmetic."""
    if abs(message.nanos) > 999_999_999 or message.seconds * message.nanos < 0:
        raise InvalidArgument(field, "not a valid duration")
    if abs(message.seconds) > longest.total_seconds():
        raise InvalidArgument(field, f"must be at most {longest.total_seconds():g} seconds")
    return message.ToTimedelta()


def _within_years(value: datetime, field: str) -> datetime:
    try:
        check_year(value, field)
    except ScheduleError as error:
        raise InvalidArgument(field, error.message) from None
    return value


def bounded(text: str, field: str, longest: int) -> str:
    """`text` if it has at most `longest` characters, else InvalidArgument on `field`."""
    if len(text) > longest:
        raise InvalidArgument(field, f"at most {longest} characters")
    return text


def version_seen(version: int, field: str = "version") -> int | None:
    """The version the caller last saw, or None when unset (0)."""
    if version < 0:
        raise InvalidArgument(field, "must not be negative")
    return version or None


def reminder_id(text: str, field: str = "id") -> uuid.UUID:
    """An id as answers spell it (8-4-4-4-12 hex digits); not the other spellings
    `uuid.UUID` reads (braces, a urn: prefix, no dashes): one id, one name."""
    try:
        parsed = uuid.UUID(text)
    except ValueError:
        raise InvalidArgument(field, "not a reminder id") from None
    if str(parsed) != text.lower():
        raise InvalidArgument(field, "not a reminder id (8-4-4-4-12 hex digits, as answered)")
    return parsed


def require(holder: Message, name: str, field: str) -> None:
    """A REQUIRED message field (google.api.field_behavior) left out is refused by its own
    path, not by the first field inside it found empty."""
    if not holder.HasField(name):
        raise InvalidArgument(field, "required")


def local_time(text: str, field: str) -> datetime:
    """ISO 8601 local wall time without an offset, e.g. 2026-11-01T01:30:00."""
    try:
        return parse_local_datetime(bounded(text, field, MAX_LOCAL_TIME_CHARS), field)
    except ScheduleError as error:
        raise InvalidArgument(field, error.message) from None


def create_payload(message: pb.Reminder) -> bytes:
    """What a replay of a create must repeat, in one form however it is spelled: the text
    and the schedule as asked, without output-only or unknown fields, wall times spelled
    with seconds and instants in whole seconds, as answers spell them (a retry rebuilt
    from an answer's once.local_time, or echoing its description, is the same request)."""
    schedule = pb.Schedule()
    schedule.CopyFrom(message.schedule)
    schedule.DiscardUnknownFields()
    schedule.ClearField("description")
    if schedule.HasField("repeat"):
        schedule.repeat.ClearField("canonical_rrule")
        if schedule.repeat.start_local_time:
            schedule.repeat.start_local_time = _spelled(schedule.repeat.start_local_time)
    elif schedule.once.HasField("local_time"):
        schedule.once.local_time = _spelled(schedule.once.local_time)
    elif schedule.once.HasField("instant"):
        schedule.once.instant.nanos = 0  # dropped, as the contract says
    return pb.Reminder(text=message.text, schedule=schedule).SerializeToString(deterministic=True)


def _spelled(text: str) -> str:
    """A local wall time as answers spell it; unreadable text as sent (it is refused)."""
    try:
        return local_time(text, "").isoformat()
    except InvalidArgument:
        return text


def state_filter(state: int) -> Status | None:
    if state == pb.Reminder.STATE_UNSPECIFIED:
        return None
    if state not in _STATUS_OF or state == pb.Reminder.STATE_DELETED:
        raise InvalidArgument("state", "not a state to list by")
    return _STATUS_OF[state]  # type: ignore[index]


def schedule_from_proto(message: pb.Schedule, now: datetime, field: str) -> Schedule:
    """Parse and validate a schedule as named at `now`: where a repeat without a start
    begins, and which pass of a repeated hour a one-off's local time is (`named_at`: the
    one still ahead), for a create, an edit and a preview alike."""
    zone_field = f"{field}.time_zone"
    if not message.time_zone:
        raise InvalidArgument(zone_field, "required (an IANA zone such as Europe/Paris)")
    bounded(message.time_zone, zone_field, MAX_ZONE_CHARS)
    kind = message.WhichOneof("kind")
    with schedule_errors(message, field):
        # An unknown zone, or no place's ("Factory"), is the zone field's fault, first.
        zone = load_place(message.time_zone)
        if kind == "once":
            return named_at(_one_off(message.once, message.time_zone, f"{field}.once"), now)
        if kind == "repeat":
            return _repeat(message.repeat, message.time_zone, start_from(now, zone), field)
    raise InvalidArgument(field, "one of once or repeat is required")


@contextlib.contextmanager
def schedule_errors(message: pb.Schedule, field: str) -> Iterator[None]:
    """Time-engine errors become InvalidArgument naming the request field at fault."""
    try:
        yield
    except ScheduleError as error:
        raise InvalidArgument(_schedule_field(error.field, message, field), error.message) from None


def valid_when_sent_at(message: pb.Schedule, then: datetime) -> bool:
    """Whether a schedule refused now passed when sent at `then`: only a repeat without a
    start can (it begins when sent, so its end may have passed since)."""
    if message.WhichOneof("kind") != "repeat" or message.repeat.start_local_time:
        return False
    try:
        schedule_from_proto(message, then, "schedule")
    except InvalidArgument:
        return False
    return True


def _one_off(message: pb.OneOff, zone: str, field: str) -> OneOff:
    when = message.WhichOneof("when")
    if when == "local_time":
        return one_off_local(local_time(message.local_time, f"{field}.local_time"), zone)
    if when == "instant":
        return one_off_instant(instant_of(message.instant, f"{field}.instant"), zone)
    raise InvalidArgument(field, "one of local_time or instant is required")


def _repeat(message: pb.Repeat, zone: str, now_start: datetime, field: str) -> Repeat:
    """`now_start`: the start of a repeat without one (now, on a whole minute, so that a
    COUNT's first ring is not already past)."""
    start_field = f"{field}.repeat.start_local_time"
    given = bool(message.start_local_time)
    start = local_time(message.start_local_time, start_field) if given else now_start
    rule = message.WhichOneof("rule")
    if rule == "expression":
        expression = bounded(message.expression, f"{field}.repeat.expression", MAX_EXPRESSION_CHARS)
        return parse_repeat(expression, zone, start, start_given=given)
    if rule == "rrule":
        rrule = bounded(message.rrule, f"{field}.repeat.rrule", MAX_RRULE_CHARS)
        return parse_rrule(rrule, zone, start, start_given=given)
    raise InvalidArgument(f"{field}.repeat", "one of expression or rrule is required")


def _schedule_field(engine_field: str, message: pb.Schedule, field: str) -> str:
    # The engine's "repeat" and "rrule" errors are the rule's, whichever form the caller
    # sent it in; a start it did not send is the rule's default, so the rule is at fault.
    rule_field = "repeat." + (message.repeat.WhichOneof("rule") or "expression")
    mapping = {
        "zone": "time_zone",
        "at": "once.local_time" if message.once.HasField("local_time") else "once.instant",
        "instant": "once.instant",
        "start": "repeat.start_local_time" if message.repeat.start_local_time else rule_field,
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


def reminder_to_proto(
    stored: Reminder, now: datetime, *, ring_in_flight: bool = False
) -> pb.Reminder:
    """`ring_in_flight`: only in a change's answer (never stored, so false on reads)."""
    reminder = as_seen(stored, now)
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
        ring_in_flight=ring_in_flight,
    )


def utc_instant(text: str) -> datetime:
    """An RFC 3339 instant in UTC as `datetime.isoformat` writes it (ValueError if not)."""
    instant = datetime.fromisoformat(text)
    if instant.utcoffset() != timedelta(0):
        raise ValueError(text)
    return instant


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
