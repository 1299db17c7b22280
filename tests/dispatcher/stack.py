"""The whole service as real processes for end-to-end tests: API, notifier, dispatchers.

Each stack has keyspaces of its own, few parts (P = 4) and short timings (grace 3 s,
claim lease 5 s, part lease 6 s), so rings a few seconds ahead finish within seconds.
Its processes' logs go to a /tmp/reminders-e2e-* folder, removed when the stack closes
after a passing test and kept (its path printed) after a failing one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genproto.notification.v1 import notification_pb2 as npb
from genproto.notification.v1 import notification_pb2_grpc as npb_grpc
from genproto.reminders.v1 import reminders_pb2 as pb
from genproto.reminders.v1 import reminders_pb2_grpc as pb_grpc
from notifier.rpc.client import list_delivered
from reminders_svc.api.auth import AuthSettings, mint_token
from reminders_svc.config import CassandraSettings
from reminders_svc.storage.parts import floor_minute, part_of
from reminders_svc.storage.session import CassandraConnection, connect
from tests import keyspaces
from tests.platform.helpers import free_port

REMINDERS = str(Path(sys.executable).with_name("reminders"))
PARTS = 4
FAST = {
    # The API's write deadline (2 s) stays under G minus the skew (DESIGN.md invariant 3).
    "REMINDERS_DISPATCH_GRACE_S": "4",
    "REMINDERS_DISPATCH_PREFETCH_S": "2",
    "REMINDERS_DISPATCH_POLL_S": "0.5",
    "REMINDERS_DISPATCH_SKEW_S": "1",
    "REMINDERS_DISPATCH_LEASE_S": "6",
    "REMINDERS_DISPATCH_LEASE_RENEW_S": "2",
    "REMINDERS_DISPATCH_CLAIM_LEASE_S": "5",
    "REMINDERS_DISPATCH_INITIAL_LOOKBACK_S": "120",
    "REMINDERS_DISPATCH_SHUTDOWN_GRACE_S": "5",
    "REMINDERS_API_WRITE_DEADLINE_S": "2",
    # Snoozes ring within seconds (the contract's shortest is a minute; its refusal is
    # tested against the default in tests/api).
    "REMINDERS_API_MIN_SNOOZE_S": "5",
}


def scrape(metrics_port: int) -> dict[str, float]:
    """The samples a process exports on /metrics, by name as exported: `name` when
    unlabelled, `name{label="value"}` when labelled."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def stamp(instant: datetime) -> Timestamp:
    value = Timestamp()
    value.FromDatetime(instant)
    return value


def pushed_early(pushes: list[npb.Delivered]) -> list[str]:
    """The keys of `pushes` pushed before their due: handed off when their entry was read
    ahead of it, not at it (invariant 8)."""
    return [p.idempotency_key for p in pushes if p.push_time.ToDatetime() < p.due_time.ToDatetime()]


def health_status(target: str) -> int:
    """The server's overall health (SERVING, NOT_SERVING, ...), asked once."""
    with grpc.insecure_channel(target) as channel:
        request = health_pb2.HealthCheckRequest()
        status: int = health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status
        return status


