"""`reminders dispatch`: run one dispatcher of the fleet."""

from __future__ import annotations

import argparse
import asyncio
import sys

from dispatcher.service import serve
from dispatcher.settings import DispatcherSettings
from reminders_svc import logs
from reminders_svc.config import CassandraSettings, ConfigError
from reminders_svc.runtime import CannotServe


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dispatch", help="run a dispatcher: lease parts, claim due reminders, hand them off"
    )
    logs.add_level_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    try:
        settings = DispatcherSettings.from_env()
        cassandra = CassandraSettings.from_env()
    except ConfigError as error:
        print(f"reminders dispatch: {error}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(settings, cassandra))
    except (OSError, CannotServe) as error:  # a port taken; a role lacking a grant
        print(f"reminders dispatch: {error}", file=sys.stderr)
        return 1
    return 0
