"""The notifier's idempotency keys on the real node: whose a recorded key is, when a later
attempt may take it over (by the database's clock), what a settled key answers, and a
holder's refresh of its hold."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from cassandra import OperationTimedOut
from cassandra.cluster import Session
from prometheus_client import CollectorRegistry

from notifier.delivery.queue import DeliveryQueue
from notifier.domain.model import ItemResult, Notification, Outcome, Priority, Settlement
from notifier.intake import Intake, IntakeLimits
from notifier.metrics import NotifierMetrics
from notifier.settings import NotifierSettings
from notifier.storage.keys import KeyClaim, KeyHold, KeyState, KeyStore
from reminders_svc.storage.aio import execute
from reminders_svc.storage.session import connect
from tests.notifier.conftest import leave_unsettled_key

TAKEOVER_AFTER = timedelta(seconds=60)
# Further off than the takeover bound, either way.
Result = TypeVar("Result")


@dataclass(frozen=True)
class Keys:
    """A KeyStore on the real node, and what the tests do to its rows."""

    store: KeyStore
    session: Session
    keyspace: str

    async def age_hold(self, key: str, age: timedelta) -> None:
        """As if the key's holder had recorded (or last refreshed) it `age` ago by the
        database's clock, which is what judges a hold's age."""
        clock = await execute(self.session, "SELECT toTimestamp(now()) AS now FROM system.local")
        db_now = clock.one().now.replace(tzinfo=UTC)
        table = f"{self.keyspace}.notification_keys"
        backdate = f"UPDATE {table} SET accepted_at = %s WHERE idempotency_key = %s IF EXISTS"
        aged = await execute(self.session, backdate, (db_now - age, key))
        assert aged.one().applied

    async def hold_written(self, key: str) -> int:
        """When (microseconds) the key's accepted_at was last written."""
        table = f"{self.keyspace}.notification_keys"
        query = f"SELECT writetime(accepted_at) AS written FROM {table} WHERE idempotency_key = %s"
        row = (await execute(self.session, query, (key,))).one()
        return int(row.written)


def with_keys(
    notifier_settings: NotifierSettings,
    steps: Callable[[Keys], Awaitable[Result]],
    store_type: Callable[..., KeyStore] = KeyStore,
) -> Result:
    """Runs `steps` on a KeyStore on the real node."""
    settings = notifier_settings.cassandra

    async def run() -> Result:
        with connect(settings) as connection:
            store = store_type(
                connection.session,
                settings.keyspace,
                notifier_settings.key_ttl,
                TAKEOVER_AFTER,
            )
            return await steps(Keys(store, connection.session, settings.keyspace))

    return asyncio.run(run())


def notification() -> Notification:
    return Notification(f"k-{uuid.uuid4()}", "u-keys", Priority.URGENT, "title", "body")


def test_a_key_is_this_attempts_own_when_the_row_holds_its_accept_id(
    notifier_settings: NotifierSettings,
) -> None:
    """A re-sent insert of an attempt whose first insert landed (its reply lost) finds the
    attempt's own row: that is "recorded, deliver it", not "another attempt has it"; but
    not written by this call, so how old the hold is is not known here."""
    item = notification()
    first_attempt, second_attempt = uuid.uuid4(), uuid.uuid4()

    async def steps(keys: Keys) -> list[KeyClaim]:
        return [
            await keys.store.record(item, first_attempt),
            await keys.store.record(item, first_attempt),  # the same insert, sent again
            await keys.store.record(item, second_attempt),  # another attempt at the same key
        ]

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.RECORDED, first_attempt, fresh=True),
        KeyClaim(KeyState.RECORDED, first_attempt),
        KeyClaim(KeyState.HELD_ELSEWHERE, first_attempt),
    ]


def test_a_settled_key_answers_its_settlement_to_every_later_attempt(
    notifier_settings: NotifierSettings,
) -> None:
    pushed, expired = notification(), notification()
    holder = uuid.uuid4()

    async def steps(keys: Keys) -> list[KeyClaim]:
        for item, settlement in ((pushed, Settlement.PUSHED), (expired, Settlement.EXPIRED)):
            await keys.store.record(item, holder)
            await keys.store.settle(item.idempotency_key, item.user_id, settlement)
            await keys.age_hold(item.idempotency_key, TAKEOVER_AFTER * 10)  # never taken over
        return [await keys.store.record(pushed), await keys.store.record(expired)]

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.SETTLED, holder, Settlement.PUSHED),
        KeyClaim(KeyState.SETTLED, holder, Settlement.EXPIRED),
    ]


