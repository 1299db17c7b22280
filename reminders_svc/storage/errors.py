"""Which driver errors mean "storage did not answer; try again later", for every process.

The driver raises them from unrelated classes: `NoHostAvailable` and `ConnectionException`
are not `DriverException`s, and a coordinator's overload arrives as a protocol
`ErrorMessage`. A caller that catches fewer than these turns a storage blip into a crash.
Errors that are bugs (an invalid query, a bad TTL, a missing table: the driver's
`RequestValidationException`s) are deliberately not here: retrying them helps nobody,
and the API answers them INTERNAL, not UNAVAILABLE.
"""

from __future__ import annotations

from cassandra import CoordinationFailure, OperationTimedOut, Timeout, Unavailable
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException
from cassandra.protocol import IsBootstrappingErrorMessage, OverloadedErrorMessage, ServerError


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
    OSError,  # sockets, and asyncio's TimeoutError
)
