"""A busy minute: N reminders due in one minute, drained by the dispatcher fleet.

    .venv/bin/python -m bench.bench_dispatch [--reminders 20000] [--dispatchers 1]

Seeds N one-off reminders due at the start of one minute (through the store: bucket entry first,
row by LWT, exactly as the API writes them), runs the notifier and the dispatchers as
processes, and reports: drain time, rings per second, p50/p99 lateness (due -> hand-off,
from the delivery history), and early, lost and duplicate counts (from the notifier's
recorded pushes). In the same run, the ceiling: a bare driver loop doing the same two
conditional updates per ring (claim, finalize) on other rows; target rings/s >= 0.8 x
(ceiling LWT/s / 2).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import grpc

from genproto.notification.v1 import notification_pb2 as npb
from genproto.notification.v1 import notification_pb2_grpc as npb_grpc
from reminders_svc.config import CassandraSettings, Retention
from reminders_svc.domain.reminder import new_reminder
from reminders_svc.schedule import one_off_instant
from reminders_svc.storage import aio
from reminders_svc.storage.migrations import default_cql_dir, load_migrations, migrate
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import connect

REMINDERS = str(Path(sys.executable).with_name("reminders"))
Job = TypeVar("Job")


async def _bounded(
    concurrency: int, jobs: Sequence[Job], run: Callable[[Job], Awaitable[object]]
) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Job) -> None:
        async with gate:
            await run(job)

    await asyncio.gather(*(one(job) for job in jobs))


async def seed(store: ReminderStore, minute: datetime, count: int, prefix: str) -> None:
    now = datetime.now(UTC)

    async def create(i: int) -> None:
        # All in the minute's first second: the drain then measures throughput alone.
        due = minute + timedelta(microseconds=(i * 1_000_000) // count)
        user = f"{prefix}-{i % (count // 10 or 1)}"
        reminder = new_reminder(user, f"r{i}", one_off_instant(due, "UTC"), due, now)
        assert await store.create(reminder, await store.active_count(user), 10**6)

    await _bounded(64, list(range(count)), create)


async def ceiling(settings: CassandraSettings, count: int, seconds: float) -> float:
    """LWT/s of a bare loop doing a claim and a finalize per row, as the dispatcher does."""
    with connect(settings) as connection:
        session = connection.session
        insert = session.prepare(
            "UPDATE reminders SET status = 'pending', due = ?, version = 1"
            " WHERE user_id = ? AND reminder_id = ? IF status = null"
        )
        claim = session.prepare(
            "UPDATE reminders SET status = 'sending', claim_token = ?, claim_due = ?,"
            " claim_expires = ? WHERE user_id = ? AND reminder_id = ?"
            " IF status = 'pending' AND due = ? AND version = 1"
        )
        finalize = session.prepare(
            "UPDATE reminders SET status = 'done', due = null, claim_token = null,"
            " claim_due = null, claim_expires = null WHERE user_id = ? AND reminder_id = ?"
            " IF status = 'sending' AND claim_token = ? AND version = 1"
        )
        due = datetime(2026, 1, 1, tzinfo=UTC)
        rows = [(f"ceiling-{i % (count // 10 or 1)}", uuid.uuid4()) for i in range(count)]
        await _bounded(64, rows, lambda r: aio.execute(session, insert, (due, *r)))
        done = 0
        deadline = time.monotonic() + seconds
        started = time.monotonic()

        async def ring(row: tuple[str, uuid.UUID]) -> None:
            nonlocal done
            if time.monotonic() > deadline:
                return
            token = uuid.uuid4()
            await aio.execute(session, claim, (token, due, due, *row, due))
            await aio.execute(session, finalize, (*row, token))
            done += 2

        await _bounded(64, rows, ring)
        rate: float = done / (time.monotonic() - started)
        return rate


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [REMINDERS, *args], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reminders", type=int, default=20000)
    parser.add_argument("--dispatchers", type=int, default=1)
    parser.add_argument("--ceiling-seconds", type=float, default=30)
    args = parser.parse_args()

    suffix = uuid.uuid4().hex[:8]
    settings = dataclasses.replace(CassandraSettings.from_env(), keyspace=f"benchd_{suffix}")
    with connect(settings, keyspace="") as connection:
        migrate(connection.session, settings, load_migrations(default_cql_dir()))
    lwt_per_s = await ceiling(settings, 4000, args.ceiling_seconds)

    with connect(settings) as connection:
        connection.session.execute(
            "INSERT INTO part_counts (scope, from_minute, parts) VALUES ('dispatch', 0, 16)"
        )
        store = ReminderStore(connection.session, Retention())
        lead = timedelta(seconds=30 + args.reminders / 150)
        minute = (datetime.now(UTC) + lead).replace(second=0, microsecond=0) + timedelta(minutes=1)
        seeding = time.monotonic()
        await seed(store, minute, args.reminders, f"b{suffix}")
        print(
            f"seeded {args.reminders} in {time.monotonic() - seeding:.0f}s; due in the "
            f"minute {minute.isoformat()}"
        )

        logs = Path(f"/tmp/bench-dispatch-{suffix}")
        logs.mkdir()  # noqa: ASYNC240  (once, before anything runs)
        env = {
            **os.environ,
            "REMINDERS_ENV": "dev",
            "REMINDERS_CASSANDRA_KEYSPACE": settings.keyspace,
            "REMINDERS_NOTIFIER_KEYSPACE": f"benchn_{suffix}",
            "REMINDERS_NOTIFIER_PORT": "50261",
            "REMINDERS_NOTIFIER_METRICS_PORT": "0",
            "REMINDERS_NOTIFIER_TARGET": "127.0.0.1:50261",
            "REMINDERS_DISPATCH_PORT": "0",
            "REMINDERS_DISPATCH_METRICS_PORT": "0",
            "REMINDERS_DISPATCH_INITIAL_LOOKBACK_S": "60",
        }
        processes = [_spawn(["notifier"], env, logs / "notifier.log")]
        processes += [
            _spawn(["dispatch"], {**env, "REMINDERS_DISPATCH_ID": f"d{i}"}, logs / f"d{i}.log")
            for i in range(args.dispatchers)
        ]
        try:
            await asyncio.sleep(max(0.0, (minute - datetime.now(UTC)).total_seconds()))
            deadline = minute + timedelta(minutes=20)
            handed = 0
            while datetime.now(UTC) < deadline:
                row = connection.session.execute(
                    "SELECT count(*) AS n FROM deliveries WHERE handed_off_at > '2000-01-01'"
                    " ALLOW FILTERING",
                    timeout=120,
                ).one()
                handed = row.n
                if handed >= args.reminders:
                    break
                await asyncio.sleep(5)  # a count scans the table: not too often
            rows = list(
                connection.session.execute(
                    "SELECT claim_due, handed_off_at FROM deliveries", timeout=120
                )
            )
            channel = grpc.insecure_channel(
                "127.0.0.1:50261", options=[("grpc.max_receive_message_length", 1 << 28)]
            )
            pushes = (
                npb_grpc.NotificationServiceStub(channel)
                .ListDelivered(npb.ListDeliveredRequest())
                .delivered
            )
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                process.wait(60)

        lateness = sorted(
            (r.handed_off_at - r.claim_due).total_seconds() for r in rows if r.handed_off_at
        )
        drain = max(r.handed_off_at for r in rows if r.handed_off_at).replace(tzinfo=UTC) - (minute)
        keys = Counter(p.idempotency_key for p in pushes)
        early = sum(
            1
            for p in pushes
            if p.push_time.ToDatetime(tzinfo=UTC) < p.due_time.ToDatetime(tzinfo=UTC)
        )
        rings_per_s = len(lateness) / drain.total_seconds()

        def pct(q: float) -> float:
            value: float = lateness[min(len(lateness) - 1, int(q * len(lateness)))]
            return value

        print(
            f"ceiling: bare claim+finalize loop {lwt_per_s:.0f} LWT/s "
            f"-> {lwt_per_s / 2:.0f} rings/s"
        )
        print(
            f"dispatch: {len(lateness)} handed off, drain {drain.total_seconds():.1f}s after "
            f"the minute began, {rings_per_s:.0f} rings/s over the drain"
        )
        print(f"lateness p50 {pct(0.5):.2f}s p99 {pct(0.99):.2f}s max {lateness[-1]:.2f}s")
        print(
            f"early {early}, lost {args.reminders - len(keys)}, "
            f"duplicate {sum(c - 1 for c in keys.values())}"
        )
        print(
            f"ratio rings/s / (ceiling LWT/s / 2) = {rings_per_s / (lwt_per_s / 2):.2f} "
            "(target >= 0.8)"
        )
        connection.session.execute(f"DROP KEYSPACE IF EXISTS {settings.keyspace}", timeout=120)
        connection.session.execute(f"DROP KEYSPACE IF EXISTS benchn_{suffix}", timeout=120)


if __name__ == "__main__":
    asyncio.run(main())