def wait_health(target: str, status: int, timeout_s: float = 60) -> None:
    """Until the server's overall health is `status` (one not answering yet is waited for)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == status:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    raise AssertionError(f"{target} did not become {name} within {timeout_s} s")


def wait_serving(target: str, timeout_s: float = 60) -> None:
    wait_health(target, health_pb2.HealthCheckResponse.SERVING, timeout_s)


class Stack:
    def __init__(self, cassandra: CassandraSettings, **extra_env: str) -> None:
        suffix = uuid.uuid4().hex[:8]
        # Keyspaces of its own, made ahead by the process's pools (tests/keyspaces.py).
        self.settings = keyspaces.take(cassandra, keyspaces.REMINDERS)
        self._notifier_keyspace = keyspaces.take(cassandra, keyspaces.NOTIFIER)
        self.api_port, self.notifier_port = free_port(), free_port()
        # Known, so tests can read the notifier's answers by outcome (notifier_answers).
        self.notifier_metrics_port = free_port()
        self.env = {
            **os.environ,
            **FAST,
            "REMINDERS_ENV": "dev",
            "REMINDERS_CASSANDRA_KEYSPACE": self.settings.keyspace,
            "REMINDERS_NOTIFIER_KEYSPACE": self._notifier_keyspace.keyspace,
            "REMINDERS_API_PORT": str(self.api_port),
            "REMINDERS_API_METRICS_PORT": "0",
            "REMINDERS_NOTIFIER_PORT": str(self.notifier_port),
            "REMINDERS_NOTIFIER_METRICS_PORT": str(self.notifier_metrics_port),
            "REMINDERS_NOTIFIER_TARGET": f"127.0.0.1:{self.notifier_port}",
            "REMINDERS_DISPATCH_PORT": "0",
            "REMINDERS_DISPATCH_METRICS_PORT": "0",
            **extra_env,
        }
        self.processes: list[subprocess.Popen[bytes]] = []
        self._log_paths: dict[int, Path] = {}
        self.logs = Path(f"/tmp/reminders-e2e-{suffix}")
        self.logs.mkdir()
        print(f"process logs of this stack: {self.logs}")  # in a failing test's output
        try:
            self.db = self._migrated()
        except BaseException:
            # No `closing` runs for a stack that was never made: leave nothing behind.
            self._discard()
            raise
        self.api_channel = grpc.insecure_channel(f"127.0.0.1:{self.api_port}")
        self.api = pb_grpc.RemindersServiceStub(self.api_channel)
        self.notifier_channel = grpc.insecure_channel(f"127.0.0.1:{self.notifier_port}")
        self.notifier = npb_grpc.NotificationServiceStub(self.notifier_channel)
        self._auth = AuthSettings.from_env({"REMINDERS_ENV": "dev"})

    def _migrated(self) -> CassandraConnection:
        """A connection to this stack's keyspace, with its parts."""
        db = connect(self.settings)
        try:
            db.session.execute(
                "INSERT INTO part_counts (scope, from_minute, parts) VALUES ('dispatch', 0, %s)",
                (PARTS,),
            )
        except BaseException:
            db.close()
            raise
        return db

    def _drop_keyspaces(self) -> None:
        keyspaces.drop(self.settings, keyspaces.REMINDERS)
        keyspaces.drop(self._notifier_keyspace, keyspaces.NOTIFIER)

    def _discard(self) -> None:
        """After a failed start: give its keyspaces back and remove its logs."""
        shutil.rmtree(self.logs, ignore_errors=True)
        self._drop_keyspaces()

    def spawn(self, name: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
        path = self.logs / f"{name}-{len(self.processes)}.log"
        with path.open("wb") as log:
            process = subprocess.Popen(
                [REMINDERS, *args], env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT
            )
        self.processes.append(process)
        self._log_paths[process.pid] = path
        return process

    def wait_logged(
        self, process: subprocess.Popen[bytes], text: str, timeout_s: float = 30
    ) -> None:
        """Until `process` has logged `text`: proof that it ran where a test then checks
        that nothing came of it."""
        deadline = time.monotonic() + timeout_s
        while text not in self._log_paths[process.pid].read_text(errors="replace"):
            assert time.monotonic() < deadline, f"{text!r} never logged"
            time.sleep(0.2)

    def start_api(self) -> None:
        self.spawn("api", "serve-api")
        wait_serving(f"127.0.0.1:{self.api_port}")

    def start_notifier(self, **env: str) -> subprocess.Popen[bytes]:
        process = self.spawn("notifier", "notifier", **env)
        wait_serving(f"127.0.0.1:{self.notifier_port}")
        return process

    def restart_notifier(
        self, running: subprocess.Popen[bytes], **env: str
    ) -> subprocess.Popen[bytes]:
        """`running` stopped and a notifier started in its place, with `env`."""
        self.stop(running)
        return self.start_notifier(**env)

    def start_dispatcher(self, name: str = "d", **env: str) -> subprocess.Popen[bytes]:
        return self.spawn(f"dispatch-{name}", "dispatch", REMINDERS_DISPATCH_ID=name, **env)

    def stop(self, process: subprocess.Popen[bytes], timeout_s: float = 30) -> int:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        return _reaped(process, timeout_s)

    def close(self, keep_logs: bool) -> None:
        """Stop every process, drop the keyspaces, and remove the process logs unless
        `keep_logs` (`closing` decides)."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a test may have left one frozen
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            _reaped(process)  # not signalled again: a second SIGTERM cuts its stop short
        self.api_channel.close()
        self.notifier_channel.close()
        self.db.close()
        self._drop_keyspaces()
        if keep_logs:
            print(f"process logs kept in {self.logs}")
        else:
            shutil.rmtree(self.logs, ignore_errors=True)

    # -- the API and the notifier as a client sees them ----------------------------------

    def md(self, user: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {mint_token(self._auth.user, user, 3600)}"),)

    def create_at(self, user: str, due: datetime, text: str = "ring") -> pb.Reminder:
        return self.api.CreateReminder(
            pb.CreateReminderRequest(
                reminder=pb.Reminder(
                    text=text,
                    schedule=pb.Schedule(time_zone="UTC", once=pb.OneOff(instant=stamp(due))),
                ),
                request_id=uuid.uuid4().hex,
            ),
            metadata=self.md(user),
        )

    def create_repeat(
        self, user: str, start_local: str, rrule: str = "FREQ=HOURLY", zone: str = "UTC"
    ) -> pb.Reminder:
        """A repeating reminder from `start_local` (ISO 8601 local time in `zone`)."""
        return self.api.CreateReminder(
            pb.CreateReminderRequest(
                reminder=pb.Reminder(
                    text="repeat",
                    schedule=pb.Schedule(
                        time_zone=zone,
                        repeat=pb.Repeat(rrule=rrule, start_local_time=start_local),
                    ),
                ),
                request_id=uuid.uuid4().hex,
            ),
            metadata=self.md(user),
        )

    def notifier_answers(self) -> dict[str, float]:
        """The running notifier's answers since it started, by outcome (accepted, duplicate,
        rejected, retryable): a second hand-off of a key shows as a duplicate here, never as
        a second push."""
        samples = scrape(self.notifier_metrics_port)
        prefix = 'notifier_items_total{outcome="'
        return {
            name.removeprefix(prefix).removesuffix('"}'): value
            for name, value in samples.items()
            if name.startswith(prefix)
        }

    def deliveries(self, user: str, reminder_id: str) -> list[pb.Delivery]:
        """The reminder's delivery history as its owner lists it (ListDeliveries)."""
        request = pb.ListDeliveriesRequest(reminder_id=reminder_id)
        return list(self.api.ListDeliveries(request, metadata=self.md(user)).deliveries)

    def pushes(self, user: str = "", key_prefix: str = "") -> list[npb.Delivered]:
        pushed = list_delivered(self.notifier, user)
        return [d for d in pushed if d.idempotency_key.startswith(key_prefix)]

    def wait_for_pushes(
        self, count: int, user: str = "", key_prefix: str = "", timeout_s: float = 45
    ) -> list[npb.Delivered]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.pushes(user, key_prefix)
            if len(found) >= count:
                return found
            time.sleep(0.25)
        return self.pushes(user, key_prefix)

    def wait_status(
        self, user: str, reminder_id: str, status: str, timeout_s: float = 45
    ) -> object:
        deadline = time.monotonic() + timeout_s
        row = self.row(user, reminder_id)
        while row.status != status and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.25)
            row = self.row(user, reminder_id)
        return row

    def row(self, user: str, reminder_id: str) -> object:
        return self.db.session.execute(
            "SELECT status, due, occurrence, snooze_until, version, claim_token FROM reminders"
            " WHERE user_id = %s AND reminder_id = %s",
            (user, uuid.UUID(reminder_id)),
        ).one()


