"""A throwaway keyspace per bench run: made and migrated at the start, dropped at the end."""

from __future__ import annotations

import dataclasses
import uuid

from cassandra.cluster import Session

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.migrations import default_cql_dir, load_migrations, migrate
from reminders_svc.storage.session import connect


def fresh_keyspace(prefix: str) -> CassandraSettings:
    """Settings for a new keyspace `<prefix>_<random>`, with the schema migrated in."""
    settings = dataclasses.replace(
        CassandraSettings.from_env(), keyspace=f"{prefix}_{uuid.uuid4().hex[:8]}"
    )
    with connect(settings, keyspace="") as connection:
        migrate(connection.session, settings, load_migrations(default_cql_dir()))
    return settings


def drop_keyspaces(session: Session, *keyspaces: str) -> None:
    for keyspace in keyspaces:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
