"""`reminders serve-api`: run the gRPC API until SIGTERM or SIGINT.

All configuration comes from REMINDERS_* environment variables, read here at startup:
ApiSettings (host, ports, TLS, limits), CassandraSettings and AuthSettings.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from reminders_svc import logs
from reminders_svc.api.auth import Authenticator, AuthSettings
from reminders_svc.api.server import serve
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import CassandraSettings, ConfigError
from reminders_svc.runtime import CannotServe


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve-api", help="run the gRPC API (configured by REMINDERS_* variables)"
    )
    logs.add_level_option(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    try:
        settings = ApiSettings.from_env()
        cassandra = CassandraSettings.from_env()
        auth = AuthSettings.from_env()
    except ConfigError as error:
        print(f"reminders serve-api: {error}", file=sys.stderr)
        return 2
    if auth.user.is_development or auth.admin.is_development:
        logging.getLogger(__name__).warning(
            "REMINDERS_ENV=dev: accepting tokens signed with the development secrets"
        )
    try:
        asyncio.run(serve(settings, cassandra, Authenticator(auth)))
    except (OSError, CannotServe) as error:  # a port taken; a role lacking a grant
        print(f"reminders serve-api: {error}", file=sys.stderr)
        return 1
    return 0
