"""Process plumbing every long-running process of the project shares: its metrics registry
and /metrics endpoint, and running a server until SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.metrics import MetricWrapperBase

from reminders_svc.concurrency import unless_stopped
from reminders_svc.config import bare_host

log = logging.getLogger(__name__)


def process_registry() -> CollectorRegistry:
    """A process's own metrics registry, with the client's standard collectors: resident
    memory, CPU, open file descriptors (process_*), garbage collection and the Python
    version (python_*). A private registry has none of them by default."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def export_from_start(metric: MetricWrapperBase, *label_values: Iterable[str]) -> None:
    """Every combination of `label_values` (one iterable per label, in order) exported by
    `metric` from the start: a series born at its first increment shows no rise to
    rate() or increase(), so that increment, on every pod, went uncounted."""
    for values in itertools.product(*label_values):
        metric.labels(*values)


class MetricsEndpoint:
    """Prometheus /metrics of one registry on its own port (0: any free port)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._http: WSGIServer
        try:
            self._http, _ = start_http_server(port, addr=bare_host(host), registry=registry)
        except OSError as error:
            # As the gRPC port's failure reads (tls.add_port): the address, not only errno.
            reason = error.strerror or type(error).__name__
            raise OSError(f"cannot serve /metrics on {host}:{port}: {reason}") from None
        self.port: int = self._http.server_address[1]

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


class CannotServe(Exception):
    """A server met, while it ran, an error it can never recover from by waiting (a role
    lacking a grant, a bug building its services): better exit and be restarted, where
    the restarts show, than sit NOT_SERVING for ever."""


class Stoppable(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def failure(self) -> None:
        """Raises CannotServe once the server cannot serve any more; else never returns."""
        ...


@contextmanager
def stop_unless_waited_out(what: str, passing: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Around a server's set-up, which waits out storage errors (an outage): any other
    error (a role lacking a grant) is logged and raised as CannotServe, so the process
    exits saying why. Errors of `passing` types go through as they are."""
    try:
        yield
    except passing:
        raise
    except Exception as error:
        log.exception("%s failed; stopping", what)
        raise CannotServe(f"{what} failed: {type(error).__name__}: {error}") from error


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """`task` cancelled and ended. An error it had ended on is not raised: a server's
    failure() reported it (and it is marked retrieved, which asyncio would log)."""
    task.cancel()
    await asyncio.wait((task,))
    if not task.cancelled():
        task.exception()


# Signals this soon after the first are the same stop delivered twice: `timeout`, and
# shell wrappers, signal the process and then its group.
SAME_STOP_S = 1.0


def on_stop_signals(stop: Callable[[], None]) -> None:
    """`stop()` on the first SIGTERM or SIGINT; on a second, `SAME_STOP_S` or more later,
    exit at once (128 + that signal's number, as the shell reports a process it killed:
    130 for SIGINT, 143 for SIGTERM), as one pressing Ctrl-C again means: a graceful stop
    may take its whole grace."""
    loop = asyncio.get_running_loop()
    first_at: float | None = None

    def on_signal(signum: signal.Signals) -> None:
        nonlocal first_at
        if first_at is not None:
            if loop.time() - first_at < SAME_STOP_S:
                return
            print("second signal: exiting without finishing the stop", file=sys.stderr)
            os._exit(128 + signum)
        first_at = loop.time()
        stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)


async def run_until_signal(server: Stoppable) -> None:
    """Start `server`, run until SIGTERM or SIGINT, then stop it (gracefully); or until it
    fails for good, then stop it and raise CannotServe."""
    stopping = asyncio.Event()
    on_stop_signals(stopping.set)
    failed: asyncio.Task[None] | None = None
    try:
        # A start still waiting for the database is given up on a signal, not waited out.
        await unless_stopped(server.start(), stopping)
        if not stopping.is_set():
            failed = asyncio.create_task(server.failure(), name="failure")
            signalled = asyncio.create_task(stopping.wait(), name="signal")
            await asyncio.wait((failed, signalled), return_when=asyncio.FIRST_COMPLETED)
            signalled.cancel()
    finally:
        if failed is not None and not failed.done():
            failed.cancel()
        try:
            await server.stop()
        finally:
            if failed is not None and failed.done() and not failed.cancelled():
                failed.result()  # raises why (even when the stop failed too)
