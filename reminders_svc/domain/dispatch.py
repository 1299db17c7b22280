"""The dispatcher's steps of the row's state machine (DESIGN.md), as pure functions.

- `decide`: invariant 1. The bucket entry only says which row to look at; the row, read
  fresh at max(entry due, now), decides: claim it, wait for it, or skip it (by reason).
- `claimed` / `reclaimed`: pending -> sending with a claim token and the due being handed
  off (`claim.due`, which with the reminder id is the ring's idempotency key). A re-claim
  keeps that due, so a retry after a crash reuses the key.
- `finalized`: after the notifier answered. A snoozed ring clears the snooze; a regular
  ring moves the occurrence to the next one after max(occurrence, now).
- None of them writes a new `op_id`: that stays the last user change's, so a user change
  whose outcome is unknown still finds its own op id when a claim landed after it. The
  store settles these steps by their claim token instead.

The misfire policy (invariant 9): rings missed during an outage collapse into one ring,
claimed with the latest of them as its due (`missed_due`), so its key and its lateness
are the latest missed ring's; its finalize clears every missed ring at or before that due,
and the series continues after now. A one-off rings late; a repeat rings once for its
latest missed occurrence.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from reminders_svc.domain.reminder import Claim, Reminder, Status, earliest
from reminders_svc.schedule import OneOff, Repeat, latest_at_or_before, next_after


class SkipReason(StrEnum):
    """Why a bucket entry's row is not rung (the `reason` label of the skips metric)."""

    DELETED = "deleted"  # gone, or a tombstone
    PAUSED = "paused"
    DONE = "done"  # the series has ended (or the one-off rang): nothing left to ring
    # Pending with a due past the window; the due's own entry covers it. Edited: a user's
    # change since the entry was written moved it. Stale: the row rang and moved on.
    EDITED = "edited"
    STALE = "stale"
    # Found older than the misfire grace under the skip_missed policy: re-armed (or ended)
    # in one LWT, never claimed, never handed off.
    MISSED = "missed"


@dataclass(frozen=True)
class Claimable:
    """Pending and due: claim it with this due and version."""

    due: datetime
    version: int


@dataclass(frozen=True)
class Reclaimable:
    """Sending under an expired claim: take the claim over, same due, same key."""

    claim: Claim


@dataclass(frozen=True)
class WaitUntil:
    """Not yet: look again at this instant (a due later in this minute, or a live claim)."""

    instant: datetime


@dataclass(frozen=True)
class Skip:
    reason: SkipReason


Decision = Claimable | Reclaimable | WaitUntil | Skip


def decide(
    row: Reminder | None, now: datetime, horizon: datetime, entry_written: datetime | None = None
) -> Decision:
    """What to do with a row read at `now`; `horizon` ends the window being worked (the
    minute's end): a due before it is waited for, a due after it is someone else's entry.
    `entry_written` (when the bucket entry was written) only names why a row is skipped."""
    if row is None or row.status is Status.DELETED:
        return Skip(SkipReason.DELETED)
    if row.status is Status.PAUSED:
        return Skip(SkipReason.PAUSED)
    if row.status is Status.DONE:
        return Skip(SkipReason.DONE)
    if row.status is Status.SENDING:
        assert row.claim is not None, "a sending row always carries its claim"
        if row.claim.expires <= now:
            return Reclaimable(row.claim)
        return WaitUntil(row.claim.expires)
    assert row.due is not None, "a pending row always has a due"
    if row.due <= now:
        return Claimable(row.due, row.version)
    if row.due < horizon:
        return WaitUntil(row.due)
    # Only users' changes set updated_at (a claim or a finalize does not).
    edited = entry_written is not None and row.updated_at > entry_written
    return Skip(SkipReason.EDITED if edited else SkipReason.STALE)


def missed_due(row: Reminder, now: datetime) -> datetime:
    """The due a claim of this pending row hands off: the latest of its rings at or before
    `now` (its snooze, its occurrence, and for a repeat every occurrence since), never
    earlier than the row's due. Normally that is the row's due itself."""
    assert row.due is not None
    missed = [row.due]
    if row.snooze_until is not None and row.snooze_until <= now:
        missed.append(row.snooze_until)
    if row.occurrence is not None and row.occurrence <= now:
        latest = None
        if isinstance(row.schedule, Repeat):
            latest = latest_at_or_before(row.schedule, row.occurrence, now)
        missed.append(latest or row.occurrence)
    return max(missed)


def claimed(row: Reminder, token: uuid.UUID, now: datetime, lease: timedelta) -> Reminder:
    """Pending -> sending. The row's due and version stay as read: the claim's LWT compares
    them; only the claim carries the due handed off (`missed_due`)."""
    claim = Claim(token, missed_due(row, now), now + lease)
    return dataclasses.replace(row, status=Status.SENDING, claim=claim)


def reclaimed(row: Reminder, token: uuid.UUID, now: datetime, lease: timedelta) -> Reminder:
    """An expired claim taken over: a new token, the same claim due (the same key). The
    store's LWT also compares the expiry read, so a renewal in between refuses it."""
    assert row.claim is not None
    return dataclasses.replace(row, claim=Claim(token, row.claim.due, now + lease))


def finalized(row: Reminder, now: datetime) -> Reminder:
    """The row after its claimed ring was handed off (or given up for good)."""
    assert row.claim is not None
    rung = row.claim.due
    # Every ring at or before the one rung is covered by it: nothing missed rings twice.
    snooze_until = (
        None if row.snooze_until is not None and row.snooze_until <= rung else (row.snooze_until)
    )
    occurrence = row.occurrence
    if occurrence is not None and occurrence <= rung:
        if isinstance(row.schedule, OneOff):
            occurrence = None
        else:
            # Misfire policy: the series continues after now, whatever was missed.
            occurrence = next_after(row.schedule, max(occurrence, now))
    due = earliest(occurrence, snooze_until)
    return dataclasses.replace(
        row,
        status=Status.PENDING if due is not None else Status.DONE,
        occurrence=occurrence,
        snooze_until=snooze_until,
        due=due,
        claim=None,
    )


def idempotency_key(row: Reminder) -> str:
    """`<reminder id>/<claimed due, RFC 3339 UTC>`: one alert per key, reused by retries."""
    assert row.claim is not None
    return f"{row.reminder_id}/{row.claim.due.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"
