"""Which driver errors mean "storage did not answer; try again later", for every process.

The driver raises them from unrelated classes: `NoHostAvailable` and `ConnectionException`
are not `DriverException`s, and a coordinator's overload arrives as a protocol
`ErrorMessage`. A caller that catches fewer than these turns a storage blip into a crash.
Errors that are bugs (an invalid query, a bad TTL, a missing table: the driver's
`RequestValidationException`s) are deliberately not here: retrying them helps nobody,
and the API answers them INTERNAL, not UNAVAILABLE.
"""

from __future__ import annotations

from typing import Any

from cassandra import CoordinationFailure, OperationTimedOut, Timeout, Unavailable
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException
from cassandra.protocol import (
    IsBootstrappingErrorMessage,
    OverloadedErrorMessage,
    RequestExecutionException,
    ServerError,
    read_consistency_level,
    read_int,
)


class CasWriteUnknown(RequestExecutionException):  # type: ignore[misc]  # untyped driver
    """Protocol v5's CAS_WRITE_UNKNOWN: an LWT that may or may not have landed, which this
    driver does not name. Defining the class registers it with the driver's decoder (its
    metaclass files error classes by `error_code`), so the error arrives as this type, not
    as a bare ErrorMessage that no `except STORAGE_ERRORS` catches."""

    summary = "CAS write unknown"
    error_code = 0x1700

    @staticmethod
    def recv_error_info(f: Any, protocol_version: int) -> dict[str, Any]:
        return {
            "consistency": read_consistency_level(f),
            "received_responses": read_int(f),
            "required_responses": read_int(f),
        }


class WriteOutcomeUnknown(RuntimeError):
    """An LWT of unknown outcome that its SERIAL read could not settle either (storage
    went away in between, or later user changes left no trace of whether it landed): the
    write may or may not have landed. Callers that re-read
    before acting treat it as storage trouble; the API answers DEADLINE_EXCEEDED ("read
    before retrying"), never UNAVAILABLE's "retry", which a non-idempotent change (a snooze
    by a duration, a resume) would turn into a second change or a refusal."""


class WriteNotLanded(RuntimeError):
    """An LWT of unknown outcome that its SERIAL read found had not landed while its
    condition still held (no other writer changed what it compares): storage trouble, not
    a lost compare, so the caller tries again rather than take the row for changed."""


class StorageUnavailable(RuntimeError):
    """Cassandra cannot be reached; the message names the contact points tried."""


STORAGE_ERRORS: tuple[type[Exception], ...] = (
    StorageUnavailable,  # connecting failed
    OperationTimedOut,  # the driver gave up waiting
    Timeout,  # the coordinator gave up waiting for replicas (read or write)
    Unavailable,  # too few replicas alive to try
    CoordinationFailure,  # replicas failed the read or write
    NoHostAvailable,  # no node could be asked
    ConnectionException,  # the connection broke with the request on it
    OverloadedErrorMessage,
    IsBootstrappingErrorMessage,
    ServerError,
    CasWriteUnknown,  # an LWT of unknown outcome; settled ones are settled first (aio)
    WriteOutcomeUnknown,  # ... and one whose settling read failed too
    WriteNotLanded,  # ... or found it had not landed, its condition still holding
    OSError,  # sockets, and asyncio's TimeoutError
)
