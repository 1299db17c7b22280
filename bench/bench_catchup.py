"""GetReminder latency while the dispatchers catch up missed minutes, against idle.

    .venv/bin/python -m bench.bench_catchup [--reminders 6000] [--seconds 15]
        [--outage-minutes 30] [--parts 16] [--live 20]

Seeds reminders whose dues fell in the last `--outage-minutes`, with their bucket entries
in those minutes and every part checkpointed before them (an outage), then measures
GetReminder through the API in four windows:

- idle, before: the API and the notifier up, no dispatcher yet;
- catch-up: from the dispatcher's start until it has handed off every ring the outage
  left (paced, as configured), the whole catch-up; meanwhile `--live` reminders are
  created through the API, due `--seconds` / 2 in: their hand-off lateness shows whether
  rings due now wait behind the backlog;
- at rest: the same dispatcher and notifier, still running, once every ring is handed
  off: the stack as it idles in production, polling its parts' live minutes;
- idle, after: the dispatcher and notifier stopped.

Target: p99 during catch-up at most 2x idle. The ratio is printed against the stack at
rest (what the catch-up itself costs the API) and against the two windows without a
dispatcher, pooled (what a dispatcher costs at all, catching up or not): a shared machine
drifts over the minutes of a run, and one baseline taken before would carry that drift
into the ratio. Each window also prints the CPU each process spent in it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from cassandra.cluster import Session
from google.protobuf.timestamp_pb2 import Timestamp

from bench.bench_api import DEV, Run, _drive, _metadata, _start_server
from bench.bench_dispatch import _bounded, _rings_so_far, _spawn, store_new
from bench.cpu import CpuMeter, cassandra_pid
from bench.keyspaces import drop_keyspaces, fresh_keyspace
from genproto.reminders.v1 import reminders_pb2 as pb
from genproto.reminders.v1 import reminders_pb2_grpc as pb_grpc
from reminders_svc.config import Retention
from reminders_svc.domain.reminder import new_reminder
from reminders_svc.schedule import one_off_instant
from reminders_svc.storage.parts import floor_minute
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import connect


async def seed_missed(
    store: ReminderStore, count: int, prefix: str, first_due: datetime, outage: timedelta
) -> list[tuple[str, str]]:
    """`count` rings due from `first_due` over the outage, the last 20 s before its end."""
    spread_s = outage.total_seconds() - 20
    made: list[tuple[str, str]] = []

    async def create(i: int) -> None:
        due = (first_due + timedelta(seconds=(i * spread_s) / count)).replace(microsecond=0)
        user = f"{prefix}-{i % (count // 10 or 1)}"
        # Written a minute before its due, as the API would have: the entry is in its minute.
        reminder = new_reminder(
            user, f"r{i}", one_off_instant(due, "UTC"), due, due - timedelta(minutes=1)
        )
        await store_new(store, reminder)
        made.append((user, str(reminder.reminder_id)))

    await _bounded(64, list(range(count)), create)
    return made


async def get_latency(
    target: str,
    reminders: list[tuple[str, str]],
    seconds: float,
    name: str,
    pids: Mapping[str, int] | None = None,
    until: asyncio.Event | None = None,
) -> Run:
    """GetReminder at concurrency 4 for `seconds` (or until `until` is set), with the CPU of
    the processes in `pids`."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RemindersServiceStub(channel)
        tokens = {user: _metadata(user) for user, _ in reminders[:200]}
        picks = [(u, r) for u, r in reminders if u in tokens]

        async def get(i: int) -> None:
            user, reminder_id = picks[i % len(picks)]
            await stub.GetReminder(pb.GetReminderRequest(id=reminder_id), metadata=tokens[user])

        meter = CpuMeter({**(pids or {}), "client": os.getpid(), "Cassandra": cassandra_pid()})
        meter.start()
        run = await _drive(name, get, seconds, 4, until=until)
        run.cpu_s = meter.stop()
        return run


async def create_live(target: str, users: list[str], lead_s: float) -> list[tuple[str, str]]:
    """One reminder per user due `lead_s` from now, created through the API: rings due
    while the backlog drains, which must not wait for it."""
    due = Timestamp()
    due.FromDatetime(datetime.now(UTC) + timedelta(seconds=lead_s))
    schedule = pb.Schedule(time_zone="UTC", once=pb.OneOff(instant=due))
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RemindersServiceStub(channel)
        made = []
        for user in users:
            created = await stub.CreateReminder(
                pb.CreateReminderRequest(
                    reminder=pb.Reminder(text="live", schedule=schedule),
                    request_id=uuid.uuid4().hex,
                ),
                metadata=_metadata(user),
            )
            made.append((user, created.id))
        return made


def lateness_s(session: Session, rings: list[tuple[str, str]]) -> list[float]:
    """Hand-off lateness of each ring handed off (from the delivery history)."""
    found = []
    for user, reminder_id in rings:
        row = session.execute(
            "SELECT lateness_ms FROM deliveries WHERE user_id = %s AND reminder_id = %s",
            (user, uuid.UUID(reminder_id)),
        ).one()
        if row is not None and row.lateness_ms is not None:
            found.append(row.lateness_ms / 1000)
    return sorted(found)


