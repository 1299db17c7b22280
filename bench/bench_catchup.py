"""GetReminder latency while the dispatchers catch up missed minutes, against idle.

    .venv/bin/python -m bench.bench_catchup [--reminders 6000] [--seconds 15]
        [--outage-minutes 30] [--parts 16]

Seeds reminders whose dues fell in the last `--outage-minutes`, with their bucket entries
in those minutes and every part checkpointed before them (an outage), then measures
GetReminder through the API with the dispatchers stopped (idle), while one dispatcher
catches up, and idle again once it has handed every ring off and stopped. Target: p99
during catch-up at most 2x idle, idle being both idle windows pooled: a shared machine
drifts over the minutes of a run, and one baseline taken before would carry that drift
into the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from cassandra.cluster import Session

from bench.bench_api import DEV, Run, _drive, _metadata, _start_server
from bench.bench_dispatch import _bounded, _spawn, store_new
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
    store: ReminderStore, count: int, prefix: str, outage: timedelta
) -> list[tuple[str, str]]:
    now = datetime.now(UTC)
    spread_s = outage.total_seconds() - 20  # the last due 20 s ago: every one is missed
    made: list[tuple[str, str]] = []

    async def create(i: int) -> None:
        due = (now - outage + timedelta(seconds=(i * spread_s) / count)).replace(microsecond=0)
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
    target: str, reminders: list[tuple[str, str]], seconds: float, name: str
) -> Run:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RemindersServiceStub(channel)
        tokens = {user: _metadata(user) for user, _ in reminders[:200]}
        picks = [(u, r) for u, r in reminders if u in tokens]

        async def get(i: int) -> None:
            user, reminder_id = picks[i % len(picks)]
            await stub.GetReminder(pb.GetReminderRequest(id=reminder_id), metadata=tokens[user])

        return await _drive(name, get, seconds, 4)


def handed_off(session: Session) -> int:
    query = (
        "SELECT count(*) AS n FROM deliveries WHERE handed_off_at > '2000-01-01' ALLOW FILTERING"
    )
    return int(session.execute(query, timeout=120).one().n)


async def drain(session: Session, rings: int, timeout_s: float) -> float:
    """Seconds until all `rings` are handed off; fails past `timeout_s`."""
    began = time.monotonic()
    while handed_off(session) < rings:
        if time.monotonic() - began > timeout_s:
            raise SystemExit(f"the catch-up did not hand off {rings} rings in {timeout_s:.0f} s")
        await asyncio.sleep(5)
    return time.monotonic() - began


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
        "--drain-timeout", type=float, default=600, help="seconds to wait for the catch-up"
    )
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
        made = await seed_missed(store, args.reminders, f"c{suffix}", outage)
        checkpoint = floor_minute(datetime.now(UTC) - outage - timedelta(minutes=1))
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
        processes = [_spawn(["notifier"], env, logs / "notifier.log")]
        try:
            await asyncio.sleep(5)
            target = "127.0.0.1:50351"
            await get_latency(target, made, 3, "warm-up")
            idle = await get_latency(target, made, args.seconds, "GetReminder idle")
            processes.append(
                _spawn(["dispatch"], {**env, "REMINDERS_DISPATCH_ID": "c"}, logs / "dispatch.log")
            )
            await asyncio.sleep(3)  # the dispatcher connects and takes the parts
            busy = await get_latency(target, made, args.seconds, "GetReminder in catch-up")
            done = handed_off(session)
            drained_in = await drain(session, args.reminders, args.drain_timeout)
            stop(processes)
            after = await get_latency(target, made, args.seconds, "GetReminder idle, after")
        finally:
            stop([server, *processes])
        idle_pooled = idle + after
        print(idle.line())
        print(busy.line())
        print(after.line())
        print(f"rings handed off by the end of the busy window: {done} of {args.reminders}")
        print(f"all handed off {drained_in:.0f} s after the busy window ended")
        for name, baseline in (("before", idle), ("after", after), ("both pooled", idle_pooled)):
            ratio = busy.pct(0.99) / baseline.pct(0.99)
            print(f"ratio p99 catch-up / idle {name}: {ratio:.2f}")
        print(
            f"ratio p99 catch-up / idle: {busy.pct(0.99) / idle_pooled.pct(0.99):.2f} (target <= 2)"
        )
        drop_keyspaces(session, settings.keyspace, f"benchcn_{suffix}")


if __name__ == "__main__":
    asyncio.run(main())
