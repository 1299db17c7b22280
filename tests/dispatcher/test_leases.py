"""Part leases on the real node: one live owner, epochs fence off a holder that lost it."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

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
