"""A cassandra-driver connection whose socket I/O runs on one asyncio event loop.

The driver's own reactors (libev, asyncore, its asyncio one) each run a second thread.
In a grpc.aio server that thread and the event loop then take turns on the interpreter
lock for every statement: a request is encoded on the loop, sent and answered on the
reactor thread, and its result handed back with `call_soon_threadsafe` (a self-pipe
write and a loop wake-up). `LoopConnection` instead reads and writes the driver's
sockets from the loop the service already runs, so a statement's whole round trip stays
on one thread.

Rules:
- Each cluster gets its own class from `LoopConnection.on(loop)` (the driver asks the
  class, not a connection, for timers), so several loops in one process (tests) are fine.
- Never call the driver's blocking API (`Session.execute`, `prepare`, `Cluster.connect`,
  `shutdown`) on the loop's thread: it would wait for I/O that only that thread can do.
  Call them through `asyncio.to_thread`, or `in_daemon_thread` where a stop must not wait
  for them; the driver's own threads (control connection, pool refills, heartbeats)
  already run off the loop and are safe.
- Everything else (`push`, timers, `close`) may be called from any thread.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import errno
import logging
import socket
import ssl
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, TypeVar

import cassandra.cluster
from cassandra.cluster import Cluster
from cassandra.connection import Connection, ConnectionShutdown

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.errors import STORAGE_ERRORS
from reminders_svc.storage.session import CassandraConnection, connect_cluster, new_cluster

log = logging.getLogger(__name__)

T = TypeVar("T")

_RETRY_LATER = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINPROGRESS})


class LoopTimer:
    """The driver's timer interface (`cancel`) over `loop.call_later`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_loop_thread: bool,
        timeout: float,
        callback: Callable[[], Any],
    ) -> None:
        self._handle: asyncio.TimerHandle | None = None
        self._canceled = False
        try:
            if on_loop_thread:
                self._handle = loop.call_later(timeout, callback)
            else:
                loop.call_soon_threadsafe(self._arm, loop, timeout, callback)
        except RuntimeError:  # the loop is closed (the process is exiting): it never fires
            self._canceled = True

    def _arm(
        self, loop: asyncio.AbstractEventLoop, timeout: float, callback: Callable[[], Any]
    ) -> None:
        if not self._canceled:
            self._handle = loop.call_later(timeout, callback)

    def cancel(self) -> None:
        # TimerHandle.cancel is not thread-safe, but only flags the handle: the loop skips
        # it when it comes due. A cancel before `_arm` ran is caught by the flag.
        self._canceled = True
        if self._handle is not None:
            self._handle.cancel()


