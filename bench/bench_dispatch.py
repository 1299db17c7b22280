"""A busy minute: N reminders due in one minute, drained by the dispatcher fleet.

    .venv/bin/python -m bench.bench_dispatch [--reminders 20000] [--dispatchers 1]

Seeds N one-off reminders due at the start of one minute (through the store: bucket entry first,
row by LWT, exactly as the API writes them), runs the notifier and the dispatchers as
processes, and reports: drain time, rings per second, p50/p99 lateness (due -> hand-off,
from the delivery history, accepted rings only), and early, lost and duplicate counts,
judged per seeded reminder against its seeded due (at the hand-off, from the history, and
at the push, from the notifier's recorded pushes). In the same run, the ceiling: a bare
driver loop doing the same two conditional updates per ring (claim, finalize) on other
rows; target rings/s >= 0.8 x
(ceiling LWT/s / 2). The ceiling runs once unreported first (the node's JIT warms up by
~10 s of LWTs), then before and after the drain; the ratio takes the higher of the two.
A second reference, the storage floor: the whole storage work of a ring (row read, claim
LWT, the notifier's key LWT and device lookup, the history write, finalize LWT) with the
same store classes,
from one process, with no scheduling, gRPC or notifier process: the ratio against it is
what the fleet's own machinery costs. Progress is read from the dispatchers' /metrics,
not by scanning a table, so watching the drain does not load the node it measures.
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
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
from cassandra.cluster import Session

from bench.keyspaces import drop_keyspaces, fresh_keyspace
from bench.stats import nearest_rank
from genproto.notification.v1 import notification_pb2 as npb
from genproto.notification.v1 import notification_pb2_grpc as npb_grpc
from notifier.domain.model import Notification, Priority, Settlement
from notifier.rpc.client import list_delivered
from notifier.storage.devices import DeviceStore
from notifier.storage.keys import KeyStore
from notifier.storage.schema import migrate_notifier
from reminders_svc.config import CassandraSettings, Retention
from reminders_svc.domain import dispatch
from reminders_svc.domain.delivery import Answer, Delivery
from reminders_svc.domain.reminder import Reminder, new_reminder
from reminders_svc.schedule import one_off_instant
from reminders_svc.storage import aio
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.loop_reactor import connected_on_loop
from reminders_svc.storage.reminders_store import ReminderStore, StoredReminder
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


async def store_new(store: ReminderStore, reminder: Reminder) -> None:
    """Create the row as the API does; another seeding task of the same user may move the
    user's count between the read and the LWT, so read it again and retry."""
    for _ in range(50):
        if await store.create(reminder, await store.active_count(reminder.user_id), 10**6):
            return
    raise RuntimeError(f"seeding {reminder.user_id}: the count kept moving")


