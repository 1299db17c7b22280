"""`reminders notifier`: migrate the notifier's keyspace, then serve until SIGTERM / SIGINT.

Configured by REMINDERS_NOTIFIER_* and REMINDERS_CASSANDRA_* variables (see
notifier.settings.NotifierSettings.from_env), read here at startup.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from notifier.rpc.server import serve
from notifier.settings import NotifierSettings
from notifier.storage.schema import migrate_notifier
from reminders_svc.config import ConfigError
from reminders_svc.storage.migrations import MigrationError
from reminders_svc.storage.session import StorageUnavailable

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "notifier",
        help="run the reference Notification Service (configured by REMINDERS_NOTIFIER_*)",
    )
    _add_arguments(parser)
    parser.set_defaults(handler=run)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m notifier`: the same, without the rest of the `reminders` command."""
    parser = argparse.ArgumentParser(prog="python -m notifier", description=__doc__)
    _add_arguments(parser)
    return run(parser.parse_args(argv))


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = NotifierSettings.from_env()
        report = migrate_notifier(settings.cassandra)
    except (ConfigError, MigrationError, StorageUnavailable) as error:
        print(f"reminders notifier: {error}", file=sys.stderr)
        return 1
    log.info(
        "keyspace %s: applied %s, already applied %s",
        settings.cassandra.keyspace,
        list(report.applied),
        list(report.already_applied),
    )
    if settings.faults.drop_reply:
        log.warning("fault injection on: drop_reply:%d", settings.faults.drop_reply)
    try:
        asyncio.run(serve(settings))
    except OSError as error:  # e.g. the port is taken
        print(f"reminders notifier: {error}", file=sys.stderr)
        return 1
    return 0
