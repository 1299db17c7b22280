"""`reminders serve-api` riding out a Cassandra outage that begins while it serves.

The API reaches the real node through a `TcpProxy`; cutting it takes the database away
from the API process alone, while the test keeps watching through gRPC.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, cast

import grpc
import pytest
from cassandra import ConsistencyLevel, ReadTimeout, WriteTimeout, WriteType
from cassandra.cluster import Session
from google.protobuf import duration_pb2, field_mask_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genproto.reminders.v1 import reminders_pb2 as pb
from genproto.reminders.v1 import reminders_pb2_grpc as pb_grpc
from reminders_svc.api.auth import Authenticator, AuthSettings
from reminders_svc.api.server import REMINDERS_SERVICE, ApiServer, Servicers
from reminders_svc.api.service import ApiServicers, build_servicers
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import CassandraSettings
from reminders_svc.health import LIVENESS_SERVICE
from reminders_svc.storage.retry import is_conditional
from reminders_svc.storage.session import CassandraConnection
from tests.api.conftest import DEV_ENV, SEED_NOW, FakeClock, code_of, one_off, running_api
from tests.api.serving import NOT_SERVING, SERVING, ServedApi, serve_api
from tests.api.test_contract import SERVICE_CONFIG
from tests.api.test_server import Samples, metric_samples_once, user_metadata
from tests.grpc_errors import retry_delay_of
from tests.servers import ServerThread
from tests.tcp_proxy import TcpProxy

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
# Seconds a call may take while the database is gone: it must fail fast, not hang.
CALL_TIMEOUT_S = 15
# Long enough for the driver to mark the node down and try it again several times.
OUTAGE_S = 10


@pytest.fixture
def proxy(migrated_settings: CassandraSettings) -> Iterator[TcpProxy]:
    proxy = TcpProxy(migrated_settings.contact_points[0], migrated_settings.port)
    yield proxy
    proxy.close()


def create_request(request_id: str, text: str) -> pb.CreateReminderRequest:
    return pb.CreateReminderRequest(
        request_id=request_id,
        reminder=pb.Reminder(text=text, schedule=one_off("2030-06-03T09:00:00")),
    )


Metadata = tuple[tuple[str, str], ...]


def every_user_call(
    stub: pb_grpc.RemindersServiceStub,
    metadata: Metadata,
    existing: pb.Reminder,
    create: pb.CreateReminderRequest,
) -> dict[str, Callable[[], Any]]:
    """One call of each RPC a user makes: `create`, and the others on `existing`."""
    edit = pb.Reminder(id=existing.id, version=existing.version, text="edited during outage")

    def call(method: Callable[..., Any], request: Any) -> Callable[[], Any]:
        return lambda: method(request, metadata=metadata, timeout=CALL_TIMEOUT_S)

    return {
        "CreateReminder": call(stub.CreateReminder, create),
        "GetReminder": call(stub.GetReminder, pb.GetReminderRequest(id=existing.id)),
        "ListReminders": call(stub.ListReminders, pb.ListRemindersRequest()),
        "UpdateReminder": call(
            stub.UpdateReminder,
            pb.UpdateReminderRequest(
                reminder=edit, update_mask=field_mask_pb2.FieldMask(paths=["text"])
            ),
        ),
        "SnoozeReminder": call(
            stub.SnoozeReminder,
            pb.SnoozeReminderRequest(id=existing.id, duration=duration_pb2.Duration(seconds=600)),
        ),
        "SnoozeReminder(local time)": call(
            stub.SnoozeReminder,
            pb.SnoozeReminderRequest(id=existing.id, snooze_until_local_time="2030-06-03T10:00"),
        ),
        "PauseReminder": call(stub.PauseReminder, pb.PauseReminderRequest(id=existing.id)),
        "ResumeReminder": call(stub.ResumeReminder, pb.ResumeReminderRequest(id=existing.id)),
        "DeleteReminder": call(stub.DeleteReminder, pb.DeleteReminderRequest(id=existing.id)),
        "ListDeliveries": call(
            stub.ListDeliveries, pb.ListDeliveriesRequest(reminder_id=existing.id)
        ),
    }


def creates_refused_whenever_sent(
    stub: pb_grpc.RemindersServiceStub, metadata: Metadata
) -> dict[str, Callable[[], Any]]:
    """Creates, each with a request_id, whose fields are wrong whenever they are sent:
    no earlier request can have made anything of them, so they need no read to refuse."""
    schedules = {
        "a zone that is no zone": one_off("2030-06-03T09:00:00", zone="Mars/Olympus_Mons"),
        "a local time that is no time": one_off("2030-06-03T25:00:00"),
        "a repeat from a start that never matches": pb.Schedule(
            time_zone="Europe/Paris",
            repeat=pb.Repeat(
                rrule="FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30",
                start_local_time="2030-01-01T09:00",
            ),
        ),
        # A repeat without a start begins when it is sent, so a replay of one whose end
        # has passed since is looked up; these are wrong at any start (they were answered
        # UNAVAILABLE, as the lookup failed).
        "a repeat without a start, in no zone": pb.Schedule(
            time_zone="Mars/Olympus_Mons", repeat=pb.Repeat(expression="every day 09:00")
        ),
        "a repeat without a start, in no grammar": pb.Schedule(
            time_zone="Europe/Paris", repeat=pb.Repeat(expression="every blah")
        ),
    }
    requests = {
        name: pb.CreateReminderRequest(
            request_id=f"req-{uuid.uuid4()}", reminder=pb.Reminder(text="t", schedule=schedule)
        )
        for name, schedule in schedules.items()
    }
    requests["a text too long"] = create_request(f"req-{uuid.uuid4()}", "x" * 501)
    return {
        name: lambda request=request: stub.CreateReminder(  # type: ignore[misc]
            request, metadata=metadata, timeout=CALL_TIMEOUT_S
        )
        for name, request in requests.items()
    }


def wait_for_health_of_every_service(api: ServedApi, wanted: int, timeout_s: float) -> None:
    """Until both the server as a whole and the reminders service say `wanted`."""
    deadline = time.monotonic() + timeout_s
    api.wait_for_health(wanted, timeout_s)
    while api.health(REMINDERS_SERVICE) != wanted:
        assert time.monotonic() < deadline, f"{REMINDERS_SERVICE} never said {wanted}"
        time.sleep(0.2)


def test_the_api_rides_out_a_storage_outage_that_begins_while_it_serves(
    migrated_settings: CassandraSettings, proxy: TcpProxy
) -> None:
    user = f"outage-{uuid.uuid4().hex[:10]}"
    metadata = user_metadata(user)
    # Texts the log must never carry, however the calls fail.
    before_text = f"before the outage {uuid.uuid4().hex}"
    during_text = f"during the outage {uuid.uuid4().hex}"
    through_proxy = dataclasses.replace(migrated_settings, port=proxy.port)

    with serve_api(through_proxy) as api, grpc.insecure_channel(api.target) as channel:
        api.wait_for_health(SERVING)
        stub = pb_grpc.RemindersServiceStub(channel)

        before = stub.CreateReminder(
            create_request(f"req-{uuid.uuid4()}", before_text), metadata=metadata, timeout=10
        )
        got = stub.GetReminder(pb.GetReminderRequest(id=before.id), metadata=metadata, timeout=10)
        assert got.text == before_text

        proxy.cut()
        outage_began = time.monotonic()
        wait_for_health_of_every_service(api, NOT_SERVING, timeout_s=10)

        during = create_request(f"req-{uuid.uuid4()}", during_text)
        calls = every_user_call(stub, metadata, before, during)
        refused = creates_refused_whenever_sent(stub, metadata)
        # Once as the outage begins, once after the driver has tried to reconnect a while.
        for _ in range(2):
            codes = {name: code_of(call) for name, call in calls.items()}
            assert codes == dict.fromkeys(codes, grpc.StatusCode.UNAVAILABLE)
            codes = {name: code_of(call) for name, call in refused.items()}
            assert codes == dict.fromkeys(codes, grpc.StatusCode.INVALID_ARGUMENT)
            assert api.process.poll() is None, "serve-api exited during the outage"
            time.sleep(max(0.0, outage_began + OUTAGE_S - time.monotonic()))
        assert api.health() == NOT_SERVING
        # Not ready, but alive: a restart would bring no database back.
        assert api.health(LIVENESS_SERVICE) == SERVING

        proxy.restore()
        wait_for_health_of_every_service(api, SERVING, timeout_s=60)

        got = stub.GetReminder(pb.GetReminderRequest(id=before.id), metadata=metadata, timeout=10)
        assert (got.text, got.version) == (before_text, before.version)
        replayed = stub.CreateReminder(during, metadata=metadata, timeout=10)
        again = stub.CreateReminder(during, metadata=metadata, timeout=10)
        assert again.id == replayed.id
        listed = stub.ListReminders(pb.ListRemindersRequest(), metadata=metadata, timeout=10)
        assert sorted((r.id, r.text) for r in listed.reminders) == sorted(
            [(before.id, before_text), (replayed.id, during_text)]
        )

        assert api.terminate() == 0
        output = api.output()

    assert "stopped" in output
    assert "Traceback" not in output, output
    assert before_text not in output
    assert during_text not in output


def test_an_outage_that_begins_as_the_api_prepares_its_statements_is_waited_out(
    migrated_settings: CassandraSettings, proxy: TcpProxy
) -> None:
    """The node answers the first connect, then goes away while the servicers are being
    built (they prepare their statements): the API stays up, NOT_SERVING, and serves once
    the node is back, instead of staying NOT_SERVING for good."""
    builds = 0

    def outage_as_first_built(
        connection: CassandraConnection, auth: Authenticator, settings: ApiSettings
    ) -> Servicers:
        nonlocal builds
        builds += 1
        if builds == 1:
            proxy.cut()
        return build_servicers(connection, auth, settings)

    settings = dataclasses.replace(
        ApiSettings.from_env(DEV_ENV),
        port=0,
        metrics_port=0,
        health_probe_interval=timedelta(seconds=0.5),
    )
    server = ApiServer(
        settings,
        dataclasses.replace(migrated_settings, port=proxy.port),
        Authenticator(AuthSettings.from_env(DEV_ENV)),
        outage_as_first_built,
    )
    user = f"outage-{uuid.uuid4().hex[:10]}"
    with ServerThread(server), grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)

        def status() -> int:
            answer: int = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            return answer

        deadline = time.monotonic() + 10
        while builds == 0:
            assert time.monotonic() < deadline, "the API never connected to build its servicers"
            time.sleep(0.1)
        time.sleep(3)  # several health probes, and build attempts, with no database
        assert status() == NOT_SERVING

        proxy.restore()
        deadline = time.monotonic() + 60
        while status() != SERVING:
            assert time.monotonic() < deadline, "the API never served after the outage"
            time.sleep(0.2)
        assert builds > 1, "the outage did not reach the first build"

        stub = pb_grpc.RemindersServiceStub(channel)
        metadata = user_metadata(user)
        made = stub.CreateReminder(
            create_request(f"req-{uuid.uuid4()}", "after a startup outage"),
            metadata=metadata,
            timeout=10,
        )
        got = stub.GetReminder(pb.GetReminderRequest(id=made.id), metadata=metadata, timeout=10)
        assert got.text == "after a startup outage"


class SlowCasReply:
    """A session whose next compare-and-set, once `armed`, lands at once but is answered
    `delay_s` late: a slow coordinator, seen from the API."""

    def __init__(self, session: Session, delay_s: float) -> None:
        self._session = session
        self._delay_s = delay_s
        self.armed = False

    def execute_async(self, statement: Any, params: Any = None, **options: Any) -> Any:
        response = self._session.execute_async(statement, params, **options)
        if self.armed and is_conditional(statement):
            self.armed = False
            return _AnsweredLate(response, self._delay_s)
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class _AnsweredLate:
    def __init__(self, response: Any, delay_s: float) -> None:
        self._response = response
        self._delay_s = delay_s

    def add_callbacks(
        self,
        callback: Callable[..., Any],
        errback: Callable[..., Any],
        callback_args: tuple[Any, ...] = (),
        errback_args: tuple[Any, ...] = (),
    ) -> None:
        # The driver calls back with the result first, then the callback's own arguments.
        def later(value: Any, settle: Callable[..., Any], *args: Any) -> None:
            threading.Timer(self._delay_s, settle, (value, *args)).start()

        self._response.add_callbacks(
            later,
            later,
            callback_args=(callback, *callback_args),
            errback_args=(errback, *errback_args),
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)


def test_an_edit_outrunning_the_write_deadline_is_answered_as_possibly_applied(
    migrated_settings: CassandraSettings,
) -> None:
    """Past the write deadline the edit's LWT may still land (here it does): the answer is
    DEADLINE_EXCEEDED, "read before retrying", never UNAVAILABLE's "retry", which would
    turn the caller's retry of its own applied edit into ABORTED."""
    sessions: list[SlowCasReply] = []

    def build(
        connection: CassandraConnection, auth: Authenticator, api: ApiSettings, clock: FakeClock
    ) -> ApiServicers:
        sessions.append(SlowCasReply(connection.session, delay_s=3))
        slow = dataclasses.replace(connection, session=cast(Session, sessions[-1]))
        deadline = dataclasses.replace(api, write_deadline=timedelta(seconds=1))
        return build_servicers(slow, auth, deadline, clock)

    with running_api(migrated_settings, FakeClock(SEED_NOW), build=build) as api:
        metadata = api.as_user(f"slow-{uuid.uuid4().hex[:10]}")
        made = api.reminders.CreateReminder(
            create_request(f"req-{uuid.uuid4()}", "before"), metadata=metadata, timeout=10
        )
        edit = pb.UpdateReminderRequest(
            reminder=pb.Reminder(id=made.id, version=made.version, text="after"),
            update_mask=field_mask_pb2.FieldMask(paths=["text"]),
        )
        sessions[0].armed = True

        with pytest.raises(grpc.RpcError) as answered:
            api.reminders.UpdateReminder(edit, metadata=metadata, timeout=10)

        assert answered.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "may have been applied" in (answered.value.details() or "")
        got = api.reminders.GetReminder(pb.GetReminderRequest(id=made.id), metadata=metadata)
        assert (got.text, got.version) == ("after", made.version + 1)


