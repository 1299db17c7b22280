"""Migrated keyspaces made ahead and dropped behind, in a thread of their own.

Most tests that need a keyspace of their own (dispatchers: parts and leases are global
state) then wait on clocks, rings seconds ahead and leases running out, while making a
keyspace and applying the schema costs 1.5 to 3 s of schema agreement, and dropping it
0.5 to 2 s. Made ahead and dropped behind by a thread, that work overlaps with the
waiting instead of adding to every such test (it was a quarter of the suite's time).

Each process (each pytest-xdist worker) has one pool per kind of keyspace and node, kept
`READY` keyspaces ahead; `close_all` drops what is left when the session ends. A keyspace
taken is the test's alone, as a fresh one was.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from cassandra.cluster import Session

from notifier.storage.schema import apply_notifier_schema
from reminders_svc.config import CassandraSettings
from reminders_svc.storage.migrations import default_cql_dir, load_migrations, migrate
from reminders_svc.storage.session import CassandraConnection, connect

# Keyspaces kept ready per pool: a test takes one while the next is being made.
READY = 2
# How long a test waits for its keyspace: past this the node is in trouble, not busy.
TAKE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Kind:
    """What a pool makes: keyspaces named `prefix`..., each made by `make`."""

    prefix: str
    make: Callable[[Session, CassandraSettings], object]


def _reminders_schema(session: Session, settings: CassandraSettings) -> object:
    return migrate(session, settings, load_migrations(default_cql_dir()))


def _notifier_schema(session: Session, settings: CassandraSettings) -> object:
    return apply_notifier_schema(session, settings)


REMINDERS = Kind("e2e_", _reminders_schema)
NOTIFIER = Kind("e2en_", _notifier_schema)


class KeyspacePool:
    """Keyspaces of one kind on one node: made ahead, dropped behind, by one thread."""

    def __init__(self, settings: CassandraSettings, kind: Kind) -> None:
        self._settings = settings
        self._kind = kind
        self._ready: queue.Queue[str] = queue.Queue()
        self._to_drop: queue.Queue[str] = queue.Queue()
        self._wanted = threading.Semaphore(READY)  # one release per keyspace to make
        self._wake = threading.Event()
        self._closing = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"keyspaces-{kind.prefix}")
        self._thread.daemon = True
        self._thread.start()

    def take(self) -> CassandraSettings:
        """Settings naming a migrated keyspace that is this caller's alone."""
        self._wanted.release()
        self._wake.set()
        deadline = time.monotonic() + TAKE_TIMEOUT_S
        while True:
            try:
                keyspace = self._ready.get(timeout=1)
                break
            except queue.Empty:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise AssertionError(f"no keyspace made: {self._failure!r}") from None
        if not keyspace:  # making it failed: its error, in the test that waited
            raise AssertionError(f"making a keyspace failed: {self._failure!r}")
        return dataclasses.replace(self._settings, keyspace=keyspace)

    def drop(self, keyspace: str) -> None:
        """Drop `keyspace` behind the caller, which no longer uses it."""
        self._to_drop.put(keyspace)
        self._wake.set()

    def close(self) -> None:
        """Drop every keyspace left, made or given back, and stop."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=TAKE_TIMEOUT_S)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as error:  # a node that never answered: told by `take`
            self._failure = error

    def _serve(self) -> None:
        with connect(self._settings, keyspace="") as connection:
            while not self._closing or not self._to_drop.empty():
                self._wake.clear()
                if not self._to_drop.empty():
                    self._drop(connection, self._to_drop.get())
                elif not self._closing and self._wanted.acquire(blocking=False):
                    self._ready.put(self._made(connection))
                else:
                    self._wake.wait(timeout=1)
            while not self._ready.empty():
                keyspace = self._ready.get()
                if keyspace:
                    self._drop(connection, keyspace)

    def _made(self, connection: CassandraConnection) -> str:
        """A new keyspace, made and migrated; "" if that failed (kept in `_failure`)."""
        keyspace = f"{self._kind.prefix}{uuid.uuid4().hex[:8]}"
        try:
            settings = dataclasses.replace(self._settings, keyspace=keyspace)
            self._kind.make(connection.session, settings)
        except Exception as error:  # raised again in the test that waits for it
            self._failure = error
            self._to_drop.put(keyspace)  # whatever of it was made
            return ""
        return keyspace

    def _drop(self, connection: CassandraConnection, keyspace: str) -> None:
        try:
            connection.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        except Exception as error:  # a node gone by the session's end: nothing to drop
            self._failure = error


_pools: dict[tuple[CassandraSettings, Kind], KeyspacePool] = {}
_pools_lock = threading.Lock()


def _pool(settings: CassandraSettings, kind: Kind) -> KeyspacePool:
    node = dataclasses.replace(settings, keyspace="")
    with _pools_lock:
        if (node, kind) not in _pools:
            _pools[node, kind] = KeyspacePool(node, kind)
        return _pools[node, kind]


def take(settings: CassandraSettings, kind: Kind = REMINDERS) -> CassandraSettings:
    """`settings` naming a migrated keyspace of `kind`, the caller's alone until `drop`."""
    return _pool(settings, kind).take()


def drop(settings: CassandraSettings, kind: Kind = REMINDERS) -> None:
    """Give back the keyspace `settings` names (taken with `take`), to be dropped."""
    _pool(settings, kind).drop(settings.keyspace)


def close_all() -> None:
    """Drop what every pool of this process holds (the end of a session)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()
