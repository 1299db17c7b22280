"""`reminders notifier`: migrate the notifier's keyspace (waiting for the database), then
serve until SIGTERM / SIGINT.

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
from reminders_svc import logs
from reminders_svc.config import ConfigError
from reminders_svc.runtime import CannotServe
from reminders_svc.storage.migrations import MigrationError

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
    logs.add_level_option(parser)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    try:
        settings = NotifierSettings.from_env()
    except ConfigError as error:
        print(f"reminders notifier: {error}", file=sys.stderr)
        return 2  # as every command's bad configuration
    if settings.faults.any:
        log.warning("fault injection on: %s", settings.faults)
    try:
        # Migrates the keyspace first, waiting for the database if it does not answer.
        asyncio.run(serve(settings))
    # A schema at odds with ours; a port taken; the storage probe gone.
    except (MigrationError, OSError, CannotServe) as error:
        print(f"reminders notifier: {error}", file=sys.stderr)
        return 1
    return 0