class KeyStoreFailingOneSettle(KeyStore):
    """The real store, whose first settlement write times out (storage went away)."""

    failed = False

    async def _write_settlement(self, key: str, settlement: Settlement) -> None:
        if not self.failed:
            self.failed = True
            raise OperationTimedOut("injected")
        await super()._write_settlement(key, settlement)


def test_a_key_whose_settlement_failed_to_write_answers_it_and_writes_it_on_the_next_attempt(
    notifier_settings: NotifierSettings,
) -> None:
    """Pushed, then the settle failed: a retry reaching this replica was told "another
    attempt is delivering", and once the hold was stale took the key over and pushed it
    again. It is answered the settlement, which this attempt writes."""
    item = notification()
    key = item.idempotency_key

    async def steps(keys: Keys) -> tuple[list[KeyClaim], Settlement | None]:
        await keys.store.record(item)
        with pytest.raises(OperationTimedOut):
            await keys.store.settle(key, item.user_id, Settlement.PUSHED)
        await keys.age_hold(key, TAKEOVER_AFTER * 2)  # stale: would be taken over
        another_users = dataclasses.replace(item, user_id=f"{item.user_id}-other")
        others = await keys.store.record(another_users)  # from memory: refused too
        claims = [await keys.store.record(item), await keys.store.record(item)]
        found = await keys.store.look(key, item.user_id)
        return [others, *claims], None if found is None else found.settled_as

    claims, settled = with_keys(notifier_settings, steps, KeyStoreFailingOneSettle)
    # Answered from memory, then from the row it wrote.
    assert [(c.state, c.settled_as) for c in claims] == [
        (KeyState.OTHER_USER, None),
        *[(KeyState.SETTLED, Settlement.PUSHED)] * 2,
    ]
    assert settled is Settlement.PUSHED


def test_an_unsettled_key_is_taken_over_once_held_past_the_bound(
    notifier_settings: NotifierSettings,
) -> None:
    """A holder that died (or never heard its write land) leaves the key unsettled: within
    the bound a new attempt is told to retry; past it, one attempt takes the key over and
    the old holder, back, no longer owns it."""
    item = notification()
    key = item.idempotency_key
    dead, late, later = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    async def steps(keys: Keys) -> list[KeyClaim]:
        claims = [await keys.store.record(item, dead)]
        await keys.age_hold(key, TAKEOVER_AFTER - timedelta(seconds=5))
        claims.append(await keys.store.record(item, late))
        await keys.age_hold(key, TAKEOVER_AFTER + timedelta(seconds=5))
        claims.append(await keys.store.record(item, late))
        # The new holder's hold is fresh.
        claims.append(await keys.store.record(item, later))
        claims.append(await keys.store.record(item, dead))
        return claims

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.RECORDED, dead, fresh=True),
        KeyClaim(KeyState.HELD_ELSEWHERE, dead),
        KeyClaim(KeyState.RECORDED, late, taken_over=True, fresh=True),
        KeyClaim(KeyState.HELD_ELSEWHERE, late),
        KeyClaim(KeyState.HELD_ELSEWHERE, late),
    ]


def test_concurrent_takeovers_of_a_stale_key_leave_one_holder(
    notifier_settings: NotifierSettings,
) -> None:
    item = notification()
    attempts = [uuid.uuid4() for _ in range(8)]
    leave_unsettled_key(  # by a holder that died 2 minutes ago
        notifier_settings, item.idempotency_key, item.user_id, accepted_ago=2 * TAKEOVER_AFTER
    )

    async def steps(keys: Keys) -> list[KeyClaim]:
        return list(await asyncio.gather(*(keys.store.record(item, a) for a in attempts)))

    claims = with_keys(notifier_settings, steps)
    winners = [c for c in claims if c.state is KeyState.RECORDED]
    [winner] = winners
    assert winner.taken_over
    assert {c.state for c in claims if c is not winner} == {KeyState.HELD_ELSEWHERE}


def test_a_released_key_is_recorded_at_once_by_the_next_attempt(
    notifier_settings: NotifierSettings,
) -> None:
    item = notification()
    stopping, next_attempt = uuid.uuid4(), uuid.uuid4()

    async def steps(keys: Keys) -> list[KeyClaim]:
        await keys.store.record(item, stopping)
        await keys.store.release(item.idempotency_key, stopping)
        return [await keys.store.record(item, next_attempt)]

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.RECORDED, next_attempt, fresh=True)
    ]


