"""The notifier process: gRPC (NotificationService + health), /metrics, push workers,
and a graceful stop (stop accepting, drain the queue within the grace, hand back what is
left: its callers are answered "retry" and its keys released)."""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import suppress

import grpc.aio
from cassandra.cluster import Session
from grpc_health.v1 import health_pb2_grpc

from genproto.notification.v1 import notification_pb2, notification_pb2_grpc
from notifier.delivery.adapters import Clock, build_adapter, utc_now
from notifier.delivery.queue import DeliveryQueue
from notifier.delivery.workers import DeliveryPolicy, PushWorkers
from notifier.domain.model import Priority
from notifier.domain.push import PushAdapter
from notifier.intake import Intake, IntakeLimits
from notifier.metrics import NotifierMetrics
from notifier.rpc.errors import NOTIFIER
from notifier.rpc.servicer import NotificationServicer
from notifier.settings import NotifierSettings
from notifier.storage.devices import DeviceStore
from notifier.storage.keys import KeyStore
from notifier.storage.schema import apply_notifier_schema
from reminders_svc.api.undecodable import TolerantRequests
from reminders_svc.concurrency import to_the_end
from reminders_svc.connections import SERVER_OPTIONS
from reminders_svc.health import ProcessHealth
from reminders_svc.runtime import (
    CannotServe,
    MetricsEndpoint,
    cancel_and_wait,
    process_registry,
    run_until_signal,
    stop_unless_waited_out,
)
from reminders_svc.storage.loop_reactor import (
    built_patiently,
    close_on_loop,
    connect_on_loop_patiently,
    patiently,
)
from reminders_svc.storage.migrations import MigrationError, MigrationReport, MigrationStopped
from reminders_svc.storage.session import CassandraConnection
from reminders_svc.tls import add_port

log = logging.getLogger(__name__)

NOTIFICATION_SERVICE = notification_pb2.DESCRIPTOR.services_by_name["NotificationService"].full_name
# Of the shutdown grace, the last seconds are for settling and releasing keys.
_RELEASE_RESERVE_S = 2.0
# "" is the server as a whole, which is what most probes (grpc_health_probe, k8s) ask.
HEALTH_SERVICES = ("", NOTIFICATION_SERVICE)


async def _migrated(session: Session, settings: NotifierSettings) -> MigrationReport:
    """One attempt at the notifier's schema. Stopped meanwhile, it gives up at its next
    safe point (waiting for another migrator's lock, or between two statements) and the
    stop waits for that (a second signal does not): cut short in a statement, it would
    leave the schema lock to expire (5 minutes), and the next start would wait for it."""
    stopping = threading.Event()
    attempt = asyncio.ensure_future(
        # A notifier rolled back serves on a newer schema (the migration at its start must
        # not crash-loop it), as the other processes of an older release do.
        asyncio.to_thread(
            apply_notifier_schema, session, settings.cassandra, stopping, ahead_ok=True
        )
    )
    try:
        return await asyncio.shield(attempt)
    except asyncio.CancelledError:
        stopping.set()
        try:
            await to_the_end(attempt)
        except MigrationStopped as stopped:
            log.info("migration %s", stopped)  # where: the next start goes on from there
        except asyncio.CancelledError:
            pass  # stopped again meanwhile: the attempt has ended all the same
        except Exception:  # the stop goes on; the next start meets it again
            log.exception("the migration failed as it was stopping")
        raise


