"""A real API server (grpc.aio, in a background thread) on the real Cassandra, and clients.

The server's clock is a `FakeClock` the test sets, so schedules and DST cases are
deterministic; Cassandra, gRPC, auth and the wire are all real.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genproto.reminders.v1 import reminders_pb2 as pb
from genproto.reminders.v1 import reminders_pb2_grpc as pb_grpc
from reminders_svc.api.auth import Authenticator, AuthSettings, mint_token
from reminders_svc.api.server import ApiServer
from reminders_svc.api.service import build_servicers
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import CassandraSettings
from reminders_svc.domain.limits import Limits
from reminders_svc.storage.session import CassandraConnection
from tests.grpc_errors import error_info_of
from tests.servers import ServerThread

DEV_ENV = {"REMINDERS_ENV": "dev"}


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@dataclass
class Api:
    target: str
    channel: grpc.Channel
    reminders: pb_grpc.RemindersServiceStub
    admin: pb_grpc.RemindersAdminServiceStub
    auth: AuthSettings
    clock: FakeClock

    def token(self, user: str, ttl_s: float = 600) -> str:
        return mint_token(self.auth.user, user, ttl_s)

    def as_user(self, user: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token(user)}"),)

    def as_admin(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {mint_token(self.auth.admin, 'ops', 600)}"),)


def _wait_serving(channel: grpc.Channel, timeout_s: float = 60) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status == 1:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise AssertionError("the API server did not become SERVING")


BuildServicers = Callable[[CassandraConnection, Authenticator, ApiSettings, FakeClock], Any]


@contextlib.contextmanager
def running_api(
    cassandra: CassandraSettings,
    clock: FakeClock,
    limits: Limits | None = None,
    build: BuildServicers = build_servicers,
    shutdown_grace: timedelta | None = None,
) -> Iterator[Api]:
    """An API server in a thread on `cassandra`, and a client of it; both stopped after."""
    defaults = ApiSettings.from_env(DEV_ENV)
    settings = dataclasses.replace(
        defaults,
        port=0,
        metrics_port=0,
        limits=limits or Limits(),
        shutdown_grace=shutdown_grace or defaults.shutdown_grace,
    )
    auth_settings = AuthSettings.from_env(DEV_ENV)

    def factory(connection: CassandraConnection, auth: Authenticator, api: ApiSettings) -> Any:
        return build(connection, auth, api, clock)

    server = ApiServer(settings, cassandra, Authenticator(auth_settings), factory)
    thread = ServerThread(server)
    thread.start()
    target = f"127.0.0.1:{server.port}"
    channel = grpc.insecure_channel(target)
    try:
        # Inside: a server that never serves is stopped too, not left for the worker's life.
        _wait_serving(channel)
        yield Api(
            target=target,
            channel=channel,
            reminders=pb_grpc.RemindersServiceStub(channel),
            admin=pb_grpc.RemindersAdminServiceStub(channel),
            auth=auth_settings,
            clock=clock,
        )
    finally:
        channel.close()
        thread.stop()


# Monday 2026-10-19 12:00 UTC: before the seed's Oct 26 and the Nov 1 DST change.
SEED_NOW = datetime(2026, 10, 19, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="session")
def api_session(migrated_settings: CassandraSettings) -> Iterator[Api]:
    with running_api(migrated_settings, FakeClock(SEED_NOW)) as api:
        yield api


@pytest.fixture
def api(api_session: Api) -> Api:
    api_session.clock.now = SEED_NOW
    return api_session


@pytest.fixture
def user() -> str:
    return f"user-{uuid.uuid4().hex[:10]}"


def code_of(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def reason_of(call: Callable[[], Any]) -> str:
    """The google.rpc.ErrorInfo reason of the error `call` raises (AIP-193)."""
    return str(error_info_of(call).reason)


def weekly_monday_nine(zone: str = "America/New_York") -> pb.Schedule:
    return pb.Schedule(
        time_zone=zone,
        repeat=pb.Repeat(expression="every Monday 09:00", start_local_time="2026-10-19T10:00:00"),
    )


def one_off(local: str, zone: str = "America/New_York") -> pb.Schedule:
    return pb.Schedule(time_zone=zone, once=pb.OneOff(local_time=local))


# Every per-user table of the keyspace (cql/) and a query for one user's rows of it. The
# API writes all but deliveries, whose history only DeleteUserData changes (deletes).
_USER_DATA_QUERIES = {
    "reminders": "SELECT * FROM reminders WHERE user_id = %s",
    "create_requests": "SELECT * FROM create_requests WHERE user_id = %s",
    "deliveries": "SELECT * FROM deliveries WHERE user_id = %s",
    # Buckets are partitioned by minute: a scan, fine on the test keyspace.
    "due_buckets": "SELECT * FROM due_buckets WHERE user_id = %s ALLOW FILTERING",
}


def snapshot_of(cassandra: CassandraConnection, *users: str) -> list[tuple[Any, ...]]:
    """Everything of `users` a request could change: rows, idempotency records, delivery
    history, bucket entries; each row (its user_id among its columns) led by its table."""
    return [
        (table, *row)
        for user in users
        for table, query in _USER_DATA_QUERIES.items()
        for row in cassandra.session.execute(query, (user,))
    ]
