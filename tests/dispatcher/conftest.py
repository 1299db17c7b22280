"""Dispatcher tests get a keyspace of their own: parts and leases are global state."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from dispatcher.leases import Lease
from dispatcher.shift import Shift
from reminders_svc.config import CassandraSettings
from reminders_svc.storage.migrations import default_cql_dir, load_migrations, migrate
from reminders_svc.storage.session import CassandraConnection, connect


@pytest.fixture
def own_keyspace(fresh_keyspace: CassandraSettings) -> Iterator[CassandraConnection]:
    with connect(fresh_keyspace, keyspace="") as connection:
        migrate(connection.session, fresh_keyspace, load_migrations(default_cql_dir()))
    with connect(fresh_keyspace) as connection:
        yield connection


def held_shift(held_for_s: float = 600.0, checkpoint: datetime | None = None) -> Shift:
    """A shift on part 0's lease (epoch 1), held for `held_for_s` from now: nothing renews
    it, so a test ends it by letting it run out or by `shift.lease.end()`."""
    return Shift(Lease(0, 1, checkpoint, valid_until=time.monotonic() + held_for_s))
