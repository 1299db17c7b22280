"""Dispatcher tests get a keyspace of their own: parts and leases are global state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.migrations import default_cql_dir, load_migrations, migrate
from reminders_svc.storage.session import CassandraConnection, connect


@pytest.fixture
def own_keyspace(fresh_keyspace: CassandraSettings) -> Iterator[CassandraConnection]:
    with connect(fresh_keyspace, keyspace="") as connection:
        migrate(connection.session, fresh_keyspace, load_migrations(default_cql_dir()))
    with connect(fresh_keyspace) as connection:
        yield connection