def test_a_slow_holders_settle_after_a_later_holder_released_the_key_reads_settled(
    notifier_settings: NotifierSettings,
) -> None:
    """A push slower than the takeover bound is taken over; the new holder, stopping,
    releases the key (an LWT delete); then the slow push ends and settles it (a plain
    write). The row is left with settle cells and no holder: the slow push did happen, so
    every later attempt is answered from the settlement, never with an error."""
    item = notification()
    slow, taker, later = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    async def steps(keys: Keys) -> list[KeyClaim]:
        claims = [await keys.store.record(item, slow)]
        await keys.age_hold(item.idempotency_key, TAKEOVER_AFTER + timedelta(seconds=5))
        claims.append(await keys.store.record(item, taker))
        await keys.store.release(item.idempotency_key, taker)
        await keys.store.settle(item.idempotency_key, item.user_id, Settlement.PUSHED)
        claims.append(await keys.store.record(item, later))
        return claims

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.RECORDED, slow, fresh=True),
        KeyClaim(KeyState.RECORDED, taker, taken_over=True, fresh=True),
        KeyClaim(KeyState.SETTLED, None, Settlement.PUSHED),
    ]


def test_a_settle_from_a_host_whose_clock_runs_behind_is_not_hidden_by_an_earlier_release(
    notifier_settings: NotifierSettings,
) -> None:
    """A notifier stopping released the key; another, on a host whose clock runs 2 s
    behind the database's, recorded, pushed and settled it. The release deleted the row
    (a tombstone stamped by Paxos, by the database's clock) and hid the settle (stamped
    by that host's clock): the key read held, unsettled, and was pushed again."""
    item = notification()
    stopping, pusher, later = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    async def steps(keys: Keys) -> list[KeyClaim]:
        await keys.store.record(item, stopping)
        await keys.store.release(item.idempotency_key, stopping)
        claims = [await keys.store.record(item, pusher)]
        cluster = keys.session.cluster
        own_clock = cluster.timestamp_generator
        cluster.timestamp_generator = lambda: own_clock() - 2_000_000  # 2 s behind
        try:
            await keys.store.settle(item.idempotency_key, item.user_id, Settlement.PUSHED)
        finally:
            cluster.timestamp_generator = own_clock
        claims.append(await keys.store.record(item, later))
        return claims

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.RECORDED, pusher, fresh=True),  # no takeover: the key was free
        KeyClaim(KeyState.SETTLED, pusher, Settlement.PUSHED),
    ]


def test_a_row_with_neither_holder_nor_settlement_is_taken_over(
    notifier_settings: NotifierSettings,
) -> None:
    item = notification()
    attempt = uuid.uuid4()
    settings = notifier_settings.cassandra
    with connect(settings) as connection:
        connection.session.execute(
            f"UPDATE {settings.keyspace}.notification_keys SET user_id = %s"
            " WHERE idempotency_key = %s",
            (item.user_id, item.idempotency_key),
        )

    async def steps(keys: Keys) -> list[KeyClaim]:
        return [
            await keys.store.record(item, attempt),
            await keys.store.record(item, uuid.uuid4()),
        ]

    assert with_keys(notifier_settings, steps) == [
        # Recorded as a released key is: there was no holder to count a takeover from.
        KeyClaim(KeyState.RECORDED, attempt, fresh=True),
        KeyClaim(KeyState.HELD_ELSEWHERE, attempt),
    ]


def test_a_refreshed_hold_is_live_again_and_a_lost_one_does_not_refresh(
    notifier_settings: NotifierSettings,
) -> None:
    """A holder whose item waited long to be pushed refreshes its hold first: an attempt
    past the bound then finds it live. A holder whose key was taken over meanwhile is told
    so, and the new holder's hold is left as it was."""
    kept, lost = notification(), notification()
    holder, retry = uuid.uuid4(), uuid.uuid4()

    async def steps(keys: Keys) -> tuple[list[KeyClaim], list[KeyHold | None], int]:
        hold = KeyHold(holder, since=None)
        for item in (kept, lost):
            await keys.store.record(item, holder)
            await keys.age_hold(item.idempotency_key, TAKEOVER_AFTER + timedelta(seconds=5))
        refreshed = await keys.store.refresh(kept.idempotency_key, hold)
        claims = [await keys.store.record(kept, retry), await keys.store.record(lost, retry)]
        taker_wrote = await keys.hold_written(lost.idempotency_key)
        refused = await keys.store.refresh(lost.idempotency_key, hold)
        unmoved = await keys.hold_written(lost.idempotency_key) - taker_wrote
        return claims, [refreshed, refused], unmoved

    claims, refreshes, unmoved = with_keys(notifier_settings, steps)

    assert claims == [
        KeyClaim(KeyState.HELD_ELSEWHERE, holder),
        KeyClaim(KeyState.RECORDED, retry, taken_over=True, fresh=True),
    ]
    refreshed, refused = refreshes
    assert refreshed is not None
    assert refreshed.accept_id == holder
    assert refreshed.since is not None  # when, known now
    assert refused is None
    assert unmoved == 0


