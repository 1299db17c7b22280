"""`reminders admin replay` and `inspect` on the real Cassandra: the row decides, rows are
never written, fresh entries go into the current minute, and no text is ever printed."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.buckets import BucketReader
from reminders_svc.domain import dispatch
from reminders_svc.domain.reminder import Status, delete, pause
from reminders_svc.storage.parts import DEFAULT_PARTS, floor_minute, part_of
from reminders_svc.storage.reminders_store import ReminderStore, StoredReminder
from reminders_svc.storage.session import CassandraConnection
from tests.admin.conftest import (
    SECRET_TEXT,
    AdminRunner,
    at_instant,
    change,
    minutes_ago,
    put,
    run,
    store_of,
    whole_minute,
)


def make_minute_of_every_kind(
    db: CassandraConnection, minute: datetime
) -> dict[str, StoredReminder]:
    """One row per state the row can be in, each with an entry in `minute` (past)."""
    store = store_of(db)
    due = minute + timedelta(seconds=30)
    created = minute - timedelta(minutes=1)
    now = datetime.now(UTC)

    async def build() -> dict[str, StoredReminder]:
        rows = {
            name: await put(store, at_instant(f"user-{name}", due, created))
            for name in ("lost", "expired_claim", "live_claim", "paused", "deleted", "done")
        }
        rows["rescheduled"] = await put(
            store, at_instant("user-rescheduled", now + timedelta(hours=2), created)
        )
        # Its first entry was in `minute`; a later edit moved it (and wrote its own entry).
        await _entry_in(store, rows["rescheduled"], minute)
        lost_claim = dispatch.claimed(
            rows["expired_claim"].reminder,
            uuid.uuid4(),
            now - timedelta(minutes=5),
            timedelta(seconds=30),
        )
        rows["expired_claim"] = await change(store, rows["expired_claim"], lost_claim)
        live = dispatch.claimed(
            rows["live_claim"].reminder, uuid.uuid4(), now, timedelta(minutes=5)
        )
        rows["live_claim"] = await change(store, rows["live_claim"], live)
        rows["paused"] = await change(store, rows["paused"], pause(rows["paused"].reminder, now))
        rows["deleted"] = await change(
            store, rows["deleted"], delete(rows["deleted"].reminder, now)
        )
        done = dataclasses.replace(
            rows["done"].reminder, status=Status.DONE, due=None, occurrence=None
        )
        rows["done"] = await change(store, rows["done"], done)
        return rows

    return run(build())


async def _entry_in(store: ReminderStore, stored: StoredReminder, minute: datetime) -> None:
    moved = dataclasses.replace(stored.reminder, due=minute + timedelta(seconds=10))
    await store.write_bucket_entry(moved, minute)


def entries(db: CassandraConnection, minute: datetime) -> list[tuple[str, uuid.UUID]]:
    reader = BucketReader(db.session)

    async def read_all() -> list[tuple[str, uuid.UUID]]:
        found = []
        for part in range(DEFAULT_PARTS):
            found += [(e.user_id, e.reminder_id) for e in await reader.read(minute, part)]
        return found

    return run(read_all())


def test_replay_re_arms_only_rows_the_row_says_are_still_due(
    own_keyspace: CassandraConnection, admin: AdminRunner
) -> None:
    minute = minutes_ago(90)
    rows = make_minute_of_every_kind(own_keyspace, minute)
    store = store_of(own_keyspace)
    # An edit within the minute gave "lost" a second entry there: re-armed, counted, once.
    run(_entry_in(store, rows["lost"], minute))

    replayed = admin(
        "replay", "--from", whole_minute(minute), "--to", whole_minute(minute), "--json"
    )
    report = replayed.json()
    assert report["dry_run"] is False
    assert report["minutes"] == 1
    assert report["entries"] == 8
    assert report["outcomes"] == {
        "re_armed": 2,  # pending with its due passed; sending under an expired claim
        "already_re_armed": 1,  # the second entry of "lost"
        "in_flight": 1,
        "paused": 1,
        "deleted": 1,
        "done": 1,
        "stale": 1,  # its due moved to a later minute
    }
    now_minute = floor_minute(datetime.now(UTC))
    fresh = {
        key
        for m in (now_minute - timedelta(minutes=1), now_minute)
        for key in entries(own_keyspace, m)
    }
    assert fresh == {
        ("user-lost", rows["lost"].reminder.reminder_id),
        ("user-expired_claim", rows["expired_claim"].reminder.reminder_id),
    }
    # The rows themselves were not touched: same state, same op id.
    for stored in rows.values():
        again = run(store.get(stored.reminder.user_id, stored.reminder.reminder_id))
        assert again == stored

    # A dry run over the same minute and the one after counts alike and writes nothing.
    following = whole_minute(minute + timedelta(minutes=1))
    counted = admin(
        "replay", "--from", whole_minute(minute), "--to", following, "--dry-run", "--json"
    )
    assert counted.json()["outcomes"]["re_armed"] == 2
    assert counted.json()["minutes"] == 2
    after_dry_run = {
        key
        for m in (now_minute - timedelta(minutes=1), now_minute, now_minute + timedelta(minutes=1))
        for key in entries(own_keyspace, m)
    }
    assert after_dry_run == fresh

    table = admin(
        "replay", "--from", whole_minute(minute), "--to", whole_minute(minute), "--dry-run"
    )
    assert table.code == 0
    assert "1 minutes, 8 entries (dry run)" in table.out
    assert "re_armed" in table.out
    assert SECRET_TEXT not in table.out + replayed.out


def test_replay_refuses_a_range_that_ends_before_it_starts(admin: AdminRunner) -> None:
    refused = admin("replay", "--from", "2026-10-26T13:05Z", "--to", "2026-10-26T13:00Z")
    assert refused.code == 2
    assert "--to 2026-10-26T13:00:00.000Z is before --from 2026-10-26T13:05:00.000Z" in refused.err


def test_replay_refuses_minutes_whose_entries_are_gone_or_not_yet_due(admin: AdminRunner) -> None:
    """A mistyped year read P parts of every minute of ten years (5 M minutes, days of
    reads), where entries live 7 days past their minute."""
    now = datetime.now(UTC)
    too_old = admin(
        "replay", "--from", whole_minute(now - timedelta(days=8)), "--to", whole_minute(now)
    )
    assert too_old.code == 2
    assert "hold no entries (they live 7 days past their minute" in too_old.err
    ahead = admin(
        "replay", "--from", whole_minute(now), "--to", whole_minute(now + timedelta(minutes=5))
    )
    assert ahead.code == 2
    assert "are not due yet" in ahead.err
    # A week back, to the current minute, is allowed (dry run: nothing written).
    week = admin(
        "replay",
        "--from",
        whole_minute(now - timedelta(days=7) + timedelta(minutes=2)),
        "--to",
        whole_minute(now - timedelta(days=7) + timedelta(minutes=2)),
        "--dry-run",
        "--json",
    )
    assert week.code == 0, week.err
    assert week.json()["minutes"] == 1


def test_replay_and_inspect_want_whole_utc_minutes(admin: AdminRunner) -> None:
    with pytest.raises(SystemExit):
        admin("inspect", "--minute", "2026-10-26T13:00:30Z")
    with pytest.raises(SystemExit):
        admin("replay", "--from", "2026-10-26T13:00", "--to", "2026-10-26T13:01Z")


def test_replay_is_rate_limited(own_keyspace: CassandraConnection, admin: AdminRunner) -> None:
    minute = minutes_ago(30)
    make_minute_of_every_kind(own_keyspace, minute)
    started = datetime.now(UTC)
    # 64 part reads + 7 row reads + 2 writes at 40 per second: about 1.8 s at least.
    replayed = admin(
        "replay", "--from", whole_minute(minute), "--to", whole_minute(minute), "--ops-per-s", "40"
    )
    assert replayed.code == 0, replayed.err
    assert datetime.now(UTC) - started >= timedelta(seconds=1.7)


def test_inspect_shows_each_entry_and_its_row_but_no_text(
    own_keyspace: CassandraConnection, admin: AdminRunner
) -> None:
    minute = minutes_ago(20)
    rows = make_minute_of_every_kind(own_keyspace, minute)
    document = admin("inspect", "--minute", whole_minute(minute), "--json").json()
    assert (document["minute"], document["parts"]) == (
        minute.isoformat(timespec="milliseconds")[:-6] + "Z",
        64,
    )
    by_user = {entry["user_id"]: entry for entry in document["entries"]}
    assert set(by_user) == {f"user-{name}" for name in rows}
    for name, stored in rows.items():
        shown, row = by_user[f"user-{name}"], stored.reminder
        assert shown["part"] == part_of(row.user_id, DEFAULT_PARTS)
        assert shown["reminder_id"] == str(row.reminder_id)
        assert (shown["status"], shown["version"]) == (row.status.value, row.version)
        assert shown["written_at"] is not None
    claimed = by_user["user-live_claim"]
    claim = rows["live_claim"].reminder.claim
    assert claim is not None
    assert claimed["claim_token"] == str(claim.token)
    assert datetime.fromisoformat(claimed["claim_due"]) == claim.due
    assert by_user["user-paused"]["due"] is None
    assert by_user["user-lost"]["entry_due"] == by_user["user-lost"]["due"]

    one_part = part_of("user-lost", DEFAULT_PARTS)
    only = admin(
        "inspect", "--minute", whole_minute(minute), "--part", str(one_part), "--json"
    ).json()
    assert {entry["part"] for entry in only["entries"]} == {one_part}
    # A part the minute does not have: said, not shown as an empty part.
    beyond = admin("inspect", "--minute", whole_minute(minute), "--part", "64")
    assert beyond.code == 2
    assert beyond.err.endswith("has P = 64 (parts 0 to 63)\n"), beyond.err
    limited = admin("inspect", "--minute", whole_minute(minute), "--limit", "3", "--json").json()
    assert len(limited["entries"]) == 3

    table = admin("inspect", "--minute", whole_minute(minute))
    assert table.code == 0
    assert "P = 64, 7 entries shown" in table.out
    assert str(rows["lost"].reminder.reminder_id) in table.out
    assert SECRET_TEXT not in table.out
    assert SECRET_TEXT not in str(document)
