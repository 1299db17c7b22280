"""`reminders migrate`: apply the schema files not yet applied.

It logs as the services do (waiting for another migrator's lock says so), and SIGTERM or
SIGINT stops it at the next safe point with the schema lock released, so a Job pod
deleted mid-run does not leave the next migrator waiting out the lock's TTL.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cassandra import DriverException

from reminders_svc import logs
from reminders_svc.config import CassandraSettings, ConfigError, in_development
from reminders_svc.storage.errors import STORAGE_ERRORS, StorageUnavailable
from reminders_svc.storage.migrations import (
    MigrationError,
    MigrationStopped,
    default_cql_dir,
    load_migrations,
    migrate,
    replication_warnings,
)
from reminders_svc.storage.session import connect

# What a shell reports for a process ended by SIGTERM: a stopped migrate did not finish.
EXIT_STOPPED = 143
# Bad configuration, as every command says it; no retry mends it (the Job fails at once).
EXIT_BAD_CONFIGURATION = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "migrate", help="create the keyspace and apply schema files not yet applied"
    )
    parser.add_argument("--cql-dir", type=Path, default=None, help="default: the packaged cql/")
    logs.add_level_option(parser)
    parser.set_defaults(handler=run)


@contextmanager
def _stopped_by_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT while inside; the handlers before are restored."""
    stopping = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    before = {signum: signal.getsignal(signum) for signum in signals}
    for signum in signals:
        signal.signal(signum, lambda *_: stopping.set())
    try:
        yield stopping
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    try:
        settings = CassandraSettings.from_env()
        migrations = load_migrations(args.cql_dir or default_cql_dir())
        with _stopped_by_signals() as stopping, connect(settings, keyspace="") as connection:
            # A schema ahead of this release (a rollback): its files all applied, nothing
            # to do, as its processes serve on it; a Job refusing it failed for an hour.
            report = migrate(
                connection.session, settings, migrations, stopping=stopping, ahead_ok=True
            )
            warnings = replication_warnings(
                connection.session, settings, in_development(os.environ)
            )
    except MigrationStopped as stopped:
        print(f"reminders migrate: {stopped}; run it again to finish", file=sys.stderr)
        return EXIT_STOPPED
    except ConfigError as error:
        print(f"reminders migrate: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIGURATION
    except (MigrationError, StorageUnavailable) as error:
        print(f"reminders migrate: {error}", file=sys.stderr)
        return 1
    except (*STORAGE_ERRORS, DriverException) as error:
        # Refused or unanswered (a grant missing, a node down under the lock's LWT): one
        # line naming it, not a traceback; statements already run are safe to run again.
        print(f"reminders migrate: storage: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"reminders migrate: warning: {warning}", file=sys.stderr)
    for label in report.applied:
        print(f"applied {label}")
    for label in report.already_applied:
        print(f"already applied {label}")
    print(
        f"keyspace {settings.keyspace}: {len(report.applied)} applied, "
        f"{len(report.already_applied)} already applied"
    )
    return 0
