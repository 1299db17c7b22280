"""The notifier's schema files (cql/notifier/), applied by the shared migrator."""

from __future__ import annotations

from pathlib import Path

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
        return migrate(connection.session, settings, load_migrations(notifier_cql_dir()))