def _failures(request: pytest.FixtureRequest | None) -> int:
    return request.session.testsfailed if request is not None else 0


@contextlib.contextmanager
def closing(stack: Stack, request: pytest.FixtureRequest | None = None) -> Iterator[Stack]:
    """`stack`, closed afterwards; its process logs kept when what ran inside failed: an
    exception out of the block, or (given a fixture's `request`) the test it served."""
    failures_before = _failures(request)
    failed = True
    try:
        yield stack
        failed = _failures(request) > failures_before
    finally:
        stack.close(keep_logs=failed)


@contextlib.contextmanager
def running_stack(
    cassandra: CassandraSettings, *dispatchers: str, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """API, notifier and the named dispatchers, all up and holding every part between them;
    everything stopped afterwards (see `closing` for the logs)."""
    with closing(Stack(cassandra), request) as stack:
        stack.start_api()
        stack.start_notifier()
        for name in dispatchers:
            stack.start_dispatcher(name)
        if dispatchers:
            # Else a first test's ring due in seconds races the dispatchers' start.
            wait_owning(stack, set(dispatchers), timeout_s=60)
        yield stack


def room_wait_s(room_s: float) -> float:
    """How long to wait for at least `room_s` seconds left in the current minute: 0, or
    until the next one's second 1. A test that must finish within one minute (a lease it
    does not renew, a stop told apart from waiting for the minute's end) waits first."""
    now = datetime.now(UTC)
    left_s = (floor_minute(now) + timedelta(minutes=1) - now).total_seconds()
    return 0.0 if left_s >= room_s else left_s + 1


def soon(seconds: float) -> datetime:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)


