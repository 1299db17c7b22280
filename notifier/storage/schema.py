"""The notifier's schema files (cql/notifier/), applied by the shared migrator."""

from __future__ import annotations

import threading
from pathlib import Path

from cassandra.cluster import Session

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.migrations import (
    MigrationReport,
    default_cql_dir,
    load_migrations,
    migrate,
)
from reminders_svc.storage.session import connect


def notifier_cql_dir() -> Path:
    """The `notifier/` folder next to the reminders schema (packaged or in the repo)."""
    return default_cql_dir() / "notifier"


def migrate_notifier(settings: CassandraSettings) -> MigrationReport:
    """Create the notifier's keyspace and tables; idempotent, safe from many replicas."""
    with connect(settings, keyspace="") as connection:
        return apply_notifier_schema(connection.session, settings)


def apply_notifier_schema(
    session: Session,
    settings: CassandraSettings,
    stopping: threading.Event | None = None,
    *,
    ahead_ok: bool = False,
) -> MigrationReport:
    """`migrate_notifier` on a session already connected (with or without a keyspace);
    `stopping` and `ahead_ok` as `migrate` takes them."""
    migrations = load_migrations(notifier_cql_dir())
    return migrate(session, settings, migrations, stopping=stopping, ahead_ok=ahead_ok)
