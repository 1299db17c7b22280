"""The dispatcher's steps of the state machine, pure (no I/O)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from reminders_svc.domain import dispatch
from reminders_svc.domain.reminder import Reminder, Status, delete, new_reminder, pause, snooze
from reminders_svc.schedule import one_off_local, parse_repeat

NY = "America/New_York"
T0 = datetime(2026, 10, 19, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def weekly() -> Reminder:
    schedule = parse_repeat("every Monday 09:00", NY, datetime(2026, 10, 19, 10, 0))
    return new_reminder("u", "call mom", schedule, datetime(2026, 10, 26, 13, tzinfo=UTC), T0)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_the_row_decides_claim_wait_or_skip() -> None:
    row = weekly()
    minute_end = at("2026-10-26T13:01:00")
    assert dispatch.decide(row, at("2026-10-26T13:00:00"), minute_end) == dispatch.Claimable(
        at("2026-10-26T13:00:00"), 1
    )
    assert dispatch.decide(row, at("2026-10-26T12:59:58"), minute_end) == dispatch.WaitUntil(
        at("2026-10-26T13:00:00")
    )
    assert dispatch.decide(row, at("2026-10-26T12:59:58"), at("2026-10-26T13:00:00")) == (
        dispatch.Skip(dispatch.SkipReason.RESCHEDULED)
    )
    assert dispatch.decide(None, T0, minute_end) == dispatch.Skip(dispatch.SkipReason.DELETED)
    assert dispatch.decide(delete(row, T0), T0, minute_end) == dispatch.Skip(
        dispatch.SkipReason.DELETED
    )
    assert dispatch.decide(pause(row, T0), T0, minute_end) == dispatch.Skip(
        dispatch.SkipReason.PAUSED
    )


def test_a_live_claim_is_waited_for_and_an_expired_one_taken_over() -> None:
    now = at("2026-10-26T13:00:01")
    sending = dispatch.claimed(weekly(), uuid.uuid4(), now, LEASE)
    assert dispatch.decide(sending, now, now) == dispatch.WaitUntil(now + LEASE)
    later = now + LEASE
    assert dispatch.decide(sending, later, later) == dispatch.Reclaimable(sending.claim)  # type: ignore[arg-type]
    taken = dispatch.reclaimed(sending, uuid.uuid4(), later, LEASE)
    assert taken.claim is not None
    assert sending.claim is not None
    assert taken.claim.due == sending.claim.due  # same due, same idempotency key
    assert dispatch.idempotency_key(taken) == dispatch.idempotency_key(sending)


def test_finalizing_a_regular_ring_moves_to_the_next_dst_correct_occurrence() -> None:
    now = at("2026-10-26T13:00:01")
    done = dispatch.finalized(dispatch.claimed(weekly(), uuid.uuid4(), now, LEASE), now)
    assert done.status is Status.PENDING
    assert done.occurrence == at("2026-11-02T14:00:00")  # after the fall-back
    assert done.due == done.occurrence
    assert done.claim is None
    assert done.version == 1  # the dispatcher's steps are not user changes


def test_after_an_outage_a_repeat_rings_once_then_continues_in_the_future() -> None:
    now = at("2026-11-18T12:00:00")  # three Mondays missed
    done = dispatch.finalized(dispatch.claimed(weekly(), uuid.uuid4(), now, LEASE), now)
    assert done.occurrence == at("2026-11-23T14:00:00")


def test_a_snoozed_ring_clears_the_snooze_and_keeps_the_series() -> None:
    row = snooze(weekly(), at("2026-10-20T12:00:00"), T0)
    assert row.due == at("2026-10-20T12:00:00")
    now = at("2026-10-20T12:00:00")
    done = dispatch.finalized(dispatch.claimed(row, uuid.uuid4(), now, LEASE), now)
    assert done.snooze_until is None
    assert done.occurrence == at("2026-10-26T13:00:00")
    assert done.due == at("2026-10-26T13:00:00")


def test_a_snooze_landing_while_sending_rings_after_the_ring_in_flight() -> None:
    now = at("2026-10-26T13:00:01")
    sending = dispatch.claimed(weekly(), uuid.uuid4(), now, LEASE)
    snoozed = snooze(sending, at("2026-10-26T13:10:00"), now)
    assert snoozed.status is Status.SENDING
    assert snoozed.claim == sending.claim
    done = dispatch.finalized(snoozed, now)
    assert done.snooze_until == at("2026-10-26T13:10:00")
    assert done.due == at("2026-10-26T13:10:00")
    assert done.occurrence == at("2026-11-02T14:00:00")


def test_a_one_off_is_done_after_its_ring() -> None:
    schedule = one_off_local(datetime(2026, 10, 20, 9, 0), NY)
    row = new_reminder("u", "x", schedule, at("2026-10-20T13:00:00"), T0)
    now = at("2026-10-20T13:00:00")
    done = dispatch.finalized(dispatch.claimed(row, uuid.uuid4(), now, LEASE), now)
    assert (done.status, done.due, done.occurrence) == (Status.DONE, None, None)


def test_the_key_names_the_reminder_and_the_due() -> None:
    now = at("2026-10-26T13:00:00")
    row = dispatch.claimed(weekly(), uuid.uuid4(), now, LEASE)
    assert dispatch.idempotency_key(row) == f"{row.reminder_id}/2026-10-26T13:00:00.000000Z"
