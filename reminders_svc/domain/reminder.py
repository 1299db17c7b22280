"""A reminder and the user-driven steps of its state machine (DESIGN.md), as pure functions.

Each step takes the row as read and returns the row to write (or raises a domain error);
the storage layer writes it with an LWT conditioned on what was read, so a step computed
from a stale read never lands. The dispatcher's steps (claim, finalize) live in
`domain/dispatch.py`.

Rules every step keeps:
- `due` is always the earlier of `occurrence` and `snooze_until` while the reminder can
  ring (pending, or sending with a snooze queued), and null when paused, done or deleted.
- Every user change bumps `version` and records a fresh `op_id` (the dispatcher's steps
  keep it: it names the last user change).
- A user change that takes over from a dispatcher (edit of the schedule, pause, delete)
  clears the claim, so that dispatcher's finalize fails and the user's change wins.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from reminders_svc.domain.errors import FailedPrecondition, NotFound
from reminders_svc.schedule import OneOff, Schedule, next_after

# A user id (a token's `sub`) is a partition key in every keyspace, the notifier's
# included: longer ones are refused at the API, so no reminder is made that the notifier
# would refuse to ring (Cassandra's own limit, 64 KiB, is far above any real id).
MAX_USER_ID_BYTES = 256


def user_id_problem(user_id: str) -> str | None:
    """Why `user_id` names no user any token could carry, or None."""
    if not user_id:
        return "required"
    if len(user_id.encode()) > MAX_USER_ID_BYTES:
        return f"at most {MAX_USER_ID_BYTES} bytes"
    return None


class Status(StrEnum):
    PENDING = "pending"
    SENDING = "sending"
    DONE = "done"
    PAUSED = "paused"
    DELETED = "deleted"


@dataclass(frozen=True)
class Claim:
    token: uuid.UUID
    due: datetime
    expires: datetime


@dataclass(frozen=True)
class Reminder:
    user_id: str
    reminder_id: uuid.UUID
    text: str
    schedule: Schedule
    status: Status
    occurrence: datetime | None
    snooze_until: datetime | None
    due: datetime | None
    version: int
    claim: Claim | None
    op_id: uuid.UUID
    created_at: datetime
    updated_at: datetime
    # The expiry of a claim a user's change cleared: the dispatcher may have handed the
    # ring off until then, and the notifier may push it for a while after (see
    # `may_be_in_flight`).
    handoff_until: datetime | None = None

    def handing_off(self, now: datetime, still_pushed_for: timedelta) -> bool:
        """Whether a ring of it may be in flight: claimed now, or claimed until recently."""
        return may_be_in_flight(
            self.status is Status.SENDING, self.handoff_until, now, still_pushed_for
        )


def may_be_in_flight(
    claimed: bool, handoff_until: datetime | None, now: datetime, still_pushed_for: timedelta
) -> bool:
    """Whether a ring may still reach the user: the row is claimed, or a cleared claim's
    ring may still be pushed. The notifier carries on with a ring its caller handed off
    until that attempt's own expiry, `still_pushed_for` after it at most (the ring expiry
    and the clock-skew allowance): the claim's expiry bounds only the dispatcher's
    attempts (architecture.md, refinement 27)."""
    return claimed or (handoff_until is not None and handoff_until + still_pushed_for > now)


def earliest(*instants: datetime | None) -> datetime | None:
    return min(filter(None, instants), default=None)


def latest(*instants: datetime | None) -> datetime | None:
    return max(filter(None, instants), default=None)


def _claim_cleared(reminder: Reminder) -> dict[str, object]:
    """A user's change taking the claim away (DESIGN.md invariant 5): the ring may already
    be handed off, and may go out until the claim would have expired."""
    claim = reminder.claim
    if claim is None:
        return {"claim": None}
    return {"claim": None, "handoff_until": latest(claim.expires, reminder.handoff_until)}


def _changed(reminder: Reminder, now: datetime, **changes: object) -> Reminder:
    return dataclasses.replace(
        reminder,
        version=reminder.version + 1,
        op_id=uuid.uuid4(),
        updated_at=now,
        **changes,  # type: ignore[arg-type]
    )


def new_reminder(
    user_id: str,
    text: str,
    schedule: Schedule,
    first: datetime,
    now: datetime,
    *,
    reminder_id: uuid.UUID | None = None,
) -> Reminder:
    """A pending reminder whose first ring is `first` (validated by the time engine)."""
    return Reminder(
        user_id=user_id,
        reminder_id=reminder_id or uuid.uuid4(),
        text=text,
        schedule=schedule,
        status=Status.PENDING,
        occurrence=first,
        snooze_until=None,
        due=first,
        version=1,
        claim=None,
        op_id=uuid.uuid4(),
        created_at=now,
        updated_at=now,
    )


def edit_text(reminder: Reminder, text: str, now: datetime) -> Reminder:
    """Only the text changes: state, claim and rings stay as they are."""
    _require_not_deleted(reminder)
    if text == reminder.text:
        # Nothing to change (a form saved untouched, a whole reminder sent back): no new
        # version, or every other client's copy would go stale (its next edit ABORTED).
        return reminder
    return _changed(reminder, now, text=text)


def edit_schedule(
    reminder: Reminder, text: str, schedule: Schedule, first: datetime, now: datetime
) -> Reminder:
    """A new schedule: next ring recomputed, snooze and claim cleared, paused stays paused."""
    _require_not_deleted(reminder)
    paused = reminder.status is Status.PAUSED
    return _changed(
        reminder,
        now,
        text=text,
        schedule=schedule,
        occurrence=first,
        snooze_until=None,
        due=None if paused else first,
        status=Status.PAUSED if paused else Status.PENDING,
        **_claim_cleared(reminder),
    )


def snooze(reminder: Reminder, until: datetime, now: datetime) -> Reminder:
    """An extra one-time ring at `until`; the series is untouched.

    While sending, the claim stays: the dispatcher's finalize sees the snooze and keeps it.
    """
    if reminder.status not in (Status.PENDING, Status.SENDING, Status.DONE):
        raise FailedPrecondition(
            f"a {reminder.status} reminder cannot be snoozed", field="id", reason="NOT_SNOOZABLE"
        )
    changes: dict[str, object] = {"snooze_until": until}
    if reminder.status is not Status.SENDING:
        changes.update(due=earliest(reminder.occurrence, until), status=Status.PENDING)
    if all(getattr(reminder, name) == value for name, value in changes.items()):
        # A retry of a snooze that landed: no new version, or the caller's retry would
        # make every other client's version stale.
        return reminder
    return _changed(reminder, now, **changes)


def pause(reminder: Reminder, now: datetime) -> Reminder:
    if reminder.status is Status.PAUSED:
        return reminder  # already paused: nothing to change, no new version
    if reminder.status not in (Status.PENDING, Status.SENDING):
        raise FailedPrecondition(
            f"a {reminder.status} reminder cannot be paused", field="id", reason="NOT_PAUSABLE"
        )
    return _changed(reminder, now, status=Status.PAUSED, due=None, **_claim_cleared(reminder))


def resume(reminder: Reminder, now: datetime) -> Reminder:
    """A repeat continues from its next occurrence after now; a passed one-off is refused."""
    if reminder.status is not Status.PAUSED:
        raise FailedPrecondition(
            f"only a paused reminder can be resumed (it is {reminder.status})",
            field="id",
            reason="NOT_PAUSED",
        )
    snooze_until = reminder.snooze_until if _in_future(reminder.snooze_until, now) else None
    if isinstance(reminder.schedule, OneOff):
        if not _in_future(reminder.occurrence, now) and snooze_until is None:
            raise FailedPrecondition(
                "this one-off reminder's time has passed: edit its time instead of resuming",
                field="id",
                reason="ONE_OFF_PASSED",
            )
        occurrence = reminder.occurrence if _in_future(reminder.occurrence, now) else None
    else:
        occurrence = next_after(reminder.schedule, now)
    due = earliest(occurrence, snooze_until)
    return _changed(
        reminder,
        now,
        status=Status.PENDING if due is not None else Status.DONE,
        occurrence=occurrence,
        snooze_until=snooze_until,
        due=due,
    )


def as_seen(reminder: Reminder, now: datetime) -> Reminder:
    """The reminder as its owner should read it at `now`, for reading only (the row keeps
    what it holds): a deleted one rings nothing; a paused one shows what resuming now would
    ring, where its stored occurrence may long have passed (a repeat's next occurrence
    after now, a snooze still ahead; a one-off whose time has passed, nothing); one being
    rung shows the ring in flight (after missed occurrences, the latest: its row's due
    is the oldest until the finalize)."""
    if reminder.status is Status.DELETED:
        return dataclasses.replace(reminder, occurrence=None, snooze_until=None, due=None)
    if reminder.status is Status.SENDING and reminder.claim is not None:
        return dataclasses.replace(reminder, due=reminder.claim.due)
    if reminder.status is not Status.PAUSED:
        return reminder
    try:
        resumed = resume(reminder, now)
    except FailedPrecondition:
        return dataclasses.replace(reminder, occurrence=None, snooze_until=None)
    return dataclasses.replace(
        reminder, occurrence=resumed.occurrence, snooze_until=resumed.snooze_until
    )


def delete(reminder: Reminder, now: datetime) -> Reminder:
    _require_not_deleted(reminder)
    return _changed(reminder, now, status=Status.DELETED, due=None, **_claim_cleared(reminder))


def _in_future(instant: datetime | None, now: datetime) -> bool:
    return instant is not None and instant > now


def _require_not_deleted(reminder: Reminder) -> None:
    if reminder.status is Status.DELETED:
        # Deleted rows are invisible to their owner, exactly like missing ones.
        raise NotFound("reminder not found")
