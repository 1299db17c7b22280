"""The gRPC server around the servicers: health, reflection, TLS, metrics, shutdown.

The server starts even while Cassandra is unreachable, so that the health service can
say NOT_SERVING (a readiness probe keeps traffic away) instead of the pod crash-looping.
Until the first connection succeeds, the reminders RPCs answer UNAVAILABLE; then the
servicers are built and take over.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, cast

import grpc
import grpc.aio
from cassandra.cluster import Session
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from genproto.reminders.v1 import reminders_pb2, reminders_pb2_grpc
from reminders_svc.api.auth import Authenticator
from reminders_svc.api.errors import abort
from reminders_svc.api.service import metadata_of
from reminders_svc.api.settings import ApiSettings
from reminders_svc.api.undecodable import Observe, TolerantRequests
from reminders_svc.config import CassandraSettings, listen_address
from reminders_svc.connections import SERVER_OPTIONS
from reminders_svc.domain.errors import ReminderError, Unavailable
from reminders_svc.health import ProcessHealth, StorageProbe
from reminders_svc.runtime import (
    CannotServe,
    MetricsEndpoint,
    cancel_and_wait,
    export_from_start,
    process_registry,
    run_until_signal,
    stop_unless_waited_out,
)
from reminders_svc.storage.clock import DbClock, wall_clock_ahead
from reminders_svc.storage.loop_reactor import (
    built_patiently,
    close_on_loop,
    connect_on_loop_patiently,
)
from reminders_svc.storage.session import CassandraConnection
from reminders_svc.tls import add_port

log = logging.getLogger(__name__)

_SERVICE_DESCRIPTORS = tuple(
    reminders_pb2.DESCRIPTOR.services_by_name[name]
    for name in ("RemindersService", "RemindersAdminService")
)
REMINDERS_SERVICE, ADMIN_SERVICE = (service.full_name for service in _SERVICE_DESCRIPTORS)
# Every full method path the proto declares: the only `method` label values these services
# can produce, whatever path a caller sends.
DECLARED_METHODS = frozenset(
    f"/{service.full_name}/{method.name}"
    for service in _SERVICE_DESCRIPTORS
    for method in service.methods
)
# "" is the server as a whole, which is what most probes (grpc_health_probe, k8s) ask.
HEALTH_SERVICES = ("", REMINDERS_SERVICE, ADMIN_SERVICE)
# The codes each declared method's call count exports from the start: success, every
# server fault the error alert counts, and the commonest of the caller's.
_CODES_EXPORTED_FROM_START = (
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
)


class Servicers(Protocol):
    @property
    def reminders(self) -> reminders_pb2_grpc.RemindersServiceServicer: ...

    @property
    def admin(self) -> reminders_pb2_grpc.RemindersAdminServiceServicer: ...

    async def finish(self, timeout_s: float) -> None:
        """Let work begun by calls but outliving them finish (a shutdown's grace)."""
        ...


ServicerFactory = Callable[[CassandraConnection, Authenticator, ApiSettings], Servicers]


def default_servicers(
    connection: CassandraConnection, authenticator: Authenticator, settings: ApiSettings
) -> Servicers:
    from reminders_svc.api.service import build_servicers

    return build_servicers(connection, authenticator, settings)


class ApiMetrics:
    """Calls by method and status code, and their latency. Labels are bounded sets:
    method names registered on this server and status codes, never ids or texts."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "reminders_api_requests",
            "gRPC calls handled, by full method name and status code.",
            ("method", "code"),
            registry=registry,
        )
        self.duration = Histogram(
            "reminders_api_request_duration_seconds",
            "Time from a call's start to its last message, by full method name.",
            ("method",),
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.storage_up = Gauge(
            "reminders_api_storage_up",
            "1 while Cassandra answers the health probe, else 0.",
            registry=registry,
        )
        self.clock_offset = Gauge(
            "reminders_api_clock_offset_seconds",
            "Measured offset of the database clock minus this API server's (0 until"
            " first measured, once storage answers).",
            registry=registry,
        )
        self.clock_ready = Gauge(
            "reminders_api_clock_ready",
            "1 while this host's clock agrees with the database's within the dispatchers'"
            " skew allowance; 0 while it is off by more (the server is then not ready), and"
            " until first measured, once storage answers (see reminders_api_storage_up).",
            registry=registry,
        )
        export_from_start(
            self.requests,
            sorted(DECLARED_METHODS),
            (code.name for code in _CODES_EXPORTED_FROM_START),
        )

    @contextmanager
    def observe(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> Iterator[None]:
        started = time.perf_counter()
        code = grpc.StatusCode.UNKNOWN
        try:
            yield
            code = _code_set(context) or grpc.StatusCode.OK
        except asyncio.CancelledError:
            # gRPC cancels a handler whose deadline passed: the caller hears
            # DEADLINE_EXCEEDED, a server fault the error alert must see, not CANCELLED.
            # The caller's copy of the deadline runs out first (this one began when the call
            # arrived), and its cancel can come in with a little of this one left.
            remaining = context.time_remaining()
            timed_out = remaining is not None and remaining <= _DEADLINE_SLACK_S
            code = grpc.StatusCode.DEADLINE_EXCEEDED if timed_out else grpc.StatusCode.CANCELLED
            raise
        except BaseException:
            # context.abort() records its code before raising; anything else is UNKNOWN.
            code = _code_set(context) or grpc.StatusCode.UNKNOWN
            raise
        finally:
            self.requests.labels(method, code.name).inc()
            self.duration.labels(method).observe(time.perf_counter() - started)


# A cancel coming in this close to the call's deadline is the caller's deadline.
_DEADLINE_SLACK_S = 0.25


def _code_set(context: grpc.aio.ServicerContext[Any, Any]) -> grpc.StatusCode | None:
    # The stubs say StatusCode, but grpc.aio answers None until a code is set or aborted.
    return cast("grpc.StatusCode | None", context.code())


class MetricsInterceptor(TolerantRequests):
    """Every declared method's calls counted in `metrics`. An unknown method gets no
    handler, so callers cannot mint label values; health checks and reflection are not
    the API's traffic (the kubelet's probes, always OK, would dilute the error ratio and
    the latency of quiet replicas)."""

    def __init__(self, metrics: ApiMetrics) -> None:
        super().__init__()
        self._metrics = metrics

    def observer(self, method: str) -> Observe | None:
        if method not in DECLARED_METHODS:
            return None
        return functools.partial(self._metrics.observe, method)


class _HandlerRecorder:
    """Stands in for a server while the generated `add_*_to_server` functions run, so
    their handlers can be installed into a running server later."""

    def __init__(self) -> None:
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        """A lookup speed-up only; the generic handlers serve the same methods."""


def _storage_not_ready(
    authenticator: Authenticator, admin: bool
) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]:
    """A method's answer while storage was never reached: a caller without valid
    credentials is told so (UNAUTHENTICATED, PERMISSION_DENIED), as it will be later;
    the others, to retry."""

    async def answer(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        metadata = metadata_of(context)
        try:
            if admin:
                authenticator.require_admin(metadata)
            else:
                authenticator.user_id(metadata)
        except ReminderError as refused:
            await abort(context, refused)
        await abort(context, Unavailable("storage not reachable yet; retry"))

    return answer


class StorageBoundHandlers(grpc.GenericRpcHandler):
    """The reminders services, answering UNAVAILABLE until their servicers are installed.

    Only declared methods get a handler, before as after: any other path is UNIMPLEMENTED
    and never reaches the metrics, so callers cannot mint label values.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self._installed: list[grpc.GenericRpcHandler] = []
        self._not_ready: dict[bool, grpc.RpcMethodHandler[Any, Any]] = {
            admin: grpc.unary_unary_rpc_method_handler(_storage_not_ready(authenticator, admin))
            for admin in (False, True)
        }

    def install(self, servicers: Servicers) -> None:
        recorder = _HandlerRecorder()
        # The generated functions only call the two methods the recorder has.
        as_server = cast(grpc.aio.Server, recorder)
        reminders_pb2_grpc.add_RemindersServiceServicer_to_server(servicers.reminders, as_server)
        reminders_pb2_grpc.add_RemindersAdminServiceServicer_to_server(servicers.admin, as_server)
        self._installed = recorder.handlers

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        for handler in self._installed:
            found = handler.service(handler_call_details)
            if found is not None:
                return found
        method = handler_call_details.method
        if not self._installed and method in DECLARED_METHODS:
            return self._not_ready[method.startswith(f"/{ADMIN_SERVICE}/")]
        return None