class LoopConnection(Connection):  # type: ignore[misc]  # the driver is untyped
    _loop: ClassVar[asyncio.AbstractEventLoop | None] = None
    _loop_thread: ClassVar[int | None] = None
    # Per class (`on`): its connections still open, and whether it was given up (`abandon`),
    # both under `_live_lock` (driver threads open connections while the loop abandons).
    _live: ClassVar[weakref.WeakSet[LoopConnection]]
    _live_lock: ClassVar[threading.Lock]
    _abandoned: ClassVar[bool] = False
    is_closed: bool  # the driver's, declared for the type checker

    @classmethod
    def on(cls, loop: asyncio.AbstractEventLoop, thread_id: int) -> type[LoopConnection]:
        """A connection class whose I/O runs on `loop`, which runs on thread `thread_id`."""
        attributes = {
            "_loop": loop,
            "_loop_thread": thread_id,
            "_live": weakref.WeakSet(),
            "_live_lock": threading.Lock(),
        }
        return type(f"{cls.__name__}_{thread_id}", (cls,), attributes)

    @classmethod
    def abandon(cls) -> None:
        """Close this class's connections and refuse new ones, on the loop's thread: its
        process is stopping. What the driver's threads wait for (a connect, a pool being
        filled, a request) then fails at once, rather than at its timeout, after the loop
        that would have read the answer is gone: the process exits without waiting."""
        with cls._live_lock:
            cls._abandoned = True
            connections = list(cls._live)
        for connection in connections:
            try:
                connection.close()
            except Exception:  # one connection's trouble must not keep the others open
                log.exception("closing the connection to %s failed", connection.endpoint)

    @classmethod
    def on_loop_thread(cls) -> bool:
        return threading.get_ident() == cls._loop_thread

    @classmethod
    def initialize_reactor(cls) -> None:
        if cls._loop is None:
            raise RuntimeError("connect with LoopConnection.on(loop, thread), not LoopConnection")

    @classmethod
    def create_timer(cls, timeout: float, callback: Callable[[], Any]) -> LoopTimer:
        assert cls._loop is not None
        return LoopTimer(cls._loop, cls.on_loop_thread(), timeout, callback)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        Connection.__init__(self, *args, **kwargs)
        self._pending: deque[bytes] = deque()
        self._pending_lock = threading.Lock()
        self._flush_scheduled = False
        self._watching_writes = False
        assert self._loop is not None
        with self._live_lock:
            if self._abandoned or self._loop.is_closed():
                raise ConnectionShutdown("this process is stopping: no new connections")
            # Before the connect: an abandon must be able to cut a connect short.
            self._live.add(self)
        self._connect_socket()
        self._socket.setblocking(False)
        self._on_loop(self._watch_reads)
        self._send_options_message()

    def _initiate_connection(self, sockaddr: Any) -> None:
        # The socket exists by now: an abandon before this point finds the connection
        # closed here, one after it shuts the socket down, which wakes this connect.
        if self.is_closed:
            raise ConnectionAbortedError(f"{self.endpoint}: this process is stopping")
        super()._initiate_connection(sockaddr)

    def _on_loop(self, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        if not self.on_loop_thread():
            try:
                self._loop.call_soon_threadsafe(callback)
                return
            except RuntimeError:  # the loop is closed: no other thread can run it now
                pass
        callback()

    def _watch_reads(self) -> None:
        assert self._loop is not None
        if not self.is_closed and not self._loop.is_closed():
            self._loop.add_reader(self._socket.fileno(), self._read)

    # -- writes: queued by any thread, sent by the loop, several requests per send ------

    def push(self, data: bytes) -> None:
        with self._pending_lock:
            self._pending.append(data)
            if self._flush_scheduled:
                return
            self._flush_scheduled = True
        assert self._loop is not None
        try:
            if self.on_loop_thread():
                # Sent at the end of this loop pass, with whatever else is pushed meanwhile.
                self._loop.call_soon(self._flush)
            else:
                self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: nothing will send it, or read the answer
            self.defunct(ConnectionShutdown(f"{self.endpoint}: its event loop is closed"))

    def _flush(self) -> None:
        with self._pending_lock:
            self._flush_scheduled = False
            if not self._pending:
                return
            data = b"".join(self._pending)
            self._pending.clear()
        try:
            sent = self._socket.send(data)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            sent = 0
        except OSError as error:
            if error.errno not in _RETRY_LATER:
                self.defunct(error)
                return
            sent = 0
        if sent < len(data):
            with self._pending_lock:
                self._pending.appendleft(data[sent:])
            self._watch_writes(True)
        elif self._watching_writes:
            self._watch_writes(False)

    def _watch_writes(self, on: bool) -> None:
        assert self._loop is not None
        if on == self._watching_writes or self.is_closed:
            return
        self._watching_writes = on
        if on:
            self._loop.add_writer(self._socket.fileno(), self._flush)
        else:
            self._loop.remove_writer(self._socket.fileno())

    # -- reads --------------------------------------------------------------------------

    def _read(self) -> None:
        ended = False  # the node closed the connection
        try:
            while True:
                chunk = self._socket.recv(self.in_buffer_size)
                if not chunk:
                    ended = True
                    break
                self._iobuf.write(chunk)
                if len(chunk) < self.in_buffer_size:
                    break
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            if not self._iobuf.tell():
                return
        except OSError as error:
            if error.errno not in _RETRY_LATER:
                self.defunct(error)
                return
            if not self._iobuf.tell():
                return  # woken with nothing to read
        if self._iobuf.tell():
            self.process_io_buffer()
        if ended:
            # Even with part of a frame still buffered: its rest will never come, and the
            # requests waiting on it must fail now, not at their timeouts.
            self.close()

    # -- shutdown -----------------------------------------------------------------------

    def close(self) -> None:
        with self.lock:
            if self.is_closed:
                return
            self.is_closed = True
        self._on_loop(self._close_socket)
        if not self.is_defunct:
            error = ConnectionShutdown(f"Connection to {self.endpoint} was closed")
            if not self.connected_event.is_set():
                # Closed before it was ready (a proxy or balancer in front of a node that
                # is down accepts, then closes): the connect failed. Without an error the
                # driver takes it for a reconnection, marks the node up and fails again at
                # once, every second, instead of backing off.
                self.last_error = error
            self.error_all_requests(error)
            self.connected_event.set()

    def _close_socket(self) -> None:
        assert self._loop is not None
        sock = self._socket
        if sock is None:
            return  # not made yet, or its connect failed (the driver dropped it)
        fd = sock.fileno()
        if fd >= 0 and not self._loop.is_closed():
            self._loop.remove_reader(fd)
            if self._watching_writes:
                self._loop.remove_writer(fd)
        # A shutdown wakes a connect() blocked in a driver thread, which a close does not.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


async def in_daemon_thread(
    call: Callable[[], T], *, abandoned: Callable[[T], object] | None = None
) -> T:
    """`call()` in a thread the process does not wait for. A connect or a prepare meeting
    a node that accepts and never answers blocks for the connect timeout per contact
    point; in `asyncio.to_thread` a stop signal would return at once and the process then
    wait out that thread on its way out (`asyncio.run` joins its executor), past a pod's
    termination grace. Cancelled, this returns at once; a result that comes later goes to
    `abandoned`, in that thread (a connection: closed, not leaked)."""
    outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            result = call()
        except BaseException as error:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                outcome.set_exception(error)
            return
        try:
            outcome.set_result(result)
        except concurrent.futures.InvalidStateError:  # the awaiting task was cancelled
            if abandoned is not None:
                abandoned(result)

    threading.Thread(target=run, name=getattr(call, "__name__", "call"), daemon=True).start()
    try:
        return await asyncio.wrap_future(outcome)
    except asyncio.CancelledError:
        # Cancelled after the result came but before this task took it: hand it on too.
        came = outcome.done() and not outcome.cancelled() and outcome.exception() is None
        if abandoned is not None and came:
            late = outcome.result()
            threading.Thread(target=abandoned, args=(late,), daemon=True).start()
        raise


async def connect_on_loop(
    settings: CassandraSettings, *, keyspace: str | None = None
) -> CassandraConnection:
    """Connect with the driver's I/O on the running loop. The cluster is made and connected
    in a thread of its own: making it resolves the contact points' names (DNS), and the
    connect blocks. Cancelled, it gives up at once (a stop while the database hangs)."""
    connection_class = LoopConnection.on(asyncio.get_running_loop(), threading.get_ident())
    clusters: list[Cluster] = []

    def connected() -> CassandraConnection:
        cluster = new_cluster(settings, connection_class=connection_class)
        clusters.append(cluster)
        return connect_cluster(cluster, settings, keyspace=keyspace)

    try:
        return await in_daemon_thread(connected, abandoned=CassandraConnection.close)
    except asyncio.CancelledError:
        # Should the connect still be under way at exit, the driver's exit hook (which shuts
        # every cluster down, under the lock a connect holds) must not wait for it: atexit
        # runs the last registered first, so this runs before the driver's hook.
        atexit.register(_not_shut_down_at_exit, clusters)
        connection_class.abandon()  # the connect under way fails now, not at its timeout
        raise


def _not_shut_down_at_exit(clusters: list[Cluster]) -> None:
    for cluster in clusters:
        cassandra.cluster._discard_cluster_shutdown(cluster)


async def close_on_loop(connection: CassandraConnection) -> None:
    """Close a connection `connect_on_loop` made: its connections at once, on the loop,
    so that nothing the driver's threads still wait for (a pool's new connection to a
    node that hangs) holds the close up; then the cluster, from a worker thread."""
    connection_class = connection.cluster.connection_class
    try:
        if issubclass(connection_class, LoopConnection):
            connection_class.abandon()
    finally:
        await asyncio.to_thread(connection.close)


async def patiently(what: str, attempt: Callable[[], Awaitable[T]], retry_interval_s: float) -> T:
    """`attempt()`, tried again while storage does not answer (cancel the task to give up):
    a process started before its database, or meeting an outage while it starts, waits
    not ready instead of crash-looping."""
    while True:
        try:
            return await attempt()
        except STORAGE_ERRORS as error:
            log.warning("%s failed (%s); retrying in %.1f s", what, error, retry_interval_s)
            await asyncio.sleep(retry_interval_s)


async def connect_on_loop_patiently(
    settings: CassandraSettings, retry_interval_s: float, *, keyspace: str | None = None
) -> CassandraConnection:
    return await patiently(
        "connecting", lambda: connect_on_loop(settings, keyspace=keyspace), retry_interval_s
    )


async def built_patiently(build: Callable[[], T], retry_interval_s: float, what: str) -> T:
    """`build()` in a thread of its own, patiently: it prepares statements or migrates, and
    the driver's blocking calls must not run on the loop that does its I/O."""
    return await patiently(what, lambda: in_daemon_thread(build), retry_interval_s)


@asynccontextmanager
async def connected_on_loop(
    settings: CassandraSettings, *, keyspace: str | None = None
) -> AsyncIterator[CassandraConnection]:
    """`connect_on_loop`, closed (from a worker thread) on the way out."""
    connection = await connect_on_loop(settings, keyspace=keyspace)
    try:
        yield connection
    finally:
        await close_on_loop(connection)
