"""The dispatcher process: leases parts, works them, serves health and metrics.

Leases: every `lease_renew_every`, all leases held are renewed at once, in a task of
their own (a lease that cannot be renewed is dropped and its worker cancelled): a slow
statement of the balance, the clock check or one part's renewal delays no other renewal.

Part balance: every `lease_renew_every`, release the leases of parts whose work
ended, write a heartbeat (with a TTL) into `dispatcher_members`, then take free parts
while holding fewer than ceil(P / live dispatchers); hold more than that and the extra
parts are handed over. A dispatcher whose clock is off by more than the bound is not
ready: it takes no part and hands nothing off, and once its clock has been known off for
a lease's length it hands over the parts it holds.

Winding a part down (SIGTERM for every part, a hand-over for one): at once, no new
minute is read and no new ring claimed; rings already with the notifier finish, claims
not handed off are let go (re-claimed by the next owner at once, under the same key);
the lease is renewed meanwhile and released as soon as the part is done. Whatever is
still running after the shutdown grace is cancelled, letting its claims go. At a SIGTERM
the dispatcher also leaves the fleet's count at once, so the others take each part as soon
as it is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import Callable
from datetime import timedelta

import grpc
from grpc_health.v1 import health_pb2_grpc

from dispatcher.buckets import BucketReader
from dispatcher.handoff import NotifierClient
from dispatcher.leases import Lease, PartLeases, PartState
from dispatcher.metrics import DispatcherMetrics
from dispatcher.minutes import PartWorker
from dispatcher.ratelimit import RateLimiter
from dispatcher.ringer import HandoffBatcher, Ringer
from dispatcher.settings import DispatcherSettings
from reminders_svc.api.undecodable import TolerantRequests
from reminders_svc.concurrency import unless_stopped
from reminders_svc.config import CassandraSettings
from reminders_svc.connections import SERVER_OPTIONS
from reminders_svc.health import ProcessHealth
from reminders_svc.runtime import MetricsEndpoint, on_stop_signals, stop_unless_waited_out
from reminders_svc.storage.clock import HOOKED_AHEAD_S, DbClock, wall_clock_ahead
from reminders_svc.storage.errors import STORAGE_ERRORS
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.loop_reactor import (
    built_patiently,
    close_on_loop,
    connect_on_loop_patiently,
)
from reminders_svc.storage.migrations import require_current_schema
from reminders_svc.storage.parts import PartCounts, floor_minute
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import CassandraConnection
from reminders_svc.tls import add_port

log = logging.getLogger(__name__)
_MIN_TICK_GAP_S = 1.0


class PartCooldowns:
    """Parts whose worker failed, kept from this dispatcher for a while: released and taken
    again at every tick, such a part cost LWTs and a traceback a second, forever, while
    its rings waited (another dispatcher may take it meanwhile). The wait doubles with
    each failure in a row, from `FIRST_S` to `LONGEST_S`; a failure that comes after a
    quiet `LONGEST_S` starts again from the first."""

    FIRST_S = 5.0
    LONGEST_S = 300.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._waits: dict[int, tuple[float, float]] = {}  # part -> (wait, until)

    def failed(self, part: int) -> float:
        """Note a failure of `part`'s worker; the wait before it is taken here again."""
        now = self._clock()
        wait, until = self._waits.get(part, (0.0, -math.inf))
        wait = self.FIRST_S if now > until + self.LONGEST_S else min(2 * wait, self.LONGEST_S)
        self._waits[part] = (wait, now + wait)
        return wait

    def cooling(self, part: int) -> bool:
        return part in self._waits and self._clock() < self._waits[part][1]


Stores = tuple[ReminderStore, DeliveryHistory, PartLeases, BucketReader]


