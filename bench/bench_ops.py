"""What each statement of a ring costs the node and the client, one kind at a time.

    .venv/bin/python -m bench.bench_ops [--seconds 8] [--concurrency 64]

A bare driver loop per statement kind (the statements a ring and a create use), each
after the node is warmed by ~10 s of LWTs: rate, and CPU per statement in Cassandra's
process and in this one (from /proc). It explains the busy-minute ratios: a ring needs a
row read, the claim and finalize LWTs, the notifier's key LWT and device lookup, and a
history write, while the ceiling of bench_dispatch counts only the claim and finalize.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from bench.bench_api import _drive
from bench.bench_dispatch import CEILING_CQL
from bench.cpu import CpuMeter, cassandra_pid
from bench.keyspaces import drop_keyspaces, fresh_keyspace
from notifier.storage.schema import migrate_notifier
from reminders_svc.storage import aio
from reminders_svc.storage.session import connect


async def _measure(
    name: str, op: Callable[[int], Awaitable[None]], seconds: float, concurrency: int
) -> None:
    meter = CpuMeter({"node": cassandra_pid(), "client": os.getpid()})
    meter.start()
    run = await _drive(name, op, seconds, concurrency)
    cpu = meter.stop()
    done = len(run.latencies)
    node_ms, own_ms = 1000 * cpu["node"] / done, 1000 * cpu["client"] / done
    print(
        f"{name:<34} {run.rate:7.0f}/s  Cassandra {node_ms:5.3f} ms  client {own_ms:5.3f} ms"
        " CPU per statement",
        flush=True,
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()

    settings = fresh_keyspace("bencho")
    keys_keyspace = f"{settings.keyspace}n"
    migrate_notifier(dataclasses.replace(settings, keyspace=keys_keyspace))
    with connect(settings) as connection:
        session = connection.session
        insert, claim, finalize = (session.prepare(cql) for cql in CEILING_CQL)
        read = session.prepare("SELECT * FROM reminders WHERE user_id = ? AND reminder_id = ?")
        key = session.prepare(
            f"INSERT INTO {keys_keyspace}.notification_keys"
            " (idempotency_key, user_id, accept_id, accepted_at)"
            " VALUES (?, ?, ?, toTimestamp(now())) IF NOT EXISTS USING TTL 172800"
        )
        devices = session.prepare(
            f"SELECT device_token, platform, registered_at FROM {keys_keyspace}.devices"
            " WHERE user_id = ?"
        )
        history = session.prepare(
            "INSERT INTO deliveries (user_id, reminder_id, claim_due, claim_token, claimed_at,"
            " handed_off_at, answer, lateness_ms, late)"
            " VALUES (?, ?, ?, ?, ?, ?, 'accepted', 5, false) USING TTL 86400"
        )
        due = datetime(2026, 1, 1, tzinfo=UTC)
        rows = [(f"ops-{i % 3000}", uuid.uuid4()) for i in range(200_000)]
        fresh = iter(rows)

        async def create(_: int) -> None:
            await aio.execute(session, insert, (due, *next(fresh)))

        async def read_row(i: int) -> None:
            await aio.execute(session, read, rows[i % 20_000])

        async def claim_and_finalize(i: int) -> None:
            token, row = uuid.uuid4(), rows[i % 20_000]
            await aio.execute(session, claim, (token, due, due, *row, due))
            await aio.execute(session, finalize, (*row, token))

        async def record_key(_: int) -> None:
            await aio.execute(session, key, (uuid.uuid4().hex, "ops", uuid.uuid4()))

        async def look_up_devices(i: int) -> None:
            await aio.execute(session, devices, (rows[i % 20_000][0],))

        async def record_history(i: int) -> None:
            row = rows[i % 20_000]
            await aio.execute(session, history, (*row, due, uuid.uuid4(), due, due))

        await _measure("warm-up: row LWTs (not a figure)", create, 10, args.concurrency)
        for name, op in (
            ("row create LWT (IF status = null)", create),
            ("row read", read_row),
            ("claim + finalize LWTs (per pair)", claim_and_finalize),
            ("notifier key LWT (IF NOT EXISTS)", record_key),
            ("notifier device lookup", look_up_devices),
            ("history write", record_history),
        ):
            await _measure(name, op, args.seconds, args.concurrency)
        drop_keyspaces(session, settings.keyspace, keys_keyspace)


if __name__ == "__main__":
    asyncio.run(main())