class _HolderRefreshesAfterTheRead(KeyStore):
    """Between this attempt's read of a stale hold and its takeover, the holder (another
    replica) refreshes that hold: the interleaving a takeover must lose."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.holder: tuple[str, KeyHold] | None = None

    async def _read_row(self, key: str) -> Any:
        row = await super()._read_row(key)
        if self.holder is not None:
            refreshing, self.holder = self.holder, None
            assert await self.refresh(*refreshing) is not None
        return row


def test_a_hold_refreshed_after_a_takeover_judged_it_stale_is_not_taken_over(
    notifier_settings: NotifierSettings,
) -> None:
    """The takeover compares the hold as it judged it: a refresh in between wins, so the
    holder that refreshed is the only one to push."""
    item = notification()
    holder, retry = uuid.uuid4(), uuid.uuid4()

    async def steps(keys: Keys) -> KeyClaim:
        assert isinstance(keys.store, _HolderRefreshesAfterTheRead)
        await keys.store.record(item, holder)
        await keys.age_hold(item.idempotency_key, TAKEOVER_AFTER + timedelta(seconds=5))
        keys.store.holder = (item.idempotency_key, KeyHold(holder, since=None))
        return await keys.store.record(item, retry)

    claim = with_keys(notifier_settings, steps, store_type=_HolderRefreshesAfterTheRead)
    assert claim == KeyClaim(KeyState.HELD_ELSEWHERE, holder)


class _CountedRecords(KeyStore):
    records = 0

    async def record(
        self, notification: Notification, accept_id: uuid.UUID | None = None
    ) -> KeyClaim:
        self.records += 1
        return await super().record(notification, accept_id)


def test_a_stopping_notifier_records_no_key_for_an_item_still_waiting_for_a_slot(
    notifier_settings: NotifierSettings,
) -> None:
    """Past the shutdown grace, items waiting for a recording slot still recorded their
    keys, released just after: the last group's releases lost to the process's exit left
    those keys held, answered "another attempt is delivering this key" for a minute."""
    item = notification()

    async def steps(keys: Keys) -> tuple[ItemResult, object, int]:
        assert isinstance(keys.store, _CountedRecords)
        queue = DeliveryQueue()
        queue.close()  # the workers stopped
        limits = IntakeLimits(recording_slots=4, max_pending=100)
        metrics = NotifierMetrics(CollectorRegistry())
        intake = Intake(keys.store, queue, metrics, limits, lambda: datetime.now(UTC))
        [answer] = await intake.accept_batch([item])
        return answer, await keys.store.look(item.idempotency_key, item.user_id), keys.store.records

    answer, found, records = with_keys(notifier_settings, steps, _CountedRecords)

    assert answer.outcome is Outcome.RETRYABLE
    assert (found, records) == (None, 0)


class ReleasedBeforeItsRead(KeyStore):
    """The key's holder releases it (a notifier stopping) between this store's refused
    insert and its read of the row: what a second notifier saw at a rolling restart."""

    holder: uuid.UUID

    async def _read_row(self, key: str) -> Any:
        await KeyStore.release(self, key, self.holder)
        return await super()._read_row(key)


def test_a_key_released_between_a_refused_insert_and_its_read_is_recorded_afresh(
    notifier_settings: NotifierSettings,
) -> None:
    """It was answered "storage unavailable (KeyNotRecorded)", storage being fine, and sent
    an SRE after an outage that never was."""
    item = notification()
    holder = uuid.uuid4()

    async def steps(keys: Keys) -> KeyClaim:
        assert isinstance(keys.store, ReleasedBeforeItsRead)
        keys.store.holder = holder
        await keys.store.record(item, holder)  # the other notifier's hold
        return await keys.store.record(item, attempt)

    attempt = uuid.uuid4()
    assert with_keys(notifier_settings, steps, ReleasedBeforeItsRead) == KeyClaim(
        KeyState.RECORDED, attempt, fresh=True
    )