class Dispatcher:
    def __init__(self, settings: DispatcherSettings, cassandra: CassandraSettings) -> None:
        self.settings = settings
        self._cassandra = cassandra
        self.metrics = DispatcherMetrics()
        # Ready while its clock agrees with the database's, once the notifier was reached.
        self._health = ProcessHealth(("",), self.metrics.clock_ready)
        self._workers: dict[int, tuple[PartWorker, asyncio.Task[None]]] = {}
        self._cooldowns = PartCooldowns()
        self._stopping = asyncio.Event()
        self._off_since: float | None = None  # monotonic
        self._unreached_since: float | None = None  # monotonic; inf once told
        self._connection: CassandraConnection | None = None
        self._server: grpc.aio.Server | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None
        self.port = settings.port
        self.metrics_port = settings.metrics_port

    async def run(self) -> None:
        """Until `stop()` (or SIGTERM via `serve`), then drain and release."""
        try:
            await self._start_health()
            log.info(
                "dispatcher %s: health on %s:%d, metrics on :%d, notifier %s",
                self.settings.dispatcher_id,
                self.settings.host,
                self.port,
                self.metrics_port,
                self.settings.notifier_target,
            )
            with stop_unless_waited_out("setting up storage"):
                stores = await unless_stopped(self._connect(), self._stopping)
            if stores is not None:
                await self._work(stores)
        finally:
            await self._close()
            log.info("stopped")

    async def _connect(self) -> Stores:
        """Connect and prepare, waiting (not ready) while the database does not answer."""
        retry_s = self.settings.lease_renew_every.total_seconds()
        self._connection = await connect_on_loop_patiently(self._cassandra, retry_s)
        session = self._connection.session
        keyspace = self._connection.settings.keyspace

        def prepared() -> Stores:
            require_current_schema(session, keyspace)
            return (
                ReminderStore(session, self.settings.retention),
                DeliveryHistory(session, self.settings.retention.history),
                PartLeases(
                    session,
                    self.settings.dispatcher_id,
                    self.settings.lease,
                    renew_timeout=self.settings.lease_renew_every,
                ),
                BucketReader(session),
            )

        return await built_patiently(prepared, retry_s, "preparing statements")

    async def _work(self, stores: Stores) -> None:
        assert self._connection is not None
        session = self._connection.session
        self.clock = DbClock(
            session, self.settings.max_clock_offset, wall=_host_clock(self.settings.faults)
        )
        store, history, self._leases, self._reader = stores
        self._parts = PartCounts(session)
        self._notifier = NotifierClient(
            self.settings.notifier_target, tls=self.settings.notifier_tls
        )
        self._notifier.connect()
        batcher = HandoffBatcher(
            self._notifier, self.settings.batch_size, faults=self.settings.faults
        )
        self._ringer = Ringer(store, history, batcher, self.clock, self.settings, self.metrics)
        self._catch_up = RateLimiter(self.settings.catch_up_minutes_per_s)
        renewing = asyncio.create_task(self._keep_renewing(), name="lease-renewals")
        try:
            while not self._stopping.is_set():
                if renewing.done():
                    renewing.result()  # failed unexpectedly: fail the process, as a tick would
                await self._tick()
                await self._until_next_tick()
        finally:
            try:
                # Leases are renewed on their own meanwhile, not between releases that
                # may each take a request timeout.
                await self._drain()
            finally:
                renewing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renewing

    def stop(self) -> None:
        self._stopping.set()

    async def _until_next_tick(self) -> None:
        """The renewal period, cut short by a stop or by a part's work ending (a part handed
        over, say: its lease is then released at once, not a period later)."""
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            # Never sooner than a second: a part whose work fails at once must not be
            # released and taken again in a loop of LWTs.
            await asyncio.wait({stop}, timeout=_MIN_TICK_GAP_S)
            await asyncio.wait(
                {stop, *(task for _, task in self._workers.values())},
                timeout=self.settings.lease_renew_every.total_seconds() - _MIN_TICK_GAP_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            stop.cancel()

    async def _tick(self) -> None:
        # A SIGTERM cuts the tick short: the drain waits for it, and the pod's termination
        # grace counts from the signal (operations.md).
        try:
            await unless_stopped(self.clock.measure(), self._stopping)
        except Exception as error:  # the probe failing is "not ready", not a crash
            log.warning("clock check failed: %s", type(error).__name__)
        if self._stopping.is_set():
            return  # the drain releases what this tick would have
        ready = self.clock.ready()
        reached = self._notifier.reached()
        self.metrics.clock_offset.set(self.clock.offset_s)
        await self._health.set_ready(ready and reached, gauged=ready)  # the gauge: the clock
        await self._tend()
        if not ready:
            # No part taken, nor this dispatcher counted in the fleet's shares (others take
            # them), on a clock not checked: it tells a part's minutes live or past.
            self._hand_over_if_long_off()
            self._report()
            return
        self._off_since = None
        if not reached:
            # Nor before the notifier was reached once: parts taken by a pod whose settings
            # cannot reach it (a wrong target, CA or server name) would wait for it, their
            # rings with them, while the rollout, this pod ready, went on to the next pod.
            self._tell_unreached()
            self._report()
            return
        try:
            await self._balance()
        except STORAGE_ERRORS as error:
            # The parts held are worked on (their leases run on their own deadlines); the
            # share is looked at again next tick.
            log.warning("part balance skipped: storage did not answer (%s)", type(error).__name__)
        self._report()

    def _tell_unreached(self) -> None:
        """Logged once a lease's length has passed without the notifier reached."""
        now = time.monotonic()
        if self._unreached_since is None:
            self._unreached_since = now
        elif now - self._unreached_since >= self.settings.lease.total_seconds():
            self._unreached_since = math.inf  # told
            log.warning(
                "the notifier at %s has not been reached since start: no part taken, not"
                " ready (check REMINDERS_NOTIFIER_TARGET and its TLS settings)",
                self.settings.notifier_target,
            )

    def _hand_over_if_long_off(self) -> None:
        """The host's clock known off for a lease's length: wind every part down and
        release it, as a dead dispatcher's would lapse, so the fleet rings them instead of
        their rings waiting on a clock that may not come back. Not for slow probes (a busy
        database, a lagging loop: the fleet would only trade its parts around), nor
        sooner than a lease."""
        if not self.clock.known_off():
            self._off_since = None
            return
        now = time.monotonic()
        if self._off_since is None:
            self._off_since = now
        if now - self._off_since < self.settings.lease.total_seconds():
            return
        for part, (worker, _) in sorted(self._workers.items()):
            if not worker.shift.stopping:
                log.warning("part %d: handed over, this dispatcher's clock is not ready", part)
                worker.stop()

    async def _keep_renewing(self) -> None:
        """A round every period from the start of the last, not from its end: a round held
        up to its timeout (one period) must not push the next one past the leases' margin."""
        period_s = self.settings.lease_renew_every.total_seconds()
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        while True:
            await self._renew()
            next_round = max(next_round + period_s, loop.time())
            await asyncio.sleep(next_round - loop.time())

    async def _tend(self) -> None:
        """Release the leases of parts whose work ended; cut short a wind-down that
        outlasted the shutdown grace."""
        grace_s = self.settings.shutdown_grace.total_seconds()
        ended = [part for part, (_, task) in self._workers.items() if task.done()]
        released = [self._workers.pop(part) for part in ended]
        # All at once: one by one, a pod of 32 parts on a slow database could spend
        # 32 request timeouts here, past its pod's termination grace.
        await asyncio.gather(*(self._release(worker, task) for worker, task in released))
        for worker, task in self._workers.values():
            if worker.shift.stopped_for_s() > grace_s and not task.cancelling():
                task.cancel()  # its rings let their claims go as they are cancelled

    async def _renew(self) -> None:
        """Renew, all at once, the leases of parts being worked or wound down."""
        await asyncio.gather(
            *(
                self._renew_one(part, worker, task)
                for part, (worker, task) in list(self._workers.items())
                if not task.done() and not worker.lease.ended  # ended: known lost
            )
        )

    async def _renew_one(self, part: int, worker: PartWorker, task: asyncio.Task[None]) -> None:
        try:
            renewed = await self._leases.renew(worker.lease)
        except STORAGE_ERRORS as error:
            # Not renewed this time; the lease's local deadline stops the work if this
            # keeps failing.
            log.warning("part %d: lease renewal failed (%s)", part, type(error).__name__)
            return
        if not renewed and not task.done():  # done: released meanwhile, not lost
            self.metrics.leases_lost.inc()
            task.cancel()

    async def _release(self, worker: PartWorker, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            wait_s = self._cooldowns.failed(worker.lease.part)
            self.metrics.part_failures.inc()
            log.error(
                "part %d: its worker failed; not taken here again for %g s",
                worker.lease.part,
                wait_s,
                exc_info=task.exception(),
            )
        if not worker.lease.held():
            return
        try:
            await self._leases.release(worker.lease)
        except STORAGE_ERRORS as error:
            log.warning(
                "part %d: lease release failed (%s); it expires by itself",
                worker.lease.part,
                type(error).__name__,
            )

    async def _balance(self) -> None:
        # The share's statements are abandoned at a SIGTERM: each may take a request
        # timeout, which the drain and the pod's termination grace would wait for. (They
        # only read, and heartbeat: cut anywhere, they leave nothing behind.)
        share = await unless_stopped(self._share(), self._stopping)
        if share is None:
            return
        parts, target, working, states = share
        held = len(working)
        by_part = {state.part: state for state in states}  # P may be tens of thousands
        for part in range(parts):
            if held >= target or self._stopping.is_set():
                break  # stopping: each take is an LWT the drain would wait for, to no end
            if part in self._workers or self._cooldowns.cooling(part):
                continue
            previous = by_part.get(part)
            if previous is not None and previous.owner is not None:
                continue
            lease = await self._leases.try_take(part)
            if lease is None:
                continue
            if previous is not None and previous.epoch > 0:
                self.metrics.lease_takeovers.inc()
            self._start_worker(lease)
            held += 1
        for part in working[target:]:
            # Hand the part over: it winds down as on SIGTERM and its lease is released once
            # it is done; the next owner resumes from the checkpoint (the row decides, the
            # key dedupes a re-send).
            self._workers[part][0].stop()

    async def _share(self) -> tuple[int, int, list[int], list[PartState]]:
        """The parts in force, this dispatcher's share of them, the parts it works (not
        winding down), and, when it holds fewer than its share, every part's state."""
        # Size the share by the P in force by the time the next tick could act, so parts
        # added by a grow are leased before their first minute, not after it.
        ahead = self.settings.prefetch + self.settings.lease_renew_every
        parts = await self._parts.parts_at(floor_minute(self.clock.now() + ahead))
        self.metrics.parts.set(parts)
        await self._leases.heartbeat()
        target = math.ceil(parts / len(await self._leases.members()))
        working = sorted(part for part, (w, _) in self._workers.items() if not w.shift.stopping)
        # Every part's state is a read of the whole (small) table: only when there is a part
        # to take, not on every tick of every pod of a fleet that holds its shares.
        states = await self._leases.states() if len(working) < target else []
        return parts, target, working, states

    def _start_worker(self, lease: Lease) -> None:
        worker = PartWorker(
            lease,
            self._leases,
            self._reader,
            self._ringer,
            self.clock,
            self.settings,
            self.metrics,
            self._catch_up,
        )
        task = asyncio.create_task(worker.run(), name=f"part-{lease.part}")
        self._workers[lease.part] = (worker, task)

    def _report(self) -> None:
        self.metrics.started.set(1)  # a first tick reported: the alerts may read its gauges
        now = self.clock.now()
        # Parts whose lease is known lost are not owned, though their worker still ends.
        self.metrics.parts_owned.set(sum(1 for w, _ in self._workers.values() if w.lease.held()))
        unfinished = [w.oldest_unfinished for w, _ in self._workers.values() if w.oldest_unfinished]
        # The age of the oldest unfinished minute: up to a minute plus the grace when keeping up.
        lag = max(((now - m).total_seconds() for m in unfinished), default=0.0)
        self.metrics.checkpoint_lag.set(max(0.0, lag))
        self.metrics.catch_up_backlog.set(
            sum(max(0.0, (now - m) / timedelta(minutes=1) - 2) for m in unfinished)
        )
        self.metrics.notifier_reachable.set(0 if self._notifier.connection_failing() else 1)
        self.metrics.notifier_refusing.set(1 if self._notifier.refusals.open() else 0)
        claims = self._ringer.claimed_since.values()
        self.metrics.oldest_claim.set(max(((now - c).total_seconds() for c in claims), default=0))

    async def _drain(self) -> None:
        log.info(
            "shutting down: finishing the rings under way in %d parts for up to %s, "
            "then releasing their leases",
            len(self._workers),
            self.settings.shutdown_grace,
        )
        await self._health.shut_down()
        for worker, _ in self._workers.values():
            worker.stop()
        # Out of the fleet's count at once, not when the heartbeat expires (a lease's
        # length): the others' shares grow now, so each part released below is taken at
        # their next tick.
        leaving = asyncio.create_task(self._leave())
        try:
            # Until every part is done: keep the leases, release each as its part is done.
            renew_s = self.settings.lease_renew_every.total_seconds()
            while self._workers:
                await self._tend()
                # Parts released leave the count as they go: a pod winding down for minutes
                # must not hide from RemindersPartsWithoutOwner parts nobody holds.
                self._report()
                running = [task for _, task in self._workers.values()]
                if running:
                    await asyncio.wait(
                        running, timeout=renew_s, return_when=asyncio.FIRST_COMPLETED
                    )
        finally:
            left = await leaving  # never left pending, whatever ends the drain
        if not left:
            await self._leave()  # a second try, the parts all released
        await self._notifier.close()

    async def _leave(self) -> bool:
        try:
            await self._leases.leave()
        except STORAGE_ERRORS as error:
            log.warning(
                "leaving the fleet failed (%s); the heartbeat expires", type(error).__name__
            )
            return False
        return True

    async def _close(self) -> None:
        await self._health.shut_down()
        if self._server is not None:
            await self._server.stop(1)
        if self._connection is not None:
            await close_on_loop(self._connection)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()

    async def _start_health(self) -> None:
        server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=[TolerantRequests()])
        health_pb2_grpc.add_HealthServicer_to_server(self._health.servicer, server)
        await self._health.start()
        self._server = server  # stopped by _close() even if what follows fails
        self.port = add_port(server, self.settings.host, self.settings.port, None)
        await server.start()
        self._metrics_endpoint = MetricsEndpoint(
            self.metrics.registry, self.settings.host, self.settings.metrics_port
        )
        self.metrics_port = self._metrics_endpoint.port


def _host_clock(faults: frozenset[str]) -> Callable[[], float]:
    """The host's wall clock; 30 s ahead under the test hook `wall_clock_ahead` (a host
    whose clock is off: the dispatcher must say not ready and take no part), or from the
    first SIGUSR1 on under `wall_clock_ahead_on_sigusr1` (a clock going bad while parts
    are held)."""
    if "wall_clock_ahead" in faults:
        return wall_clock_ahead()
    if "wall_clock_ahead_on_sigusr1" in faults:
        ahead_s = [0.0]
        signal.signal(signal.SIGUSR1, lambda *_: ahead_s.__setitem__(0, HOOKED_AHEAD_S))
        return lambda: time.time() + ahead_s[0]
    return time.time


async def serve(settings: DispatcherSettings, cassandra: CassandraSettings) -> None:
    dispatcher = Dispatcher(settings, cassandra)
    on_stop_signals(dispatcher.stop)
    await dispatcher.run()
