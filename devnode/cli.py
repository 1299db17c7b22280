"""`reminders cassandra start | stop | status | reset | env` and `reminders stack`: local
development."""

from __future__ import annotations

import argparse
import os
import sys

from devnode.node import CASSANDRA_VERSION, NodeError, NodeSettings, reset, start, status, stop
from devnode.stack import run_stack
from reminders_svc.config import ConfigError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cassandra", help=f"run a local Cassandra {CASSANDRA_VERSION} node for development"
    )
    parser.add_argument(
        "action",
        choices=("start", "stop", "status", "reset", "env"),
        help="reset stops the node and deletes its home: data, logs and config; env prints "
        "the NAME=value settings its clients need to reach it (none when they already do)",
    )
    parser.set_defaults(handler=run)
    stack = subparsers.add_parser(
        "stack", help="run node, API, notifier and a dispatcher in the foreground (Ctrl-C stops)"
    )
    stack.set_defaults(handler=_stack)


def _node_settings(command: str) -> NodeSettings | None:
    """The node's settings; None once a malformed one is reported, naming its variable."""
    try:
        return NodeSettings.from_env()
    except ConfigError as error:
        print(f"{command}: {error}", file=sys.stderr)
        return None


def _stack(_args: argparse.Namespace) -> int:
    settings = _node_settings("reminders stack")
    return 2 if settings is None else run_stack(settings)


def run(args: argparse.Namespace) -> int:
    settings = _node_settings(f"reminders cassandra {args.action}")
    if settings is None:
        return 2
    try:
        if args.action == "env":
            for name, value in settings.client_env(os.environ).items():
                print(f"{name}={value}")
            return 0
        if args.action == "start":
            pid, started = start(settings, notice=lambda text: print(text, file=sys.stderr))
            verb = "started" if started else "already running"
            print(
                f"cassandra {CASSANDRA_VERSION} {verb}: pid {pid}, "
                f"CQL on {settings.host}:{settings.native_port}, home {settings.home}"
            )
            return 0
        if args.action == "stop":
            print("stopped" if stop(settings) else "not running")
            return 0
        if args.action == "reset":
            deleted = reset(settings)
            print(f"deleted {settings.home}" if deleted else f"nothing at {settings.home}")
            return 0
        node = status(settings)
        rss = f"{node.rss_bytes / 2**20:.0f} MiB" if node.rss_bytes else "-"
        print(
            f"cassandra {node.version}: {'running' if node.running else 'stopped'}"
            f" pid={node.pid or '-'} cql_ready={node.cql_ready} rss={rss}"
        )
        return 0 if node.running else 3
    except NodeError as error:
        print(f"reminders cassandra {args.action}: {error}", file=sys.stderr)
        return 1
