"""Requests whose bytes are not their message, answered INVALID_ARGUMENT on every server.

gRPC itself answers a request it cannot parse UNKNOWN, with the parser's exception as the
message, and logs a traceback per call. Each server of the project (the API, the
notifier, the dispatcher's health port) wraps its handlers here instead: the parser's
failure becomes a marker, and the handler answers it INVALID_ARGUMENT, field "request".
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from reminders_svc.api.errors import REMINDERS, abort
from reminders_svc.domain.errors import InvalidArgument

# What a call is observed in (metrics), given its context; None observes nothing.
Observe = Callable[[grpc.aio.ServicerContext[Any, Any]], AbstractContextManager[None]]


class _Undecodable:
    """Stands for a request whose bytes are not its message."""


_UNDECODABLE = _Undecodable()


def _tolerant(parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if parse is None:
        return None

    def parsed_or_undecodable(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return _UNDECODABLE

    return parsed_or_undecodable


async def _refuse_undecodable(
    method: str, context: grpc.aio.ServicerContext[Any, Any], domain: str
) -> None:
    name = method.rsplit("/", 1)[-1]
    await abort(context, InvalidArgument("request", f"not a valid {name} request"), domain)


def tolerant_handler(
    handler: grpc.RpcMethodHandler[Any, Any],
    method: str,
    observe: Observe | None = None,
    domain: str = REMINDERS.name,
) -> grpc.RpcMethodHandler[Any, Any]:
    """`handler` answering undecodable requests INVALID_ARGUMENT (an ErrorInfo of
    `domain`), each call in `observe`."""

    def observed_in(context: grpc.aio.ServicerContext[Any, Any]) -> AbstractContextManager[None]:
        return nullcontext() if observe is None else observe(context)

    def single(behavior: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        async def observed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with observed_in(context):
                if request is _UNDECODABLE:
                    await _refuse_undecodable(method, context, domain)
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result

        return observed

    def streamed(behavior: Callable[..., Any]) -> Callable[..., Any]:
        # Keep the behavior's own shape: an async generator, or a coroutine that writes.
        if inspect.isasyncgenfunction(behavior):

            async def observed_stream(
                request: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> AsyncIterator[Any]:
                with observed_in(context):
                    if request is _UNDECODABLE:
                        await _refuse_undecodable(method, context, domain)
                    async for response in behavior(request, context):
                        yield response

            return observed_stream
        return single(behavior)

    serialization: dict[str, Any] = {
        "request_deserializer": (
            handler.request_deserializer
            if handler.request_streaming
            else _tolerant(handler.request_deserializer)
        ),
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(single(handler.unary_unary), **serialization)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(single(handler.stream_unary), **serialization)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streamed(handler.unary_stream), **serialization)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(
            streamed(handler.stream_stream), **serialization
        )
    return handler


class TolerantRequests(grpc.aio.ServerInterceptor):
    """Installs `tolerant_handler` on every method, observed as `observer` says; its
    refusals name `domain`'s errors."""

    def __init__(self, domain: str = REMINDERS.name) -> None:
        self._domain = domain

    def observer(self, method: str) -> Observe | None:
        """What `method`'s calls are observed in (a server's metrics); here nothing."""
        return None

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: UNIMPLEMENTED, as gRPC answers it
            return None
        method = handler_call_details.method
        return tolerant_handler(handler, method, self.observer(method), self._domain)
