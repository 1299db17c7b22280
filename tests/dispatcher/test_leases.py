"""Part leases on the real node: one live owner, epochs fence off a holder that lost it,
a take whose answer is lost is settled."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from cassandra import OperationTimedOut
from cassandra.cluster import Session
from cassandra.query import BatchStatement

from dispatcher.leases import PartLeases
from reminders_svc.storage.session import CassandraConnection

MINUTE = datetime(2026, 10, 26, 13, 0, tzinfo=UTC)


def test_a_part_has_one_owner_and_its_checkpoint_moves_only_under_the_lease(
    own_keyspace: CassandraConnection,
) -> None:
    async def scenario() -> None:
        a = PartLeases(own_keyspace.session, "a", timedelta(seconds=3))
        b = PartLeases(own_keyspace.session, "b", timedelta(seconds=3))
        lease_a = await a.try_take(5)
        assert lease_a is not None
        assert lease_a.epoch == 1
        assert await b.try_take(5) is None
        assert await a.checkpoint(lease_a, MINUTE)
        assert await a.renew(lease_a)

        # a freezes past its lease (as under SIGSTOP): the owner cell expires on the
        # database's clock and b takes the part with a new epoch.
        await asyncio.sleep(3.5)
        lease_b = await b.try_take(5)
        assert lease_b is not None
        assert (lease_b.epoch, lease_b.checkpoint) == (2, MINUTE)

        # a wakes up: its local deadline has passed and its epoch is stale everywhere.
        assert not lease_a.held()
        lease_a.valid_until = time.monotonic() + 60  # even if it believed otherwise
        assert not await a.checkpoint(lease_a, MINUTE + timedelta(minutes=5))
        assert not await a.renew(lease_a)
        states = {s.part: s for s in await b.states()}
        assert (states[5].owner, states[5].epoch, states[5].checkpoint) == ("b", 2, MINUTE)

        await b.release(lease_b)
        lease_a2 = await a.try_take(5)
        assert lease_a2 is not None
        assert lease_a2.epoch == 3

    asyncio.run(scenario())


class _ReplyLost:
    """A request's reply replaced by a timeout: sent (it may land), or never sent at all."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def add_callbacks(
        self,
        callback: Callable[..., None],
        errback: Callable[..., None],
        callback_args: tuple[Any, ...] = (),
        errback_args: tuple[Any, ...] = (),
    ) -> None:
        def lost(_: Any) -> None:
            errback(OperationTimedOut("the reply was lost"), *errback_args)

        if self._response is None:
            lost(None)
        else:
            self._response.add_callbacks(lost, lost)


class _TakesUnheard:
    """The real session, except that a take (the lease's batch) answers with a timeout."""

    def __init__(self, session: Session, *, sent: bool) -> None:
        self._session = session
        self._sent = sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def execute_async(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(statement, BatchStatement):
            return self._session.execute_async(statement, *args, **kwargs)
        if not self._sent:
            return _ReplyLost(None)
        return _ReplyLost(self._session.execute_async(statement, *args, **kwargs))


@pytest.mark.parametrize("sent", [True, False], ids=["landed", "never-sent"])
def test_a_take_whose_reply_is_lost_is_settled_not_left_to_lapse(
    own_keyspace: CassandraConnection, sent: bool
) -> None:
    async def scenario() -> None:
        session = cast(Session, _TakesUnheard(own_keyspace.session, sent=sent))
        leases = PartLeases(session, "a", timedelta(seconds=30))

        lease = await leases.try_take(7)

        states = {s.part: s for s in await leases.states()}
        if sent:
            # Ours, though the answer never came: worked now, not 30 s from now.
            assert lease is not None
            assert lease.epoch == 1
            assert lease.held()
            assert await leases.renew(lease)
            assert (states[7].owner, states[7].epoch) == ("a", 1)
        else:
            assert lease is None
            assert 7 not in states

    asyncio.run(scenario())
