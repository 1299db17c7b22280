"""The notifier's idempotency keys on the real node: whose a recorded key is, when a later
attempt may take it over, and what a settled key answers."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from notifier.domain.model import Notification, Priority, Settlement
from notifier.settings import NotifierSettings
from notifier.storage.keys import KeyClaim, KeyState, KeyStore
from reminders_svc.storage.session import connect
from tests.notifier.conftest import leave_unsettled_key

TAKEOVER_AFTER = timedelta(seconds=60)


def with_keys(
    notifier_settings: NotifierSettings,
    steps: Callable[[KeyStore, list[timedelta]], Awaitable[list[KeyClaim]]],
) -> list[KeyClaim]:
    """Runs `steps` on a KeyStore whose clock runs ahead of the real one by the last
    value of the list it is given (the test appends to move it)."""
    settings = notifier_settings.cassandra
    ahead = [timedelta(0)]

    async def run() -> list[KeyClaim]:
        with connect(settings) as connection:
            keys = KeyStore(
                connection.session,
                settings.keyspace,
                notifier_settings.key_ttl,
                TAKEOVER_AFTER,
                lambda: datetime.now(UTC) + ahead[-1],
            )
            return await steps(keys, ahead)

    return asyncio.run(run())


def notification() -> Notification:
    return Notification(f"k-{uuid.uuid4()}", "u-keys", Priority.URGENT, "title", "body")


def test_a_key_is_this_attempts_own_when_the_row_holds_its_accept_id(
    notifier_settings: NotifierSettings,
) -> None:
    """A re-sent insert of an attempt whose first insert landed (its reply lost) finds the
    attempt's own row: that is "recorded, deliver it", not "another attempt has it"."""
    item = notification()
    first_attempt, second_attempt = uuid.uuid4(), uuid.uuid4()

    async def steps(keys: KeyStore, _: list[timedelta]) -> list[KeyClaim]:
        return [
            await keys.record(item, first_attempt),
            await keys.record(item, first_attempt),  # the same insert, sent again
            await keys.record(item, second_attempt),  # another attempt at the same key
        ]

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.RECORDED, first_attempt),
        KeyClaim(KeyState.RECORDED, first_attempt),
        KeyClaim(KeyState.HELD_ELSEWHERE, first_attempt),
    ]


def test_a_settled_key_answers_its_settlement_to_every_later_attempt(
    notifier_settings: NotifierSettings,
) -> None:
    pushed, expired = notification(), notification()
    holder = uuid.uuid4()

    async def steps(keys: KeyStore, ahead: list[timedelta]) -> list[KeyClaim]:
        await keys.record(pushed, holder)
        await keys.settle(pushed.idempotency_key, Settlement.PUSHED)
        await keys.record(expired, holder)
        await keys.settle(expired.idempotency_key, Settlement.EXPIRED)
        ahead.append(TAKEOVER_AFTER * 10)  # settled keys are never taken over
        return [await keys.record(pushed), await keys.record(expired)]

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.SETTLED, holder, Settlement.PUSHED),
        KeyClaim(KeyState.SETTLED, holder, Settlement.EXPIRED),
    ]


def test_an_unsettled_key_is_taken_over_once_held_past_the_bound(
    notifier_settings: NotifierSettings,
) -> None:
    """A holder that died (or never heard its write land) leaves the key unsettled: within
    the bound a new attempt is told to retry; past it, one attempt takes the key over and
    the old holder, back, no longer owns it."""
    item = notification()
    dead, late, later = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    async def steps(keys: KeyStore, ahead: list[timedelta]) -> list[KeyClaim]:
        claims = [await keys.record(item, dead)]
        ahead.append(TAKEOVER_AFTER - timedelta(seconds=5))
        claims.append(await keys.record(item, late))
        ahead.append(TAKEOVER_AFTER + timedelta(seconds=5))
        claims.append(await keys.record(item, late))
        ahead.append(timedelta(0))  # the new holder's hold is fresh
        claims.append(await keys.record(item, later))
        claims.append(await keys.record(item, dead))
        return claims

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.RECORDED, dead),
        KeyClaim(KeyState.HELD_ELSEWHERE, dead),
        KeyClaim(KeyState.RECORDED, late, taken_over=True),
        KeyClaim(KeyState.HELD_ELSEWHERE, late),
        KeyClaim(KeyState.HELD_ELSEWHERE, late),
    ]


def test_concurrent_takeovers_of_a_stale_key_leave_one_holder(
    notifier_settings: NotifierSettings,
) -> None:
    item = notification()
    attempts = [uuid.uuid4() for _ in range(8)]
    leave_unsettled_key(  # by a holder that died 2 minutes ago
        notifier_settings,
        item.idempotency_key,
        item.user_id,
        datetime.now(UTC) - 2 * TAKEOVER_AFTER,
    )

    async def steps(keys: KeyStore, ahead: list[timedelta]) -> list[KeyClaim]:
        return list(await asyncio.gather(*(keys.record(item, a) for a in attempts)))

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

    async def steps(keys: KeyStore, _: list[timedelta]) -> list[KeyClaim]:
        await keys.record(item, stopping)
        await keys.release(item.idempotency_key, stopping)
        return [await keys.record(item, next_attempt)]

    assert with_keys(notifier_settings, steps) == [KeyClaim(KeyState.RECORDED, next_attempt)]


def test_a_slow_holders_settle_after_a_later_holder_released_the_key_reads_settled(
    notifier_settings: NotifierSettings,
) -> None:
    """A push slower than the takeover bound is taken over; the new holder, stopping,
    releases the key (an LWT delete); then the slow push ends and settles it (a plain
    write). The row is left with settle cells and no holder: the slow push did happen, so
    every later attempt is answered from the settlement, never with an error."""
    item = notification()
    slow, taker, later = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    async def steps(keys: KeyStore, ahead: list[timedelta]) -> list[KeyClaim]:
        claims = [await keys.record(item, slow)]
        ahead.append(TAKEOVER_AFTER + timedelta(seconds=5))
        claims.append(await keys.record(item, taker))
        await keys.release(item.idempotency_key, taker)
        await keys.settle(item.idempotency_key, Settlement.PUSHED)
        claims.append(await keys.record(item, later))
        return claims

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.RECORDED, slow),
        KeyClaim(KeyState.RECORDED, taker, taken_over=True),
        KeyClaim(KeyState.SETTLED, None, Settlement.PUSHED),
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

    async def steps(keys: KeyStore, _: list[timedelta]) -> list[KeyClaim]:
        return [await keys.record(item, attempt), await keys.record(item, uuid.uuid4())]

    assert with_keys(notifier_settings, steps) == [
        KeyClaim(KeyState.RECORDED, attempt, taken_over=True),
        KeyClaim(KeyState.HELD_ELSEWHERE, attempt),
    ]
