"""The service processes' log lines: driver outages on one line, at WARNING."""

from __future__ import annotations

import logging
import sys

import pytest
from cassandra.cluster import NoHostAvailable

from reminders_svc.logs import StorageErrorsOnOneLine


def _record(level: int, name: str, error: BaseException) -> logging.LogRecord:
    try:
        raise error
    except type(error):
        exc_info = sys.exc_info()
    return logging.LogRecord(
        name, level, __file__, 1, "Control connection failed to connect, %s", ("x",), exc_info
    )


@pytest.mark.parametrize("level", [logging.WARNING, logging.ERROR])
def test_a_driver_outage_line_is_one_warning_line(level: int) -> None:
    """The driver's ERROR for a cluster it cannot reach came every few seconds of an
    outage, our own WARNING beside it already saying so."""
    record = _record(level, "cassandra.cluster", NoHostAvailable("down", {"127.0.0.1": "refused"}))

    assert StorageErrorsOnOneLine().filter(record)
    assert (record.levelno, record.levelname) == (logging.WARNING, "WARNING")
    assert record.exc_info is None
    assert record.getMessage().startswith("Control connection failed to connect, x NoHostAvailable")


def test_errors_of_our_own_code_keep_their_level_and_traceback() -> None:
    record = _record(logging.ERROR, "reminders_svc.app", NoHostAvailable("down", {}))

    assert StorageErrorsOnOneLine().filter(record)
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
