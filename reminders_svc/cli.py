"""The `reminders` command: one entry point, one subcommand module per concern.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` (a callable taking the parsed namespace and returning an exit code).
Configuration is read from the environment inside handlers, never at import time.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from devnode import cli as devnode_cli
from devnode import demo as demo_cli
from dispatcher import cli as dispatcher_cli
from notifier import cli as notifier_cli
from reminders_svc.admin import cli as admin_cli
from reminders_svc.api import client_cli, serve_cli, token_cli
from reminders_svc.schedule import preview_cli
from reminders_svc.storage import migrate_cli

Handler = Callable[[argparse.Namespace], int]

_SUBCOMMANDS = (
    devnode_cli,
    migrate_cli,
    preview_cli,
    serve_cli,
    token_cli,
    client_cli,
    notifier_cli,
    dispatcher_cli,
    demo_cli,
    admin_cli,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reminders",
        description="Reminders service: API, dispatcher, schema and development tools.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _SUBCOMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except BrokenPipeError:
        # The reader went away (`reminders preview ... | head -1`): stop quietly, as Unix
        # tools do, and keep the interpreter from complaining as it flushes stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for such a writer
    except KeyboardInterrupt:
        # Ctrl-C on a command (a call waiting on an API that does not answer): one line,
        # not a traceback; the services handle SIGINT themselves and never get here.
        print(f"reminders {args.command}: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT


if __name__ == "__main__":
    sys.exit(main())
