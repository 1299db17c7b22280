"""CreateReminder through gRPC vs. a bare cassandra-driver loop doing the same writes.

    .venv/bin/python -m bench.bench_api [--seconds 20] [--concurrency 32] [--big-user 5000]

Both sides run in this same run, on this machine, against the same local node, with the
same concurrency; the report gives each rate, p50/p99 latencies and the ratio
(target: API rate >= 0.7 x bare rate). Both are warmed first, then run in alternating
rounds (bare, API, then API, bare, ...) so that the node warming up or the shared machine
slowing down does not favour either side; the ratio pools the rounds. Percentiles are by
nearest rank (bench/stats.py).
Then one user is filled with --big-user reminders and List (page of 50 and of 500) and
Create p99 are measured for that user.

The API server runs as its own process (`reminders serve-api`), as in production.
A third line, the gRPC floor, runs PreviewSchedule (auth, parsing, no storage) through the
same server and client: what a call costs before it touches Cassandra.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc

from bench.cpu import CpuMeter, cassandra_pid
from bench.keyspaces import drop_keyspaces, fresh_keyspace
from bench.stats import nearest_rank
from genproto.reminders.v1 import reminders_pb2 as pb
from genproto.reminders.v1 import reminders_pb2_grpc as pb_grpc
from reminders_svc.api.auth import AuthSettings, mint_token
from reminders_svc.config import CassandraSettings
from reminders_svc.storage import aio
from reminders_svc.storage.loop_reactor import connected_on_loop
from reminders_svc.storage.parts import bucket_minute, part_of
from reminders_svc.storage.session import connect
from reminders_svc.storage.statics import COUNT_ROW, WRITE_COUNT_ROW

DEV = {"REMINDERS_ENV": "dev"}
# Creates spread over this many users, the same on both sides: a user's partition grows
# as it gets reminders, and its LWTs read what is there.
USERS = 512


@dataclasses.dataclass
class Run:
    name: str
    latencies: list[float]
    seconds: float
    # CPU seconds by process role ("server", "client", "Cassandra"), when measured.
    cpu_s: dict[str, float] = dataclasses.field(default_factory=dict)

    def __add__(self, other: Run) -> Run:
        roles = dict.fromkeys([*self.cpu_s, *other.cpu_s])  # ordered, unlike a set
        return Run(
            self.name,
            self.latencies + other.latencies,
            self.seconds + other.seconds,
            {role: self.cpu_s.get(role, 0) + other.cpu_s.get(role, 0) for role in roles},
        )

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds

    def pct(self, q: float) -> float:
        return nearest_rank(sorted(self.latencies), q) * 1000

    def line(self) -> str:
        ops = len(self.latencies)
        cpu = ", ".join(f"{role} {1000 * s / ops:.2f}" for role, s in self.cpu_s.items())
        cores = sum(self.cpu_s.values()) / self.seconds
        cpu = f"  ms CPU/op: {cpu} ({cores:.2f} cores busy)" if cpu else ""
        return (
            f"{self.name:<28} {len(self.latencies):>7} ops {self.rate:>8.1f}/s "
            f"p50 {self.pct(0.5):7.2f} ms  p99 {self.pct(0.99):7.2f} ms{cpu}"
        )


async def _drive(
    name: str,
    op: Callable[[int], Awaitable[None]],
    seconds: float,
    concurrency: int,
    limit: int | None = None,
    until: asyncio.Event | None = None,
) -> Run:
    """`op` from `concurrency` tasks for `seconds`, or fewer: `limit` ops, or `until` set."""
    latencies: list[float] = []
    counter = iter(range(10**9))
    deadline = time.monotonic() + seconds

    def going() -> bool:
        return (
            time.monotonic() < deadline
            and (limit is None or len(latencies) < limit)
            and (until is None or not until.is_set())
        )

    async def worker() -> None:
        while going():
            i = next(counter)
            started = time.perf_counter()
            await op(i)
            latencies.append(time.perf_counter() - started)

    began = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Run(name, latencies, time.monotonic() - began)


# The row and its count, in one conditional batch, as `ReminderStore.create` writes them.
_ROW_AND_COUNT = (
    "BEGIN BATCH UPDATE reminders SET active_count = ? WHERE user_id = ? IF active_count = ?;"
    " UPDATE reminders SET body = ?, schedule_kind = 'repeat', zone = ?, local_start = ?,"
    " rrule = ?, status = 'pending', occurrence = ?, due = ?, version = 1, op_id = ?,"
    " created_at = ?, updated_at = ? WHERE user_id = ? AND reminder_id = ? IF status = null;"
)
BARE_CREATE_CQL = (
    "INSERT INTO create_requests (user_id, request_id, payload_hash, reminder_id, created_at)"
    " VALUES (?, ?, ?, ?, ?) IF NOT EXISTS USING TTL 604800",
    "INSERT INTO due_buckets (minute, part, written_at, reminder_id, user_id, due)"
    " VALUES (?, ?, now(), ?, ?, ?) USING TTL ?",
    # Through the partition's count row (statics.py); a user's first create finds none.
    "SELECT reminder_id, active_count FROM reminders WHERE user_id = ? AND reminder_id = ?",
    f"{_ROW_AND_COUNT} APPLY BATCH",
    # The first create of a user writes the partition's count row in its batch too.
    f"{_ROW_AND_COUNT} {WRITE_COUNT_ROW}; APPLY BATCH",
)


def _schedule() -> pb.Schedule:
    return pb.Schedule(time_zone="Europe/Paris", repeat=pb.Repeat(expression="every day 08:00"))


async def bare_creates(settings: CassandraSettings, seconds: float, concurrency: int) -> Run:
    """The same writes a create makes, straight from the driver: record, entry, row+count.

    With the driver set up as the API server sets it up (I/O on the event loop).
    """
    async with connected_on_loop(settings) as connection:
        session = connection.session
        # Prepared off the loop: `prepare` blocks, and the driver's I/O runs on the loop.
        record, entry, count, row, first_row = await asyncio.to_thread(
            lambda: [session.prepare(cql) for cql in BARE_CREATE_CQL]
        )
        run_id = uuid.uuid4().hex[:6]

        async def create(i: int) -> None:
            user, rid, now = f"bare-{run_id}-{i % USERS}", uuid.uuid4(), datetime.now(UTC)
            due = now + timedelta(hours=20)
            request = (user, uuid.uuid4().hex, hashlib.sha256(b"x").digest(), rid, now)
            await aio.execute(session, record, request)
            await aio.execute(
                session,
                entry,
                (bucket_minute(due, now), part_of(user, 64), rid, user, due, 7 * 86400 + 72000),
            )
            applied = False
            while not applied:  # as the API does when another create moved the count
                current = (await aio.execute(session, count, (user, COUNT_ROW))).one()
                active = current.active_count if current else None
                columns = ("text", "Europe/Paris", "2026-11-30T08:00:00", "FREQ=DAILY;BYHOUR=8")
                params: tuple[object, ...] = (
                    (active or 0) + 1,
                    user,
                    active,
                    *columns,
                    due,
                    due,
                    uuid.uuid4(),
                    now,
                    now,
                    user,
                    rid,
                )
                if active is None:
                    batch, params = first_row, (*params, user, COUNT_ROW)
                else:
                    batch = row
                applied = (await aio.execute(session, batch, params)).one().applied

        meter = CpuMeter({"client": os.getpid(), "Cassandra": cassandra_pid()})
        meter.start()
        run = await _drive("bare driver creates", create, seconds, concurrency)
        run.cpu_s = meter.stop()
        return run


def _metadata(user: str) -> tuple[tuple[str, str], ...]:
    token = mint_token(AuthSettings.from_env(DEV).user, user, 3600)
    return (("authorization", f"Bearer {token}"),)


async def api_creates(target: str, seconds: float, concurrency: int) -> Run:
    run_id = uuid.uuid4().hex[:6]
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RemindersServiceStub(channel)
        tokens: dict[str, tuple[tuple[str, str], ...]] = {}

        async def create(i: int) -> None:
            user = f"api-{run_id}-{i % USERS}"
            md = tokens.get(user) or tokens.setdefault(user, _metadata(user))
            await stub.CreateReminder(
                pb.CreateReminderRequest(
                    reminder=pb.Reminder(text="text", schedule=_schedule()),
                    request_id=uuid.uuid4().hex,
                ),
                metadata=md,
            )

        return await _drive("API CreateReminder (gRPC)", create, seconds, concurrency)


async def api_previews(target: str, seconds: float, concurrency: int) -> Run:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RemindersServiceStub(channel)
        md = _metadata(f"preview-{uuid.uuid4().hex[:6]}")

        async def preview(i: int) -> None:
            await stub.PreviewSchedule(
                pb.PreviewScheduleRequest(schedule=_schedule(), count=1), metadata=md
            )

        return await _drive("gRPC floor: PreviewSchedule", preview, seconds, concurrency)


async def big_user(target: str, reminders: int, concurrency: int) -> list[Run]:
    user = f"big-{uuid.uuid4().hex[:6]}"
    md = _metadata(user)
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RemindersServiceStub(channel)

        async def create(i: int) -> None:
            # A new request id each time: the p99 run measures creates, not replays.
            await stub.CreateReminder(
                pb.CreateReminderRequest(
                    reminder=pb.Reminder(text=f"r{i}", schedule=_schedule()),
                    request_id=uuid.uuid4().hex,
                ),
                metadata=md,
            )

        fill = await _drive(
            f"fill one user to {reminders}", create, 3600, concurrency, limit=reminders
        )
        runs = [fill]
        for size in (50, 500):

            async def page(i: int, size: int = size) -> None:
                await stub.ListReminders(pb.ListRemindersRequest(page_size=size), metadata=md)

            runs.append(await _drive(f"List page {size} (big user)", page, 10, 4))
        runs.append(await _drive("Create p99 (big user)", create, 10, 4))
        return runs


async def _measured(server_pid: int, calls: Awaitable[Run]) -> Run:
    """Run `calls` through the server, charging the server's, this client's and the node's CPU."""
    meter = CpuMeter({"server": server_pid, "client": os.getpid(), "Cassandra": cassandra_pid()})
    meter.start()
    run = await calls
    run.cpu_s = meter.stop()
    return run