async def drain(metrics_port: int, rings: int, timeout_s: float, drained: asyncio.Event) -> None:
    """Set `drained` once the dispatcher has handed off `rings`; fails past `timeout_s`.
    Read from its /metrics: a scan of the history would load the node being measured."""
    began = time.monotonic()
    while _rings_so_far([metrics_port]).total() < rings:
        if time.monotonic() - began > timeout_s:
            drained.set()
            raise SystemExit(f"the catch-up did not hand off {rings} rings in {timeout_s:.0f} s")
        await asyncio.sleep(1)
    drained.set()


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        process.wait(60)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reminders", type=int, default=6000)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--outage-minutes", type=int, default=30)
    parser.add_argument("--parts", type=int, default=16)
    parser.add_argument(
        "--live", type=int, default=20, help="reminders due mid-catch-up, created then"
    )
    parser.add_argument(
        "--drain-timeout", type=float, default=600, help="seconds to wait for the catch-up"
    )
    parser.add_argument("--metrics-port", type=int, default=9570, help="the dispatcher's")
    args = parser.parse_args()
    outage = timedelta(minutes=args.outage_minutes)
    settings = fresh_keyspace("benchc")
    suffix = settings.keyspace.removeprefix("benchc_")
    with connect(settings) as connection:
        session = connection.session
        session.execute(
            "INSERT INTO part_counts (scope, from_minute, parts) VALUES ('dispatch', 0, %s)",
            (args.parts,),
        )
        store = ReminderStore(session, Retention())
        first_due = datetime.now(UTC) - outage
        made = await seed_missed(store, args.reminders, f"c{suffix}", first_due, outage)
        # From the first due, not from the clock after seeding: seeding takes seconds, and a
        # checkpoint taken a minute later would pass the first minute's rings by.
        checkpoint = floor_minute(first_due) - timedelta(minutes=1)
        for part in range(args.parts):
            session.execute(
                "INSERT INTO dispatch_parts (part, epoch, checkpoint) VALUES (%s, 1, %s)",
                (part, checkpoint),
            )
        server = _start_server(settings, 50351)
        logs = Path(f"/tmp/bench-catchup-{suffix}")
        logs.mkdir()  # noqa: ASYNC240  (once, before anything runs)
        env = {
            **os.environ,
            **DEV,
            "REMINDERS_CASSANDRA_KEYSPACE": settings.keyspace,
            "REMINDERS_NOTIFIER_KEYSPACE": f"benchcn_{suffix}",
            "REMINDERS_NOTIFIER_PORT": "50361",
            "REMINDERS_NOTIFIER_METRICS_PORT": "0",
            "REMINDERS_NOTIFIER_TARGET": "127.0.0.1:50361",
            "REMINDERS_DISPATCH_PORT": "0",
            "REMINDERS_DISPATCH_METRICS_PORT": "0",
        }
        notifier = _spawn(["notifier"], env, logs / "notifier.log")
        processes = [notifier]
        try:
            await asyncio.sleep(5)
            target = "127.0.0.1:50351"
            pids = {"API": server.pid, "notifier": notifier.pid}
            await get_latency(target, made, 3, "warm-up")
            idle = await get_latency(target, made, args.seconds, "GetReminder idle", pids)
            dispatcher = _spawn(
                ["dispatch"],
                {
                    **env,
                    "REMINDERS_DISPATCH_ID": "c",
                    "REMINDERS_DISPATCH_METRICS_PORT": str(args.metrics_port),
                },
                logs / "dispatch.log",
            )
            processes.append(dispatcher)
            pids["dispatcher"] = dispatcher.pid
            await asyncio.sleep(3)  # the dispatcher connects and takes the parts
            live_users = [f"live{suffix}-{i}" for i in range(args.live)]
            drained = asyncio.Event()
            rings = args.reminders + args.live
            live_made, busy, _ = await asyncio.gather(
                create_live(target, live_users, args.seconds / 2),
                get_latency(
                    target, made, args.drain_timeout, "GetReminder in catch-up", pids, drained
                ),
                drain(args.metrics_port, rings, args.drain_timeout, drained),
            )
            await asyncio.sleep(5)  # the last finalizes and checkpoints
            at_rest = await get_latency(target, made, args.seconds, "GetReminder at rest", pids)
            stop(processes)
            del pids["dispatcher"], pids["notifier"]
            after = await get_latency(target, made, args.seconds, "GetReminder idle, after", pids)
        finally:
            stop([server, *processes])
        no_dispatcher = idle + after
        for run in (idle, busy, at_rest, after):
            print(run.line())
        print(f"the catch-up: {rings} rings handed off in {busy.seconds:.0f} s")
        live_late = lateness_s(session, live_made)
        if live_late:
            print(
                f"{len(live_late)} rings due during the catch-up, hand-off lateness:"
                f" p50 {live_late[len(live_late) // 2]:.2f} s, max {live_late[-1]:.2f} s"
            )
        baselines = (
            ("idle before", idle),
            ("idle after", after),
            ("no dispatcher, both pooled", no_dispatcher),
            ("the stack at rest", at_rest),
        )
        for name, baseline in baselines:
            ratio = busy.pct(0.99) / baseline.pct(0.99)
            print(f"ratio p99 catch-up / {name}: {ratio:.2f} (target <= 2)")
        drop_keyspaces(session, settings.keyspace, f"benchcn_{suffix}")


if __name__ == "__main__":
    asyncio.run(main())
