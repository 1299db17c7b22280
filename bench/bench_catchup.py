"""GetReminder latency while the dispatchers catch up missed minutes, against idle.

    .venv/bin/python -m bench.bench_catchup [--reminders 6000] [--seconds 15]
        [--outage-minutes 30] [--parts 16]

Seeds reminders whose dues fell in the last `--outage-minutes`, with their bucket entries
in those minutes and every part checkpointed before them (an outage), then measures
GetReminder through the API first with the dispatchers stopped (idle), then while one
dispatcher catches up. Target: p99 during catch-up at most 2x idle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc

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


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reminders", type=int, default=6000)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--outage-minutes", type=int, default=30)
    parser.add_argument("--parts", type=int, default=16)
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
            done = (
                session.execute(
                    "SELECT count(*) AS n FROM deliveries WHERE handed_off_at > '2000-01-01'"
                    " ALLOW FILTERING",
                    timeout=120,
                )
                .one()
                .n
            )
        finally:
            for process in [server, *processes]:
                process.send_signal(signal.SIGTERM)
            for process in [server, *processes]:
                process.wait(60)
        print(idle.line())
        print(busy.line())
        print(f"rings handed off by the end of the busy window: {done} of {args.reminders}")
        print(f"ratio p99 catch-up / idle: {busy.pct(0.99) / idle.pct(0.99):.2f} (target <= 2)")
        drop_keyspaces(session, settings.keyspace, f"benchcn_{suffix}")


if __name__ == "__main__":
    asyncio.run(main())