async def seed(
    store: ReminderStore, minute: datetime, count: int, prefix: str
) -> dict[uuid.UUID, datetime]:
    """`count` one-offs in `minute`'s first second: each one's id and due."""
    now = datetime.now(UTC)
    seeded: dict[uuid.UUID, datetime] = {}

    async def create(i: int) -> None:
        # All in the minute's first second: the drain then measures throughput alone.
        due = minute + timedelta(microseconds=(i * 1_000_000) // count)
        user = f"{prefix}-{i % (count // 10 or 1)}"
        reminder = new_reminder(user, f"r{i}", one_off_instant(due, "UTC"), due, now)
        await store_new(store, reminder)
        seeded[reminder.reminder_id] = due

    await _bounded(64, list(range(count)), create)
    return seeded


# The ceiling's statements: a bare row insert, then per ring the claim and a finalize that
# re-arms the row (params: see `ceiling`).
CEILING_CQL = (
    "UPDATE reminders SET status = 'pending', due = ?, version = 1"
    " WHERE user_id = ? AND reminder_id = ? IF status = null",
    "UPDATE reminders SET status = 'sending', claim_token = ?, claim_due = ?,"
    " claim_expires = ? WHERE user_id = ? AND reminder_id = ?"
    " IF status = 'pending' AND due = ? AND version = 1",
    "UPDATE reminders SET status = 'pending', claim_token = null,"
    " claim_due = null, claim_expires = null WHERE user_id = ? AND reminder_id = ?"
    " IF status = 'sending' AND claim_token = ? AND version = 1",
)


async def ceiling(settings: CassandraSettings, seconds: float) -> float:
    """LWT/s of a bare loop doing a claim and a finalize per ring, as the dispatcher does.

    64 users with 10 rows each are rung over and over for `seconds`, one ring in flight
    per user (one user's LWTs never overlap, as in the dispatcher); the finalize re-arms
    the row (status back to pending), as a repeat's finalize does.
    """
    async with connected_on_loop(settings) as connection:  # the driver set up as the fleet's
        session = connection.session
        insert, claim, finalize = await asyncio.to_thread(
            lambda: [session.prepare(cql) for cql in CEILING_CQL]
        )
        due = datetime(2026, 1, 1, tzinfo=UTC)
        run = uuid.uuid4().hex[:6]
        by_user = [[(f"ceiling-{run}-{u}", uuid.uuid4()) for _ in range(10)] for u in range(64)]
        rows = [row for user_rows in by_user for row in user_rows]
        await _bounded(64, rows, lambda r: aio.execute(session, insert, (due, *r)))
        done = 0
        started = time.monotonic()
        deadline = started + seconds

        async def ring_user(user_rows: list[tuple[str, uuid.UUID]]) -> None:
            while time.monotonic() < deadline:
                for row in user_rows:
                    if time.monotonic() >= deadline:
                        return
                    await ring_once(row)

        async def ring_once(row: tuple[str, uuid.UUID]) -> None:
            nonlocal done
            token = uuid.uuid4()
            await aio.execute(session, claim, (token, due, due, *row, due))
            await aio.execute(session, finalize, (*row, token))
            done += 2

        await asyncio.gather(*(ring_user(r) for r in by_user))
        rate: float = done / (time.monotonic() - started)
        return rate


async def storage_floor(settings: CassandraSettings, notifier_keyspace: str, count: int) -> float:
    """Rings/s of the storage work alone: read, claim, key, devices, key settled, history,
    finalize."""
    migrate_notifier(dataclasses.replace(settings, keyspace=notifier_keyspace))
    async with connected_on_loop(settings) as connection:  # the driver set up as the fleet's
        session = connection.session
        store, history, keys, devices = await asyncio.to_thread(
            lambda: (
                ReminderStore(session, Retention()),
                DeliveryHistory(session),
                KeyStore(session, notifier_keyspace, timedelta(days=2), timedelta(minutes=1)),
                DeviceStore(session, notifier_keyspace),
            )
        )
        # An hour back: out of the dispatchers' initial look-back, so they never see these.
        due = (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0)
        prefix = f"floor-{uuid.uuid4().hex[:6]}"
        await seed(store, due, count, prefix)
        user_ids = [f"{prefix}-{user}" for user in range(count // 10 or 1)]
        rows = {u: (await store.list_page(u, None, 100, None))[0] for u in user_ids}
        started = time.monotonic()

        async def ring(user_id: str, reminder_id: uuid.UUID) -> None:
            stored = await store.get(user_id, reminder_id)
            assert stored is not None
            now = datetime.now(UTC)
            claimed = dispatch.claimed(stored.reminder, uuid.uuid4(), now, timedelta(seconds=30))
            assert await store.replace(stored, claimed, now)
            assert claimed.claim is not None
            key = dispatch.idempotency_key(claimed)
            await keys.record(Notification(key, user_id, Priority.URGENT, "Reminder", "x"))
            await devices.list(user_id)  # the notifier's fan-out looks the user's devices up
            await keys.settle(key, user_id, Settlement.PUSHED)
            await history.record(
                Delivery(
                    user_id=user_id,
                    reminder_id=reminder_id,
                    claim_due=claimed.claim.due,
                    claim_token=claimed.claim.token,
                    claimed_at=now,
                    handed_off_at=now,
                    answer=Answer.ACCEPTED,
                    reason=None,
                    late=False,
                ),
                written_at=now,
            )
            finalized = dispatch.finalized(claimed, now)
            assert await store.replace(StoredReminder(claimed, stored.active_count), finalized, now)

        async def ring_user(user_id: str) -> None:
            # One user's LWTs one at a time, as the dispatcher runs them.
            for row in rows[user_id]:
                await ring(user_id, row.reminder_id)

        await _bounded(64, user_ids, ring_user)
        rate: float = count / (time.monotonic() - started)
        return rate


def _rings_so_far(metrics_ports: Sequence[int]) -> Counter[str]:
    """Rings handed off so far by the notifier's answer, from the dispatchers' counters."""
    answered: Counter[str] = Counter()
    for port in metrics_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("reminders_dispatch_rings_total{"):
                    outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                    answered[outcome] += int(float(line.rsplit(" ", 1)[1]))
    return answered


def _reminder_of(push: npb.Delivered) -> uuid.UUID:
    """The reminder a push rang: its key is `<reminder id>/<claim due>`."""
    return uuid.UUID(push.idempotency_key.split("/", 1)[0])


def _handed_off(session: Session, user_prefix: str) -> list[Any]:
    """The delivery history of the drained minute's rings (not the storage floor's)."""
    rows = session.execute(
        "SELECT user_id, reminder_id, claim_due, handed_off_at, answer FROM deliveries",
        timeout=120,
    )
    return [r for r in rows if r.user_id.startswith(user_prefix) and r.handed_off_at]


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [REMINDERS, *args], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reminders", type=int, default=20000)
    parser.add_argument("--dispatchers", type=int, default=1)
    parser.add_argument("--ceiling-seconds", type=float, default=15)
    parser.add_argument("--metrics-port", type=int, default=9560)
    parser.add_argument("--floor-rings", type=int, default=8000)
    args = parser.parse_args()

    settings = fresh_keyspace("benchd")
    suffix = settings.keyspace.removeprefix("benchd_")
    await ceiling(settings, args.ceiling_seconds)  # warm-up, not reported
    ceilings = [await ceiling(settings, args.ceiling_seconds)]
    floor = await storage_floor(settings, f"benchf_{suffix}", args.floor_rings)

    with connect(settings) as connection:
        connection.session.execute(
            "INSERT INTO part_counts (scope, from_minute, parts) VALUES ('dispatch', 0, 16)"
        )
        store = ReminderStore(connection.session, Retention())
        lead = timedelta(seconds=30 + args.reminders / 150)
        minute = (datetime.now(UTC) + lead).replace(second=0, microsecond=0) + timedelta(minutes=1)
        seeding = time.monotonic()
        seeded = await seed(store, minute, args.reminders, f"b{suffix}")
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
            "REMINDERS_DISPATCH_INITIAL_LOOKBACK_S": "60",
        }
        processes = [_spawn(["notifier"], env, logs / "notifier.log")]
        metrics_ports = [args.metrics_port + i for i in range(args.dispatchers)]
        processes += [
            _spawn(
                ["dispatch"],
                {
                    **env,
                    "REMINDERS_DISPATCH_ID": f"d{i}",
                    "REMINDERS_DISPATCH_METRICS_PORT": str(port),
                },
                logs / f"d{i}.log",
            )
            for i, port in enumerate(metrics_ports)
        ]
        try:
            await asyncio.sleep(max(0.0, (minute - datetime.now(UTC)).total_seconds()))
            deadline = minute + timedelta(minutes=20)
            while datetime.now(UTC) < deadline:
                if _rings_so_far(metrics_ports).total() >= args.reminders:
                    break
                await asyncio.sleep(1)
            answered = _rings_so_far(metrics_ports)
            # The counter moves before a ring's history row is written: wait for the rows
            # of the last rings too, or the latest ones would be left out of the figures.
            rows = _handed_off(connection.session, f"b{suffix}-")
            for _ in range(30):
                if len(rows) >= args.reminders:
                    break
                await asyncio.sleep(1)
                rows = _handed_off(connection.session, f"b{suffix}-")
            channel = grpc.insecure_channel("127.0.0.1:50261")
            pushes = list_delivered(npb_grpc.NotificationServiceStub(channel), timeout_s=60)
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                process.wait(60)
        ceilings.append(await ceiling(settings, args.ceiling_seconds))
        lwt_per_s = max(ceilings)

        # Judged by the reminders seeded, not by what the fleet sent: a reminder rung under
        # two keys and another never rung would net to "0 lost, 0 duplicate" by key.
        accepted = [r for r in rows if r.answer == "accepted"]
        lateness = sorted((r.handed_off_at - r.claim_due).total_seconds() for r in accepted)
        drain = max(r.handed_off_at for r in accepted).replace(tzinfo=UTC) - minute
        pushed = [(_reminder_of(p), p.push_time.ToDatetime(tzinfo=UTC)) for p in pushes]
        rung = Counter(reminder_id for reminder_id, _ in pushed)
        lost = len(seeded.keys() - rung.keys())
        rung_again = sum(count - 1 for count in rung.values())
        unknown = len(rung.keys() - seeded.keys())
        # Early against the seeded due, at the hand-off and at the push.
        handed = [(r.reminder_id, r.handed_off_at.replace(tzinfo=UTC)) for r in rows]
        early = sum(
            1
            for reminder_id, at in handed + pushed
            if reminder_id in seeded and at < seeded[reminder_id]
        )
        rings_per_s = len(lateness) / drain.total_seconds()

        def pct(q: float) -> float:
            return nearest_rank(lateness, q)

        print(
            f"ceiling: bare claim+finalize loop {ceilings[0]:.0f} LWT/s before the drain, "
            f"{ceilings[1]:.0f} after; the higher -> {lwt_per_s / 2:.0f} rings/s"
        )
        print(
            f"dispatch: {len(lateness)} handed off, drain {drain.total_seconds():.1f}s after "
            f"the minute began, {rings_per_s:.0f} rings/s over the drain"
        )
        print(f"lateness p50 {pct(0.5):.2f}s p99 {pct(0.99):.2f}s max {lateness[-1]:.2f}s")
        # The notifier pushes a key once whatever happens: a ring handed off twice shows
        # as the dispatchers' "duplicate" answers, not in its pushes.
        print(
            f"early {early}, lost {lost}, duplicate {rung_again} pushed ({unknown} of no"
            f" seeded reminder), {answered['duplicate']} handed off again;"
            f" {len(rows) - len(accepted)} answered other than accepted"
        )
        print(
            f"ratio rings/s / (ceiling LWT/s / 2) = {rings_per_s / (lwt_per_s / 2):.2f} "
            "(target >= 0.8)"
        )
        print(
            f"storage floor: {floor:.0f} rings/s (read, claim, key, devices, history, finalize "
            f"from one process); ratio rings/s / floor = {rings_per_s / floor:.2f}"
        )
        drop_keyspaces(
            connection.session, settings.keyspace, f"benchn_{suffix}", f"benchf_{suffix}"
        )


if __name__ == "__main__":
    asyncio.run(main())