class ApiServer:
    """One API process: `await start()`, later `await stop()` (graceful)."""

    def __init__(
        self,
        settings: ApiSettings,
        cassandra: CassandraSettings,
        authenticator: Authenticator,
        servicer_factory: ServicerFactory = default_servicers,
    ) -> None:
        self._settings = settings
        self._cassandra = cassandra
        self._authenticator = authenticator
        self._servicer_factory = servicer_factory
        self._registry = process_registry()
        self._metrics = ApiMetrics(self._registry)
        self._health = ProcessHealth(HEALTH_SERVICES, self._metrics.storage_up)
        self._services = StorageBoundHandlers(authenticator)
        self._connection: CassandraConnection | None = None
        self._storage_task: asyncio.Task[None] | None = None
        self._servicers: Servicers | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._server: grpc.aio.Server | None = None
        # The ports bound (differ from the settings when those ask for 0: any free port).
        self.port = settings.port
        self.metrics_port = settings.metrics_port

    async def start(self) -> None:
        max_bytes = self._settings.limits.max_message_bytes
        server = grpc.aio.server(
            handlers=[self._services],
            interceptors=[MetricsInterceptor(self._metrics)],
            # Only requests are capped: a page of 500 reminders is larger than any request.
            options=[("grpc.max_receive_message_length", max_bytes), *SERVER_OPTIONS],
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health.servicer, server)
        await self._health.start()
        if self._settings.reflection:
            names = (*HEALTH_SERVICES[1:], health.SERVICE_NAME, reflection.SERVICE_NAME)
            reflection.enable_server_reflection(names, server)
        self.port = add_port(server, self._settings.host, self._settings.port, self._settings.tls)
        self._metrics_endpoint = MetricsEndpoint(
            self._registry, self._settings.host, self._settings.metrics_port
        )
        self.metrics_port = self._metrics_endpoint.port
        await server.start()
        self._server = server
        self._storage_task = asyncio.create_task(self._keep_storage(), name="storage-health")
        log.info(
            "reminders API listening on %s (tls=%s, mtls=%s, reflection=%s), metrics on :%d",
            listen_address(self._settings.host, self.port),
            self._settings.tls is not None,
            self._settings.tls is not None and self._settings.tls.mutual,
            self._settings.reflection,
            self.metrics_port,
        )

    async def failure(self) -> None:
        """Raises CannotServe if setting up storage failed on something waiting will not
        mend (a role lacking a grant, a bug): the process exits, and its restarts show."""
        assert self._storage_task is not None
        await asyncio.shield(self._storage_task)  # raises CannotServe when set-up failed
        raise CannotServe("the storage health probe ended")

    async def stop(self) -> None:
        """Readiness off, stop accepting, let in-flight calls and the work they began (an
        operator's purge) finish: all within the one grace, which the pod's termination
        grace period is sized for."""
        grace = self._settings.shutdown_grace.total_seconds()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        log.info("shutting down: draining in-flight calls for up to %.0f s", grace)
        await self._health.shut_down()
        if self._server is not None:
            await self._server.stop(grace)
        if self._servicers is not None:
            await self._servicers.finish(max(0.0, deadline - loop.time()))
        if self._storage_task is not None:
            await cancel_and_wait(self._storage_task)
        if self._connection is not None:
            await close_on_loop(self._connection)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()
        log.info("stopped")

    async def _keep_storage(self) -> None:
        interval = self._settings.health_probe_interval.total_seconds()
        # Without servicers the process can never serve: failure() stops it, saying why.
        with stop_unless_waited_out("setting up storage"):
            connection = await connect_on_loop_patiently(self._cassandra, interval)
            self._connection = connection
            servicers = await built_patiently(
                lambda: self._servicer_factory(connection, self._authenticator, self._settings),
                interval,
                "preparing statements",
            )
        self._services.install(servicers)
        self._servicers = servicers
        await self._health.follow_storage(
            connection.session, interval, self._clock_probe(connection.session)
        )

    def _clock_probe(self, session: Session) -> StorageProbe:
        """The storage probe measures this host's clock against the database's: off by more
        than the skew allowance, a bucket entry this server writes may land in a minute
        the dispatchers have closed, and its reminder never ring (DESIGN.md invariant 3)."""
        hooked = "wall_clock_ahead" in self._settings.faults
        clock = DbClock(
            session, self._settings.max_clock_offset, wall_clock_ahead() if hooked else time.time
        )
        was_off = False

        async def clock_agrees(timeout_s: float) -> bool:
            nonlocal was_off
            await clock.measure(timeout_s)
            self._metrics.clock_offset.set(clock.offset_s)
            off = clock.known_off()
            self._metrics.clock_ready.set(0 if off else 1)
            if off and not was_off:
                log.error(
                    "not ready: the database's clock is %+.1f s off this host's (bound %g s)",
                    clock.offset_s,
                    self._settings.max_clock_offset.total_seconds(),
                )
            elif was_off and not off:
                log.info("this host's clock agrees with the database's again")
            was_off = off
            return not off

        return clock_agrees


async def serve(
    settings: ApiSettings,
    cassandra: CassandraSettings,
    authenticator: Authenticator,
    servicer_factory: ServicerFactory = default_servicers,
) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    await run_until_signal(ApiServer(settings, cassandra, authenticator, servicer_factory))
