"""The `reminders` command: one entry point, one subcommand module per concern.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` (a callable taking the parsed namespace and returning an exit code).
Configuration is read from the environment inside handlers, never at import time.
"""

from __future__ import annotations

import argparse
import os
import signal
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


class Terminated(BaseException):
    """SIGTERM, on a command that does not handle it (an admin command, a client call)."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    # Run as a container's PID 1 (a Job's `reminders admin replan`), a process without a
    # SIGTERM handler ignores SIGTERM: `kubectl delete` then waited out the grace period
    # for SIGKILL. The services and `migrate` put their own drain in its place.
    before = signal.signal(signal.SIGTERM, _terminated)
    try:
        return handler(args)
    except Terminated:
        # Every write of these commands is safe to cut (LWTs, each settled or redone on
        # the next run): one line, the exit a shell reports for SIGTERM.
        print(f"reminders {args.command}: terminated", file=sys.stderr)
        return 143  # 128 + SIGTERM
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
    finally:
        signal.signal(signal.SIGTERM, before)


if __name__ == "__main__":
    sys.exit(main())