class NotifierServer:
    """`await start()`, later `await stop()`. `migrate`: bring the keyspace up to date
    first (the process does; tests migrate once themselves); `adapter` replaces the one
    the settings name (tests)."""

    def __init__(
        self,
        settings: NotifierSettings,
        adapter: PushAdapter | None = None,
        clock: Clock = utc_now,
        *,
        migrate: bool = False,
    ) -> None:
        self._settings = settings
        self._migrate = migrate
        self.adapter = adapter or build_adapter(settings.adapter, settings.recording_capacity)
        self._clock = clock
        self.registry = process_registry()
        self._metrics = NotifierMetrics(self.registry)
        self._metrics.export_adapter(self.adapter.name)
        self._health = ProcessHealth(HEALTH_SERVICES, self._metrics.storage_up)
        self._connection: CassandraConnection | None = None
        self._workers: PushWorkers | None = None
        self._intake: Intake | None = None
        self._server: grpc.aio.Server | None = None
        self._metrics_endpoint: MetricsEndpoint | None = None
        self._probe_task: asyncio.Task[None] | None = None
        # The ports bound (differ from the settings when those ask for 0: any free port).
        self.port = settings.port
        self.metrics_port = settings.metrics_port

    async def start(self) -> None:
        settings = self._settings
        # MigrationError: a schema at odds with this release, its message says which.
        with stop_unless_waited_out("setting up storage", passing=(MigrationError,)):
            session, keyspace, keys, devices = await self._storage()

        def on_depth(priority: Priority, depth: int) -> None:
            self._metrics.queue_depth.labels(priority.value).set(depth)

        queue = DeliveryQueue(on_depth=on_depth)
        policy = DeliveryPolicy(
            workers=settings.push_workers,
            max_attempts=settings.push_max_attempts,
            retry_backoff=settings.push_retry_backoff,
            push_timeout=settings.push_timeout,
            auto_device=settings.auto_device,
            crash_before_push=settings.faults.crash_before_push,
            give_up_after=settings.push_give_up_after,
        )
        self._workers = PushWorkers(
            queue, self.adapter, devices, keys, policy, self._metrics, self._clock
        )
        self._workers.start()
        limits = IntakeLimits(settings.batch_concurrency, settings.max_pending)
        intake = Intake(keys, queue, self._metrics, limits, self._clock)
        self._intake = intake

        server = grpc.aio.server(
            options=SERVER_OPTIONS, interceptors=[TolerantRequests(NOTIFIER.name)]
        )
        servicer = NotificationServicer(intake, devices, self.adapter, settings.faults)
        notification_pb2_grpc.add_NotificationServiceServicer_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health.servicer, server)
        await self._health.start()
        self.port = add_port(server, settings.host, settings.port, settings.tls)
        self._metrics_endpoint = MetricsEndpoint(
            self.registry, settings.host, settings.metrics_port
        )
        self.metrics_port = self._metrics_endpoint.port
        await server.start()
        self._server = server
        self._probe_task = asyncio.create_task(
            self._health.follow_storage(session, settings.health_probe_interval.total_seconds()),
            name="storage-health",
        )
        log.info(
            "notifier listening on %s:%d (tls=%s, mtls=%s, adapter=%s, auto_device=%s,"
            " keyspace=%s), metrics on :%d",
            settings.host,
            self.port,
            settings.tls is not None,
            settings.tls is not None and settings.tls.mutual,
            self.adapter.name,
            settings.auto_device,
            keyspace,
            self.metrics_port,
        )

    async def _storage(self) -> tuple[Session, str, KeyStore, DeviceStore]:
        """The keyspace migrated (when asked), connected and its statements prepared;
        waiting for the database (not listening meanwhile, so not ready) rather than exit."""
        settings = self._settings
        retry_s = settings.health_probe_interval.total_seconds()
        # Migrating: connected without a keyspace, which may not exist yet (every statement
        # names its keyspace); otherwise with it, so a missing one is said at once.
        self._connection = await connect_on_loop_patiently(
            settings.cassandra, retry_s, keyspace="" if self._migrate else None
        )
        session, keyspace = self._connection.session, settings.cassandra.keyspace
        if self._migrate:
            report = await patiently("migrating", lambda: _migrated(session, settings), retry_s)
            log.info(
                "keyspace %s: applied %s, already applied %s",
                keyspace,
                list(report.applied),
                list(report.already_applied),
            )
        keys, devices = await built_patiently(
            lambda: (
                KeyStore(session, keyspace, settings.key_ttl, settings.key_takeover_after),
                DeviceStore(session, keyspace),
            ),
            retry_s,
            "preparing statements",
        )
        return session, keyspace, keys, devices

    async def failure(self) -> None:
        """Raises CannotServe if the storage health probe ended (a bug: it keeps probing
        through outages); a failed start raises from start() itself."""
        assert self._probe_task is not None
        try:
            await asyncio.shield(self._probe_task)
        except Exception as error:
            raise CannotServe(f"the storage probe failed: {type(error).__name__}") from error
        raise CannotServe("the storage health probe ended")

    async def stop(self) -> None:
        """Readiness off, stop accepting, drain the queue; all within the shutdown grace."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.shutdown_grace.total_seconds()
        log.info("shutting down: draining for up to %s", self._settings.shutdown_grace)
        await self._health.shut_down()
        # The end of the grace is kept for releasing the keys of what was not pushed.
        pushing_until = deadline - min(
            _RELEASE_RESERVE_S, self._settings.shutdown_grace.total_seconds() / 2
        )
        if self._server is not None:
            await self._server.stop(max(0.0, pushing_until - loop.time()))
        if self._workers is not None:
            await self._workers.stop(max(0.0, pushing_until - loop.time()))
        if self._intake is not None:
            # Every delivery has ended now; settle or release its key before disconnecting.
            with suppress(TimeoutError):
                await asyncio.wait_for(
                    self._intake.drained(), timeout=max(0.5, deadline - loop.time())
                )
        if self._probe_task is not None:
            await cancel_and_wait(self._probe_task)
        if self._connection is not None:
            await close_on_loop(self._connection)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()
        log.info("stopped")


async def serve(settings: NotifierSettings) -> None:
    """Migrate, then run until SIGTERM or SIGINT, then shut down gracefully."""
    await run_until_signal(NotifierServer(settings, migrate=True))
