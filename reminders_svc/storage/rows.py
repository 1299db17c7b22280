"""Reminder <-> `reminders` row, in one place."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from reminders_svc.domain.reminder import Claim, Reminder, Status
from reminders_svc.schedule import OneOff, Repeat, Schedule

# Every mutable column a user step may change; the LWT writes them all from the new row.
MUTABLE_COLUMNS = (
    "body",
    "schedule_kind",
    "zone",
    "local_start",
    "at_instant",
    "rrule",
    "status",
    "occurrence",
    "snooze_until",
    "due",
    "version",
    "claim_token",
    "claim_due",
    "claim_expires",
    "op_id",
    "updated_at",
    "handoff_until",
)
SELECT_COLUMNS = ("user_id", "reminder_id", "active_count", "created_at", *MUTABLE_COLUMNS)


def utc(value: datetime | None) -> datetime | None:
    """The driver returns naive UTC datetimes; the domain works in aware UTC."""
    return None if value is None else value.replace(tzinfo=UTC)


def _schedule_columns(schedule: Schedule) -> dict[str, Any]:
    if isinstance(schedule, OneOff):
        return {
            "schedule_kind": "once",
            "zone": schedule.zone,
            "local_start": schedule.local.isoformat() if schedule.local else None,
            "at_instant": schedule.instant,
            "rrule": None,
        }
    return {
        "schedule_kind": "repeat",
        "zone": schedule.zone,
        "local_start": schedule.start.isoformat(),
        "at_instant": None,
        "rrule": schedule.rrule,
    }


def _schedule(row: Any) -> Schedule:
    local = datetime.fromisoformat(row.local_start) if row.local_start else None
    if row.schedule_kind == "once":
        return OneOff(zone=row.zone, local=local, instant=utc(row.at_instant))
    assert local is not None, "a repeat always has a local start"
    return Repeat(rrule=row.rrule, zone=row.zone, start=local)


def to_columns(reminder: Reminder) -> dict[str, Any]:
    claim = reminder.claim
    return {
        "body": reminder.text,
        **_schedule_columns(reminder.schedule),
        "status": reminder.status.value,
        "occurrence": reminder.occurrence,
        "snooze_until": reminder.snooze_until,
        "due": reminder.due,
        "version": reminder.version,
        "claim_token": claim.token if claim else None,
        "claim_due": claim.due if claim else None,
        "claim_expires": claim.expires if claim else None,
        "op_id": reminder.op_id,
        "updated_at": reminder.updated_at,
        "handoff_until": reminder.handoff_until,
    }


def from_row(row: Any) -> Reminder:
    claim = None
    if row.claim_token is not None:
        claim = Claim(row.claim_token, utc(row.claim_due), utc(row.claim_expires))  # type: ignore[arg-type]
    created = utc(row.created_at)
    updated = utc(row.updated_at)
    assert created is not None
    assert updated is not None
    return Reminder(
        user_id=row.user_id,
        reminder_id=row.reminder_id,
        text=row.body,
        schedule=_schedule(row),
        status=Status(row.status),
        occurrence=utc(row.occurrence),
        snooze_until=utc(row.snooze_until),
        due=utc(row.due),
        version=row.version,
        claim=claim,
        op_id=row.op_id,
        created_at=created,
        updated_at=updated,
        handoff_until=utc(row.handoff_until),
    )
