"""Which driver errors mean "storage did not answer; try again later", for every process.

The driver raises them from unrelated classes: `NoHostAvailable` and `ConnectionException`
are not `DriverException`s, and a coordinator's overload arrives as a protocol
`ErrorMessage`. A caller that catches fewer than these turns a storage blip into a crash.
Errors that are bugs (an invalid query, a bad TTL) are deliberately not here.
"""

from __future__ import annotations

from cassandra import DriverException
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException
from cassandra.protocol import IsBootstrappingErrorMessage, OverloadedErrorMessage, ServerError

STORAGE_ERRORS: tuple[type[Exception], ...] = (
    DriverException,  # timeouts, unavailable replicas, ...
    NoHostAvailable,  # no node could be asked
    ConnectionException,  # the connection broke with the request on it
    OverloadedErrorMessage,
    IsBootstrappingErrorMessage,
    ServerError,
    OSError,  # sockets, and asyncio's TimeoutError
)
