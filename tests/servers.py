"""Run an asyncio server object (`start()` / `stop()`) on its own loop and thread, as its
own process would, so synchronous test code can call it over the network; and what a
server answers bytes that are not its request."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol

import grpc


class Startable(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ServerThread:
    def __init__(self, server: Startable) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def run(self, work: Callable[[], Awaitable[object]], timeout_s: float = 60) -> None:
        async def call() -> None:
            await work()

        asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout_s)

    def start(self) -> None:
        self._thread.start()
        try:
            self.run(self.server.start)
        except BaseException:
            # Not started, so never stopped by its caller: its loop thread would run on.
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            raise

    def stop(self) -> None:
        self.run(self.server.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# A string field (number 1) holding bytes that are not UTF-8: no request message parses it.
UNDECODABLE_REQUEST = b"\x0a\x02\xff\xfe"


def refusal_of_undecodable(target: str, method: str) -> tuple[grpc.StatusCode, str]:
    """The code and message a plaintext server at `target` answers `method` called with
    bytes that are not its request (gRPC itself answered UNKNOWN and logged a traceback)."""
    with grpc.insecure_channel(target) as channel:
        raw: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
        try:
            raw(UNDECODABLE_REQUEST, timeout=10)
        except grpc.RpcError as error:
            return error.code(), error.details() or ""
    raise AssertionError(f"{method} answered bytes that are not its request")
