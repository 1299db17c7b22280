"""Logging set-up shared by the service processes (API, dispatcher, notifier)."""

from __future__ import annotations

import argparse
import logging

from reminders_svc.storage.errors import STORAGE_ERRORS


class StorageErrorsOnOneLine(logging.Filter):
    """The driver logs routine failures to reach a node (a pool it cannot open, a control
    connection it cannot make) with a full traceback, at WARNING, and a cluster it cannot
    reach at all at ERROR: during an outage, one every second or so, burying everything
    else, and firing any alert on ERROR lines for as long as it lasts, though our own code
    says it (a WARNING) and retries. Those become one WARNING line naming the error; any
    other traceback, and every one from our own code, stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if record.name.startswith("cassandra") and isinstance(error, STORAGE_ERRORS):
            record.msg = f"{record.getMessage()} {type(error).__name__}: {error}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
            if record.levelno > logging.WARNING:
                record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_KEYSPACE_WARNING = "with prepared statements is considered to be an anti-pattern"


class KeyspaceWarningDropped(logging.Filter):
    """Cassandra warns, on every statement a session with a keyspace prepares, that a
    table name without its keyspace is ambiguous. Each process works in the one keyspace
    it connects to, so it is not; a WARNING on every pod start would teach people to
    ignore the log's warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.name.startswith("cassandra") and _KEYSPACE_WARNING in record.getMessage()
        )


def configure(level: str) -> None:
    """Lines of time, level, logger and message on stderr, driver outages on one line each."""
    handler = logging.StreamHandler()
    handler.addFilter(StorageErrorsOnOneLine())
    handler.addFilter(KeyspaceWarningDropped())
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[handler],
    )


def add_level_option(parser: argparse.ArgumentParser) -> None:
    """`--log-level` of a service process's command: a choice, so a typo is a usage error."""
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING"),
        help="default %(default)s",
    )