def _start_server(settings: CassandraSettings, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **DEV,
        "REMINDERS_CASSANDRA_KEYSPACE": settings.keyspace,
        "REMINDERS_API_PORT": str(port),
        "REMINDERS_API_METRICS_PORT": "0",
        "REMINDERS_MAX_ACTIVE_PER_USER": "100000",
    }
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("reminders")), "serve-api"], env=env
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=60)
    channel.close()
    time.sleep(3)  # the storage connection and health probe come up after the port
    return server


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20, help="per side, over all rounds")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="alternating bare/API rounds")
    parser.add_argument("--big-user", type=int, default=5000)
    parser.add_argument("--port", type=int, default=50151)
    args = parser.parse_args()

    settings = fresh_keyspace("bench")
    server = _start_server(settings, args.port)
    target = f"127.0.0.1:{args.port}"
    round_s = args.seconds / args.rounds
    try:
        await bare_creates(settings, 3, args.concurrency)  # warm-ups, not reported
        await api_creates(target, 3, args.concurrency)
        bare_rounds: list[Run] = []
        api_rounds: list[Run] = []
        for round_number in range(args.rounds):
            sides = [
                (bare_rounds, bare_creates(settings, round_s, args.concurrency)),
                (api_rounds, _measured(server.pid, api_creates(target, round_s, args.concurrency))),
            ]
            # Bare then API, then API then bare: a machine speeding up or slowing down over
            # the run lands on both sides alike, not always on the second.
            for rounds, side in sides if round_number % 2 == 0 else sides[::-1]:
                rounds.append(await side)
        floor = await _measured(
            server.pid, api_previews(target, args.seconds / 2, args.concurrency)
        )
        for i, (bare, api) in enumerate(zip(bare_rounds, api_rounds, strict=True), 1):
            print(
                f"round {i}: bare {bare.rate:.1f}/s, API {api.rate:.1f}/s, "
                f"ratio {api.rate / bare.rate:.2f}"
            )
        bare, api = sum(bare_rounds[1:], bare_rounds[0]), sum(api_rounds[1:], api_rounds[0])
        print(bare.line())
        print(api.line())
        print(floor.line())
        print(f"ratio API/bare create rate: {api.rate / bare.rate:.2f} (target >= 0.70)")
        if args.big_user:
            for run in await big_user(target, args.big_user, args.concurrency):
                print(run.line())
    finally:
        server.terminate()
        server.wait(30)
        with connect(settings, keyspace="") as connection:
            drop_keyspaces(connection.session, settings.keyspace)


if __name__ == "__main__":
    asyncio.run(main())
