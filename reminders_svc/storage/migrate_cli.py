"""`reminders migrate`: apply the schema files not yet applied."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reminders_svc.config import CassandraSettings, ConfigError
from reminders_svc.storage.errors import StorageUnavailable
from reminders_svc.storage.migrations import (
    MigrationError,
    default_cql_dir,
    load_migrations,
    migrate,
)
from reminders_svc.storage.session import connect


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "migrate", help="create the keyspace and apply schema files not yet applied"
    )
    parser.add_argument("--cql-dir", type=Path, default=None, help="default: the packaged cql/")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = CassandraSettings.from_env()
        migrations = load_migrations(args.cql_dir or default_cql_dir())
        with connect(settings, keyspace="") as connection:
            report = migrate(connection.session, settings, migrations)
    except (ConfigError, MigrationError, StorageUnavailable) as error:
        print(f"reminders migrate: {error}", file=sys.stderr)
        return 1
    for label in report.applied:
        print(f"applied {label}")
    for label in report.already_applied:
        print(f"already applied {label}")
    print(
        f"keyspace {settings.keyspace}: {len(report.applied)} applied, "
        f"{len(report.already_applied)} already applied"
    )
    return 0
