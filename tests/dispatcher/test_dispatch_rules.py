"""The dispatcher's steps of the state machine: pure rules (no I/O), then the re-claim's
compare-and-set on the real node."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from reminders_svc.domain import dispatch
from reminders_svc.domain.reminder import Reminder, Status, delete, new_reminder, pause, snooze
from reminders_svc.schedule import one_off_local, parse_repeat
from reminders_svc.storage.errors import WriteNotLanded
from reminders_svc.storage.session import CassandraConnection
from tests.admin.conftest import at_instant, change, put, run, store_of
from tests.unknown_outcome import UnknownOutcome

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
        dispatch.Skip(dispatch.SkipReason.STALE)
    )
    assert dispatch.decide(None, T0, minute_end) == dispatch.Skip(dispatch.SkipReason.DELETED)
    assert dispatch.decide(delete(row, T0), T0, minute_end) == dispatch.Skip(
        dispatch.SkipReason.DELETED
    )
    assert dispatch.decide(pause(row, T0), T0, minute_end) == dispatch.Skip(
        dispatch.SkipReason.PAUSED
    )


def test_a_due_moved_past_the_window_is_skipped_as_edited_or_stale() -> None:
    row = weekly()  # next ring 2026-10-26 13:00Z, last changed by its user at T0
    written = T0 - timedelta(days=1)  # an entry from before that change
    window_end = at("2026-10-19T12:01:00")
    assert dispatch.decide(row, T0, window_end, written) == dispatch.Skip(
        dispatch.SkipReason.EDITED
    )
    # The entry the change wrote, or any entry with no user change since: stale.
    assert dispatch.decide(row, T0, window_end, T0) == dispatch.Skip(dispatch.SkipReason.STALE)
    assert dispatch.decide(row, T0, window_end) == dispatch.Skip(dispatch.SkipReason.STALE)


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


def test_after_an_outage_a_repeat_rings_once_for_its_latest_missed_occurrence() -> None:
    row = weekly()
    now = at("2026-11-10T12:00:00")  # Oct 26 (EDT), Nov 2 and Nov 9 (EST) missed
    sending = dispatch.claimed(row, uuid.uuid4(), now, LEASE)
    assert sending.claim is not None
    # One ring, for the latest Monday at 09:00 New York time: its key and its lateness.
    assert sending.claim.due == at("2026-11-09T14:00:00")
    assert dispatch.idempotency_key(sending) == f"{row.reminder_id}/2026-11-09T14:00:00.000000Z"
    # The claim's compare is still on the row as read (its oldest missed due, its version).
    assert (sending.due, sending.version) == (row.due, row.version)

    done = dispatch.finalized(sending, now)
    assert done.occurrence == done.due == at("2026-11-16T14:00:00")
    assert dispatch.decide(done, now, now + timedelta(minutes=1)) == dispatch.Skip(
        dispatch.SkipReason.STALE
    )  # nothing missed rings a second time


def test_a_re_claim_keeps_the_claimed_due_even_after_more_occurrences_passed() -> None:
    claimed_at = at("2026-11-10T12:00:00")
    sending = dispatch.claimed(weekly(), uuid.uuid4(), claimed_at, LEASE)
    later = at("2026-11-24T12:00:00")  # two more Mondays passed while the claim was held
    taken = dispatch.reclaimed(sending, uuid.uuid4(), later, LEASE)
    assert dispatch.idempotency_key(taken) == dispatch.idempotency_key(sending)
    assert dispatch.finalized(taken, later).due == at("2026-11-30T14:00:00")


def test_a_one_off_missed_rings_late_with_its_own_due() -> None:
    schedule = one_off_local(datetime(2026, 10, 20, 9, 0), NY)
    row = new_reminder("u", "x", schedule, at("2026-10-20T13:00:00"), T0)
    now = at("2026-10-22T08:00:00")
    sending = dispatch.claimed(row, uuid.uuid4(), now, LEASE)
    assert sending.claim is not None
    assert sending.claim.due == at("2026-10-20T13:00:00")
    assert dispatch.finalized(sending, now).status is Status.DONE


@pytest.mark.parametrize(
    ("snoozed_to", "now", "claimed_due"),
    [
        # Between two missed Mondays: covered by the latest Monday's ring.
        (at("2026-10-27T12:00:00"), at("2026-11-03T12:00:00"), at("2026-11-02T14:00:00")),
        # After the latest missed Monday: the snooze is the one ring, with its own key.
        (at("2026-11-03T12:00:00"), at("2026-11-04T12:00:00"), at("2026-11-03T12:00:00")),
    ],
    ids=["before-the-latest-occurrence", "after-the-latest-occurrence"],
)
def test_a_missed_snooze_rings_once_with_the_latest_missed_occurrence(
    snoozed_to: datetime, now: datetime, claimed_due: datetime
) -> None:
    snoozed = snooze(weekly(), snoozed_to, T0)
    assert snoozed.due == at("2026-10-26T13:00:00")
    sending = dispatch.claimed(snoozed, uuid.uuid4(), now, LEASE)
    assert sending.claim is not None
    assert sending.claim.due == claimed_due
    done = dispatch.finalized(sending, now)
    assert (done.snooze_until, done.due) == (None, at("2026-11-09T14:00:00"))


def test_on_time_a_ring_is_claimed_with_the_rows_own_due() -> None:
    for now in (at("2026-10-26T13:00:00"), at("2026-10-26T13:00:00.900")):
        sending = dispatch.claimed(weekly(), uuid.uuid4(), now, LEASE)
        assert sending.claim is not None
        assert sending.claim.due == at("2026-10-26T13:00:00")


def test_a_snoozed_ring_clears_the_snooze_and_keeps_the_series() -> None:
    row = snooze(weekly(), at("2026-10-20T12:00:00"), T0)
    assert row.due == at("2026-10-20T12:00:00")
    now = at("2026-10-20T12:00:00")
    sending = dispatch.claimed(row, uuid.uuid4(), now, LEASE)
    assert sending.claim is not None
    assert sending.claim.due == at("2026-10-20T12:00:00")  # its own due, its own key
    done = dispatch.finalized(sending, now)
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


def test_a_re_claim_is_refused_when_the_holder_renewed_after_the_read(
    own_keyspace: CassandraConnection,
) -> None:
    store = store_of(own_keyspace)

    async def scenario() -> None:
        now = datetime.now(UTC).replace(microsecond=0)
        stored = await put(store, at_instant("u-reclaim", now, now - timedelta(minutes=1)))
        user, reminder_id = "u-reclaim", stored.reminder.reminder_id
        holder = dispatch.claimed(stored.reminder, uuid.uuid4(), now - 2 * LEASE, LEASE)
        assert holder.claim is not None
        sending = await change(store, stored, holder)

        # The taker reads the claim expired; the holder renews it before the taker's LWT.
        assert isinstance(dispatch.decide(sending.reminder, now, now), dispatch.Reclaimable)
        assert await store.set_claim_expiry(user, reminder_id, holder.claim.token, now + LEASE)
        taker = dispatch.reclaimed(sending.reminder, uuid.uuid4(), now, LEASE)
        assert not await store.replace(sending, taker, now)
        kept = await store.get(user, reminder_id)
        assert kept is not None
        assert kept.reminder.claim is not None
        assert kept.reminder.claim.token == holder.claim.token

        # Once it has expired again, read afresh, the same re-claim goes through: same key.
        assert await store.set_claim_expiry(user, reminder_id, holder.claim.token, now)
        expired = await store.get(user, reminder_id)
        assert expired is not None
        taker = dispatch.reclaimed(expired.reminder, uuid.uuid4(), now, LEASE)
        taken = await change(store, expired, taker)
        assert taken.reminder.claim == taker.claim
        assert dispatch.idempotency_key(taken.reminder) == dispatch.idempotency_key(holder)

    run(scenario())


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "lost"])
def test_a_claim_renewal_of_unknown_outcome_is_settled_by_a_serial_read(
    own_keyspace: CassandraConnection, lands: bool
) -> None:
    """It raised: the renewal that landed unheard was not known to have landed, and a
    release after it could be outlived by it, holding the ring back a whole lease. One
    that did not land, the claim still standing, is not a claim lost (False, which stops
    the ring as the user's): storage trouble, WriteNotLanded."""
    store = store_of(own_keyspace)

    async def scenario() -> bool:
        now = datetime.now(UTC)
        stored = await put(store, at_instant("u-renew", now, now - timedelta(minutes=1)))
        holder = dispatch.claimed(stored.reminder, uuid.uuid4(), now, LEASE)
        assert holder.claim is not None
        await change(store, stored, holder)
        unsure = store_of(own_keyspace, UnknownOutcome(lands=lands))
        renewed_until = now + 2 * LEASE  # microseconds: stored to the millisecond
        reminder_id = stored.reminder.reminder_id
        return await unsure.set_claim_expiry(
            "u-renew", reminder_id, holder.claim.token, renewed_until
        )

    if lands:
        assert run(scenario()) is True
    else:
        with pytest.raises(WriteNotLanded):
            run(scenario())
