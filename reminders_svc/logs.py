"""Logging set-up shared by the service processes (API, dispatcher, notifier)."""

from __future__ import annotations

import argparse
import logging

from reminders_svc.storage.errors import STORAGE_ERRORS


class StorageErrorsOnOneLine(logging.Filter):
    """The driver logs routine failures to reach a node (a pool it cannot open, a control
    connection it cannot make) at WARNING with a full traceback: during an outage, one
    every second or so, burying everything else. Those become one line naming the error;
    any other traceback, and every one from our own code, stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if record.name.startswith("cassandra") and isinstance(error, STORAGE_ERRORS):
            record.msg = f"{record.getMessage()} {type(error).__name__}: {error}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def configure(level: str) -> None:
    """Lines of time, level, logger and message on stderr, driver outages on one line each."""
    handler = logging.StreamHandler()
    handler.addFilter(StorageErrorsOnOneLine())
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[handler],
    )


def add_level_option(parser: argparse.ArgumentParser) -> None:
    """`--log-level` of a service process's command: a choice, so a typo is a usage error."""
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING"))
