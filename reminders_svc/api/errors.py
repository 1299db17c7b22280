"""Domain errors -> gRPC status codes with google.rpc details (AIP-193): an ErrorInfo naming
the error's reason, and a BadRequest naming the field at fault of an INVALID_ARGUMENT (a
PreconditionFailure for FAILED_PRECONDITION, a QuotaFailure for RESOURCE_EXHAUSTED, a
RetryInfo for UNAVAILABLE).

Anything unexpected is logged (without request contents) and answered INTERNAL, never
UNKNOWN and never with a stack trace. Every text of a status is capped: a message may
quote the caller's input, and a status larger than the client's metadata limit would
reach it as RESOURCE_EXHAUSTED instead of the error it is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from reminders_svc.domain import errors
from reminders_svc.storage.errors import STORAGE_ERRORS, WriteOutcomeUnknown

log = logging.getLogger(__name__)
# Characters of one message or description: the status travels twice (grpc-message and the
# details trailer, base64), far below gRPC's default 8 KiB metadata limit.
MAX_MESSAGE_CHARS = 300
# A change storage may or may not have applied (past the write deadline, or unsettled).
MAY_HAVE_BEEN_APPLIED = (
    "may have been applied: read the reminder before retrying"
    " (a create: repeat it with its request_id)"
)


@dataclass(frozen=True)
class ErrorDomain:
    """A service answering through this module: the ErrorInfo domain that names its
    reasons (AIP-193), and what it tells a caller of a write storage did not confirm."""

    name: str
    unconfirmed: str


REMINDERS = ErrorDomain(
    "reminders.v1", f"storage did not confirm the change, which {MAY_HAVE_BEEN_APPLIED}"
)

_CODES: dict[type[errors.ReminderError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.VersionConflict: grpc.StatusCode.ABORTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.QuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def code_of(error: errors.ReminderError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return grpc.StatusCode.INTERNAL


def capped(text: str, longest: int = MAX_MESSAGE_CHARS) -> str:
    """`text`, cut to `longest` characters."""
    return text if len(text) <= longest else text[: longest - 1] + "…"


def _details_of(error: errors.ReminderError, domain: str) -> list[Message]:
    """The google.rpc details the status carries (AIP-193): always an ErrorInfo with the
    error's reason; then the field at fault of an INVALID_ARGUMENT (BadRequest), the
    subject of a FAILED_PRECONDITION (PreconditionFailure), the quota used up
    (QuotaFailure, for RESOURCE_EXHAUSTED), or how soon to retry an UNAVAILABLE
    (RetryInfo, AIP-194)."""
    description = capped(error.description)
    details: list[Message] = [
        error_details_pb2.ErrorInfo(reason=error.reason, domain=domain, metadata=error.metadata)
    ]
    if isinstance(error, errors.InvalidArgument):
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=capped(error.field), description=description
        )
        details.append(error_details_pb2.BadRequest(field_violations=[violation]))
    elif isinstance(error, errors.FailedPrecondition):
        failed = error_details_pb2.PreconditionFailure.Violation(
            type=error.reason, subject=capped(error.field or ""), description=description
        )
        details.append(error_details_pb2.PreconditionFailure(violations=[failed]))
    elif isinstance(error, errors.QuotaExceeded):
        used_up = error_details_pb2.QuotaFailure.Violation(
            subject=error.subject, description=description
        )
        details.append(error_details_pb2.QuotaFailure(violations=[used_up]))
    elif isinstance(error, errors.Unavailable):
        delay = duration_pb2.Duration()
        delay.FromTimedelta(error.retry_after)
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    return details


def status_of(error: errors.ReminderError, domain: str = REMINDERS.name) -> grpc.Status:
    """The status answering `error`: its code and message, and its details."""
    code = code_of(error)
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=capped(error.message))
    for detail in _details_of(error, domain):
        status.details.add().Pack(detail)
    answer: grpc.Status = rpc_status.to_status(status)  # untyped: packs the details trailer
    return answer


async def abort(
    context: grpc.aio.ServicerContext[Any, Any],
    error: errors.ReminderError,
    domain: str = REMINDERS.name,
) -> NoReturn:
    status = status_of(error, domain)
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def translated_in(domain: ErrorDomain) -> Callable[[Handler], Handler]:
    """Answer every failure of a `domain` RPC handler with the status code that says what
    it is."""

    def translated(method: Handler) -> Handler:
        @functools.wraps(method)
        async def wrapper(
            self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> Any:
            try:
                return await method(self, request, context)
            except errors.ReminderError as error:
                await abort(context, error, domain.name)
            except WriteOutcomeUnknown:
                log.warning(
                    "%s: a write's outcome is unknown: not settled, or hidden by later changes",
                    method.__name__,
                )
                await abort(context, errors.DeadlineExceeded(domain.unconfirmed), domain.name)
            except STORAGE_ERRORS as error:
                log.warning("%s: storage unavailable: %s", method.__name__, type(error).__name__)
                unavailable = errors.Unavailable("storage unavailable; retry with backoff")
                await abort(context, unavailable, domain.name)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if isinstance(error, grpc.aio.AbortError):
                    raise
                log.exception("%s failed", method.__name__)
                await context.abort(grpc.StatusCode.INTERNAL, "internal error")

        return wrapper  # type: ignore[return-value]

    return translated


translated = translated_in(REMINDERS)