class UnsettledCas:
    """A session whose next compare-and-set, once `armed`, lands but is answered with a
    write timeout, and whose SERIAL reads fail while `serial_fails`: storage gone between
    the write and the read that would settle it."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.armed = False
        self.serial_fails = False

    def execute_async(self, statement: Any, params: Any = None, **options: Any) -> Any:
        level = getattr(statement, "consistency_level", None)
        if self.serial_fails and level in SERIAL_LEVELS:
            return _AnsweredWith(None, ReadTimeout("injected: the settling read timed out"))
        response = self._session.execute_async(statement, params, **options)
        if self.armed and is_conditional(statement):
            self.armed = False
            self.serial_fails = True
            return _AnsweredWith(response, WriteTimeout("injected", write_type=WriteType.CAS))
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


SERIAL_LEVELS = (ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL)


class _AnsweredWith:
    """The caller hears `error`: once the statement has answered, or at once when it was
    never sent (`response` None)."""

    def __init__(self, response: Any | None, error: Exception) -> None:
        self._response = response
        self._error = error

    def add_callbacks(
        self,
        callback: Callable[..., Any],
        errback: Callable[..., Any],
        callback_args: tuple[Any, ...] = (),
        errback_args: tuple[Any, ...] = (),
    ) -> None:
        def fail(_: Any = None) -> None:
            errback(self._error, *errback_args)

        if self._response is None:
            fail()
        else:
            self._response.add_callbacks(fail, fail)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)


def test_a_change_whose_outcome_storage_cannot_settle_is_answered_as_possibly_applied(
    migrated_settings: CassandraSettings,
) -> None:
    """The snooze's LWT lands, its reply is lost, and the SERIAL read that would settle it
    fails too: DEADLINE_EXCEEDED, "read before retrying". UNAVAILABLE's "retry" would have
    the caller snooze a second time, 10 minutes later than it asked."""
    sessions: list[UnsettledCas] = []

    def build(
        connection: CassandraConnection, auth: Authenticator, api: ApiSettings, clock: FakeClock
    ) -> ApiServicers:
        sessions.append(UnsettledCas(connection.session))
        unsettled = dataclasses.replace(connection, session=cast(Session, sessions[-1]))
        return build_servicers(unsettled, auth, api, clock)

    with running_api(migrated_settings, FakeClock(SEED_NOW), build=build) as api:
        metadata = api.as_user(f"unsettled-{uuid.uuid4().hex[:10]}")
        made = api.reminders.CreateReminder(
            create_request(f"req-{uuid.uuid4()}", "call mom"), metadata=metadata, timeout=10
        )
        snooze = pb.SnoozeReminderRequest(id=made.id, duration=duration_pb2.Duration(seconds=600))
        sessions[0].armed = True

        with pytest.raises(grpc.RpcError) as answered:
            api.reminders.SnoozeReminder(snooze, metadata=metadata, timeout=10)

        assert answered.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "may have been applied" in (answered.value.details() or "")
        sessions[0].serial_fails = False
        got = api.reminders.GetReminder(pb.GetReminderRequest(id=made.id), metadata=metadata)
        assert got.snooze_until_time.ToDatetime() == SEED_NOW.replace(tzinfo=None) + timedelta(
            minutes=10
        )


def test_a_channel_given_the_service_config_retries_a_read_and_never_a_change(
    migrated_settings: CassandraSettings, proxy: TcpProxy
) -> None:
    """The server's UNAVAILABLE (storage gone) is retried for a Get, four attempts in all,
    and never for a Snooze: a change is retried in code, by its reason, not by gRPC."""
    through_proxy = dataclasses.replace(migrated_settings, port=proxy.port)
    metadata = user_metadata(f"config-{uuid.uuid4().hex[:10]}")
    options = [("grpc.service_config", SERVICE_CONFIG.read_text()), ("grpc.enable_retries", 1)]
    with (
        serve_api(through_proxy) as api,
        grpc.insecure_channel(api.target, options=options) as channel,
    ):
        api.wait_for_health(SERVING)
        stub = pb_grpc.RemindersServiceStub(channel)
        created = stub.CreateReminder(create_request("r", "t"), metadata=metadata, timeout=10)
        get = pb.GetReminderRequest(id=created.id)
        snooze = pb.SnoozeReminderRequest(
            id=created.id, duration=duration_pb2.Duration(seconds=600)
        )
        proxy.cut()
        wait_for_health_of_every_service(api, NOT_SERVING, timeout_s=10)

        assert code_of(lambda: stub.GetReminder(get, metadata=metadata)) == UNAVAILABLE
        snoozing = functools.partial(stub.SnoozeReminder, snooze, metadata=metadata)
        assert code_of(snoozing) == UNAVAILABLE

        def unavailable(samples: Samples, method: str) -> float:
            labels = {("method", f"/{REMINDERS_SERVICE}/{method}"), ("code", "UNAVAILABLE")}
            return samples.get(("reminders_api_requests_total", frozenset(labels)), 0)

        samples = metric_samples_once(
            api.metrics_port, lambda s: unavailable(s, "SnoozeReminder") >= 1
        )
        assert (unavailable(samples, "GetReminder"), unavailable(samples, "SnoozeReminder")) == (
            4,
            1,
        )
        # Throttled (retryThrottling): once its retries fail, a channel no longer multiplies
        # the outage's load by four; each further call is tried once.
        for _ in range(20):
            assert code_of(lambda: stub.GetReminder(get, metadata=metadata)) == UNAVAILABLE
        samples = metric_samples_once(
            api.metrics_port, lambda s: unavailable(s, "GetReminder") >= 4 + 20
        )
        assert unavailable(samples, "GetReminder") <= 4 + 20 + 3
        # How soon to retry a change by hand (a gateway's Retry-After).
        assert retry_delay_of(snoozing) == timedelta(seconds=1)
