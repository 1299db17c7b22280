"""Dispatcher tests get a keyspace of their own: parts and leases are global state."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime

import pytest

from dispatcher.leases import Lease
from dispatcher.shift import Shift
from reminders_svc.config import CassandraSettings
from reminders_svc.storage.session import CassandraConnection, connect
from tests import keyspaces


@pytest.fixture
def own_keyspace(cassandra_settings: CassandraSettings) -> Iterator[CassandraConnection]:
    """A migrated keyspace of the test's own (made ahead: tests/keyspaces.py)."""
    settings = keyspaces.take(cassandra_settings)
    try:
        with connect(settings) as connection:
            yield connection
    finally:
        keyspaces.drop(settings)


def held_shift(held_for_s: float = 600.0, checkpoint: datetime | None = None) -> Shift:
    """A shift on part 0's lease (epoch 1), held for `held_for_s` from now: nothing renews
    it, so a test ends it by letting it run out or by `shift.lease.end()`."""
    return Shift(Lease(0, 1, checkpoint, valid_until=time.monotonic() + held_for_s))
