"""Part leases on the real node: one live owner, epochs fence off a holder that lost it,
a take whose answer is lost is settled."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

import grpc
import pytest
from cassandra import OperationTimedOut
from cassandra.cluster import Session
from cassandra.query import BatchStatement

from dispatcher.leases import Lease, PartLeases, PartState
from dispatcher.service import Dispatcher, Stores
from dispatcher.settings import DispatcherSettings
from reminders_svc.storage.parts import DEFAULT_PARTS
from reminders_svc.storage.session import CassandraConnection
from tests.unknown_outcome import cas_bound

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

    # The take lands at once or never: its settling read need not wait out the
    # development node's generous CAS bound (15 s).
    with cas_bound(own_keyspace.session, 1.0):
        asyncio.run(scenario())


D = TypeVar("D", bound=Dispatcher)


@contextlib.asynccontextmanager
async def _running(
    kind: type[D], settings: DispatcherSettings, keyspace: CassandraConnection
) -> AsyncIterator[D]:
    """A dispatcher of `kind` running in this loop, stopped on the way out. It takes parts
    once it has reached a notifier: any gRPC server will do."""
    notifier = grpc.aio.server()
    port = notifier.add_insecure_port("127.0.0.1:0")
    await notifier.start()
    reaching = dataclasses.replace(settings, notifier_target=f"127.0.0.1:{port}")
    dispatcher = kind(reaching, keyspace.settings)
    running = asyncio.create_task(dispatcher.run())
    try:
        yield dispatcher
    finally:
        dispatcher.stop()
        await running
        await notifier.stop(None)


class _BalanceHangs(Dispatcher):
    """A dispatcher whose part balance hangs once, 12 s, on its read of the fleet's members
    (a node that stopped answering without closing its connections); it counts its reads
    of every part's state."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.hang = asyncio.Event()
        self.hung = asyncio.Event()
        self.state_reads = 0

    async def _connect(self) -> Stores:
        store, history, leases, reader = await super()._connect()
        members, states = leases.members, leases.states

        async def counted_states() -> list[PartState]:
            self.state_reads += 1
            return await states()

        leases.states = counted_states  # type: ignore[method-assign]

        async def slow_members() -> set[str]:
            if self.hang.is_set() and not self.hung.is_set():
                self.hung.set()
                await asyncio.sleep(12)
            return await members()

        leases.members = slow_members  # type: ignore[method-assign]
        return store, history, leases, reader


def test_a_hanging_balance_delays_no_lease_renewal(
    own_keyspace: CassandraConnection,
) -> None:
    """Renewals run on their own: a statement of the balance that hangs past the lease
    (6 s here; its local deadline 4.8 s) costs no part its lease, so no part is dropped
    and taken again (a new epoch) with its open minutes. And a dispatcher holding its
    share reads no part's state meanwhile (a scan of the whole table, every tick of
    every pod of a fleet)."""
    settings = DispatcherSettings(
        dispatcher_id="d",
        port=0,
        metrics_port=0,
        lease=timedelta(seconds=6),
        lease_renew_every=timedelta(seconds=2),
    )

    def epochs() -> dict[int, int]:
        rows = own_keyspace.session.execute("SELECT part, epoch, owner FROM dispatch_parts")
        return {row.part: row.epoch for row in rows if row.owner == "d"}

    async def scenario() -> tuple[dict[int, int], dict[int, int], float, int]:
        async with _running(_BalanceHangs, settings, own_keyspace) as dispatcher:
            async with asyncio.timeout(60):
                while len(before := await asyncio.to_thread(epochs)) < DEFAULT_PARTS:  # noqa: ASYNC110
                    await asyncio.sleep(0.5)
            await asyncio.sleep(4)  # two ticks holding every part, the share of a fleet of one
            reads_once_holding = dispatcher.state_reads
            dispatcher.hang.set()
            await asyncio.wait_for(dispatcher.hung.wait(), timeout=10)
            await asyncio.sleep(14)  # the hang, and a tick after it
            after = await asyncio.to_thread(epochs)
            takeovers = dispatcher.metrics.registry.get_sample_value(
                "reminders_dispatch_lease_takeovers_total"
            )
            reads = dispatcher.state_reads - reads_once_holding
            return before, after, takeovers or 0.0, reads

    before, after, takeovers, state_reads = asyncio.run(scenario())

    assert after == before
    assert takeovers == 0
    assert state_reads == 0


class _PartZeroFails(Dispatcher):
    """A dispatcher whose worker of part 0 fails at once, every time (a grant on its
    bucket revoked, say); it counts its takes of that part."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.takes_of_zero = 0

    def _start_worker(self, lease: Lease) -> None:
        super()._start_worker(lease)
        if lease.part == 0:
            self.takes_of_zero += 1
            worker, started = self._workers[0]
            started.cancel()
            self._workers[0] = (worker, asyncio.create_task(self._fail()))

    async def _fail(self) -> None:
        raise RuntimeError("a worker that fails at once")


def test_a_part_whose_worker_keeps_failing_is_taken_again_ever_more_slowly(
    own_keyspace: CassandraConnection,
) -> None:
    """It was released and taken again every second, forever (LWTs and a traceback each
    time), while the pod stayed ready; the other parts are worked as before."""
    settings = DispatcherSettings(
        dispatcher_id="d", port=0, metrics_port=0, lease_renew_every=timedelta(seconds=2)
    )

    async def scenario() -> tuple[int, float, int]:
        async with _running(_PartZeroFails, settings, own_keyspace) as dispatcher:
            async with asyncio.timeout(60):
                while dispatcher.takes_of_zero == 0:  # noqa: ASYNC110
                    await asyncio.sleep(0.2)
            await asyncio.sleep(12)
            failures = dispatcher.metrics.registry.get_sample_value(
                "reminders_dispatch_part_failures_total"
            )
            return dispatcher.takes_of_zero, failures or 0.0, len(dispatcher._workers)

    takes, failures, working = asyncio.run(scenario())

    # Taken, failed, 5 s off, taken, failed, 10 s off: twice or three times in 12 s.
    assert 2 <= takes <= 3, takes
    assert failures >= takes - 1
    assert working >= DEFAULT_PARTS - 1  # every other part held throughout