def owners(stack: Stack) -> dict[int, tuple[str | None, int]]:
    rows = stack.db.session.execute("SELECT part, owner, epoch FROM dispatch_parts")
    return {row.part: (row.owner, row.epoch) for row in rows}


def wait_owning(
    stack: Stack, names: set[str], timeout_s: float = 30, *, evenly: bool = False
) -> None:
    """Until every part is owned, by `names` and only them; `evenly`: each holding its
    share (a fleet still balancing may leave one dispatcher a single part for a while)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = [owner for owner, _ in owners(stack).values()]
        even = all(held.count(name) == PARTS // len(names) for name in names)
        if len(held) == PARTS and set(held) == names and (even or not evenly):
            return
        time.sleep(0.3)
    raise AssertionError(f"parts not owned by {names}: {owners(stack)}")


def part_checkpoints(stack: Stack) -> dict[int, datetime | None]:
    rows = stack.db.session.execute("SELECT part, checkpoint FROM dispatch_parts")
    return {r.part: r.checkpoint.replace(tzinfo=UTC) if r.checkpoint else None for r in rows}


def wait_checkpointed(stack: Stack, minute: datetime, timeout_s: float = 30) -> dict[int, datetime]:
    """Every part's checkpoint once all are at `minute` or later."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = part_checkpoints(stack)
        if len(found) == PARTS and all(c is not None and c >= minute for c in found.values()):
            return {part: c for part, c in found.items() if c is not None}
        time.sleep(0.5)
    raise AssertionError(
        f"not every part checkpointed at {minute} or later: {part_checkpoints(stack)}"
    )


def caught_up(stack: Stack) -> None:
    """Every part's minutes before the current one worked: its live minutes are being
    read (a sleep after `wait_owning` did not tell that on a loaded machine)."""
    wait_checkpointed(stack, floor_minute(datetime.now(UTC)) - timedelta(minutes=1), 60)


def new_user() -> str:
    return f"u-{uuid.uuid4().hex[:10]}"


def user_in(part: int) -> str:
    while part_of(user := new_user(), PARTS) != part:
        pass
    return user


def move_due(stack: Stack, user: str, reminder_id: str, due: datetime) -> None:
    """Bucket first, row second, as every writer does: the row now rang-due in the past."""
    rid = uuid.UUID(reminder_id)
    stack.db.session.execute(
        "INSERT INTO due_buckets (minute, part, written_at, reminder_id, user_id, due)"
        " VALUES (%s, %s, now(), %s, %s, %s)",
        (floor_minute(due), part_of(user, PARTS), rid, user, due),
    )
    applied = (
        stack.db.session.execute(
            "UPDATE reminders SET due = %s, occurrence = %s WHERE user_id = %s AND reminder_id = %s"
            " IF status = 'pending'",
            (due, due, user, rid),
        )
        .one()
        .applied
    )
    assert applied


def _reaped(process: subprocess.Popen[bytes], timeout_s: float = 30) -> int:
    """`process`'s exit code once it ends, killed if it takes over `timeout_s`."""
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return process.returncode
