"""Shared fixtures: a real Cassandra for every test that needs one.

Where the node comes from:
- default: the local node (`reminders cassandra start`, which `make test` runs first),
  reached with the REMINDERS_CASSANDRA_* settings;
- REMINDERS_CASSANDRA=docker: testcontainers' CassandraContainer, for machines with a
  Docker engine.
A test that needs Cassandra skips with a hint when none answers, except in CI
(CI=true), where it fails: CI must never pass by skipping (tests/ci.py).

Every test that uses the node (through `cassandra_settings`, directly or not) is marked
`cassandra`, so `pytest -m "not cassandra"` runs the rest without one.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator

import pytest

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.errors import StorageUnavailable
from reminders_svc.storage.migrations import default_cql_dir, load_migrations, migrate
from reminders_svc.storage.session import CassandraConnection, connect
from tests import keyspaces
from tests.ci import unavailable

DOCKER_IMAGE = "cassandra:5.0.9"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cassandra_settings" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cassandra)
    # `make test` runs the suite on parallel workers (pytest-xdist), which take tests in
    # this order: the few that wait out whole minutes go first, so they overlap with the
    # rest instead of running alone at the end. A stable sort keeps the rest as collected.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _docker_settings() -> Iterator[CassandraSettings]:
    from testcontainers.cassandra import CassandraContainer

    with CassandraContainer(DOCKER_IMAGE) as container:
        yield dataclasses.replace(
            CassandraSettings.from_env(),
            contact_points=(container.get_container_host_ip(),),
            port=int(container.get_exposed_port(9042)),
            local_dc=container.get_local_datacenter(),
        )


@pytest.fixture(scope="session")
def cassandra_settings() -> Iterator[CassandraSettings]:
    """Settings of a Cassandra that answers; the keyspace is not created here."""
    # At the end, what the keyspace pools (tests/keyspaces.py) still hold is dropped,
    # before a container goes.
    if os.environ.get("REMINDERS_CASSANDRA") == "docker":
        for settings in _docker_settings():
            yield settings
            keyspaces.close_all()
        return
    settings = CassandraSettings.from_env()
    try:
        connect(settings, keyspace="").close()
    except StorageUnavailable as error:
        unavailable(f"{error}\n(`make test` starts the local node; or `reminders cassandra start`)")
    yield settings
    keyspaces.close_all()


@pytest.fixture
def fresh_keyspace(cassandra_settings: CassandraSettings) -> Iterator[CassandraSettings]:
    """Settings naming a keyspace that does not exist yet; dropped afterwards."""
    settings = dataclasses.replace(cassandra_settings, keyspace=f"t_{uuid.uuid4().hex[:12]}")
    yield settings
    with connect(settings, keyspace="") as connection:
        connection.session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)


@pytest.fixture(scope="session")
def migrated_settings(cassandra_settings: CassandraSettings) -> Iterator[CassandraSettings]:
    """One migrated keyspace for the whole session, for tests of the service itself."""
    settings = dataclasses.replace(cassandra_settings, keyspace=f"suite_{uuid.uuid4().hex[:8]}")
    with connect(settings, keyspace="") as connection:
        try:
            migrate(connection.session, settings, load_migrations(default_cql_dir()))
            yield settings
        finally:  # a migration that failed halfway leaves a keyspace too
            connection.session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=60)


@pytest.fixture
def cassandra(migrated_settings: CassandraSettings) -> Iterator[CassandraConnection]:
    with connect(migrated_settings) as connection:
        yield connection
