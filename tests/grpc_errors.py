"""What a refused call carries (AIP-193), as the reminders API and the notifier answer it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


def _status_of(call: Callable[[], Any]) -> status_pb2.Status:
    """The google.rpc.Status of the error `call` raises."""
    try:
        call()
    except grpc.RpcError as error:
        status = rpc_status.from_call(error)
        assert status is not None, "no google.rpc.Status in the trailers"
        return status
    raise AssertionError("the call succeeded")


def error_info_of(call: Callable[[], Any]) -> error_details_pb2.ErrorInfo:
    """The google.rpc.ErrorInfo of the error `call` raises (AIP-193)."""
    info = error_details_pb2.ErrorInfo()
    assert _status_of(call).details[0].Unpack(info), "the first detail is no ErrorInfo"
    return info


def retry_delay_of(call: Callable[[], Any]) -> timedelta:
    """How soon the error `call` raises says to retry (its google.rpc.RetryInfo, AIP-194)."""
    retry_info = error_details_pb2.RetryInfo()
    [detail] = [d for d in _status_of(call).details if d.Is(retry_info.DESCRIPTOR)]
    detail.Unpack(retry_info)
    delay: timedelta = retry_info.retry_delay.ToTimedelta()
    return delay


def assert_refused(
    error: grpc.RpcError,
    code: grpc.StatusCode,
    field: str,
    reason: str,
    domain: str = "reminders.v1",
) -> None:
    """`error` has `code`, an ErrorInfo with `reason` in `domain`, and names just `field`:
    in a google.rpc.BadRequest (INVALID_ARGUMENT) or as a PreconditionFailure's subject."""
    assert error.code() == code, error.details()
    status = rpc_status.from_call(error)
    assert status is not None, "no google.rpc.Status in the trailers"
    info, about_field = error_details_pb2.ErrorInfo(), _FIELD_DETAIL[code]()
    assert len(status.details) == 2
    assert status.details[0].Unpack(info)
    assert status.details[1].Unpack(about_field)
    assert (info.reason, info.domain) == (reason, domain)
    if isinstance(about_field, error_details_pb2.BadRequest):
        assert [v.field for v in about_field.field_violations] == [field]
    else:
        assert [(v.type, v.subject) for v in about_field.violations] == [(reason, field)]


_FIELD_DETAIL: dict[grpc.StatusCode, type[Any]] = {
    grpc.StatusCode.INVALID_ARGUMENT: error_details_pb2.BadRequest,
    grpc.StatusCode.FAILED_PRECONDITION: error_details_pb2.PreconditionFailure,
}
