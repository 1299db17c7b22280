"""`reminders admin parts` and `parts grow` on the real Cassandra."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatcher.leases import PartLeases
from reminders_svc.admin import parts as parts_admin
from reminders_svc.admin.context import Admin
from reminders_svc.admin.parts import ceil_minute, checkpoint_lag_s
from reminders_svc.storage.parts import PartCount, PartCounts
from reminders_svc.storage.session import CassandraConnection
from tests.admin.conftest import AdminRunner, minutes_ago, run


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text)


def store_parts(db: CassandraConnection, parts: int) -> None:
    db.session.execute(
        "INSERT INTO part_counts (scope, from_minute, parts) VALUES ('dispatch', 0, %s)", (parts,)
    )


def test_parts_shows_owner_epoch_lease_checkpoint_and_lag(
    own_keyspace: CassandraConnection, admin: AdminRunner
) -> None:
    store_parts(own_keyspace, 4)
    leases = PartLeases(own_keyspace.session, "dispatcher-a", timedelta(seconds=15))
    checkpoint = minutes_ago(10)

    async def hold_two_parts() -> None:
        first = await leases.try_take(0)
        assert first is not None
        assert await leases.checkpoint(first, checkpoint)
        assert await leases.try_take(1) is not None

    run(hold_two_parts())
    document = admin("parts", "--json").json()
    now = parse(document["now"])
    assert document["part_counts"] == [{"from_minute": "1970-01-01T00:00:00.000Z", "parts": 4}]
    parts = {item["part"]: item for item in document["parts"]}
    assert sorted(parts) == [0, 1, 2, 3]
    held = parts[0]
    assert (held["owner"], held["epoch"], held["in_force"]) == ("dispatcher-a", 1, True)
    assert now < parse(held["lease_until"]) <= now + timedelta(seconds=16)
    assert parse(held["checkpoint"]) == checkpoint
    # Behind a healthy part by: now - (checkpoint + 1 min) - 1 min - grace (20 s).
    expected_lag = (now - checkpoint - timedelta(minutes=2, seconds=20)).total_seconds()
    assert held["checkpoint_lag_s"] == pytest.approx(expected_lag, abs=0.2)
    assert (parts[1]["owner"], parts[1]["checkpoint"], parts[1]["checkpoint_lag_s"]) == (
        "dispatcher-a",
        None,
        None,
    )
    assert (parts[2]["owner"], parts[2]["epoch"]) == (None, 0)

    table = admin("parts")
    assert table.code == 0
    lines = table.out.splitlines()
    assert lines[0] == "P = 4 from 1970-01-01T00:00:00.000Z"
    assert lines[1].split() == [
        "part", "owner", "epoch", "lease_until", "checkpoint", "checkpoint_lag_s"
    ]  # fmt: skip
    assert lines[2].split()[:3] == ["0", "dispatcher-a", "1"]
    assert lines[4].split() == ["2", "-", "0", "-", "-", "-"]


def test_a_healthy_part_has_no_lag() -> None:
    now = datetime(2026, 10, 26, 13, 0, 15, tzinfo=UTC)
    # Minute 12:58 finished: 12:59 ends at 13:00 and is in its grace until 13:00:20.
    assert (
        checkpoint_lag_s(datetime(2026, 10, 26, 12, 58, tzinfo=UTC), now, timedelta(seconds=20))
        == 0
    )
    assert checkpoint_lag_s(
        datetime(2026, 10, 26, 12, 50, tzinfo=UTC), now, timedelta(seconds=20)
    ) == pytest.approx(7 * 60 + 55)  # 12:51 was due done at 12:52:20


@pytest.mark.parametrize("smaller_or_equal", ["4", "3", "1"])
def test_grow_refuses_a_p_not_above_the_latest(
    own_keyspace: CassandraConnection, admin: AdminRunner, smaller_or_equal: str
) -> None:
    store_parts(own_keyspace, 4)
    refused = admin("parts", "grow", "--to", smaller_or_equal)
    assert refused.code == 2
    assert (
        f"P only grows: the latest P is 4 (from 1970-01-01T00:00:00.000Z); "
        f"--to {smaller_or_equal} must be greater"
    ) in refused.err
    rows = list(own_keyspace.session.execute("SELECT parts FROM part_counts"))
    assert [row.parts for row in rows] == [4]


def test_grow_refuses_over_16_times_the_latest_p_unless_forced(
    own_keyspace: CassandraConnection, admin: AdminRunner
) -> None:
    """P never shrinks, so a typo (10240 for 1024) would be for good."""
    store_parts(own_keyspace, 4)
    refused = admin("parts", "grow", "--to", "65")
    assert refused.code == 2
    assert "--to 65 is over 16 times the latest P (4)" in refused.err
    rows = list(own_keyspace.session.execute("SELECT parts FROM part_counts"))
    assert [row.parts for row in rows] == [4]

    assert admin("parts", "--json", "grow", "--to", "65", "--force").json()["parts"] == 65


def test_grow_refuses_a_lead_under_two_minutes(
    own_keyspace: CassandraConnection, admin: AdminRunner
) -> None:
    refused = admin("parts", "grow", "--to", "128", "--effective-in", "60")
    assert refused.code == 2
    assert "--effective-in 60s is under the minimum 120s" in refused.err
    assert list(own_keyspace.session.execute("SELECT parts FROM part_counts")) == []


def test_grow_stores_the_new_p_from_a_minute_ahead_and_seeds_the_new_parts(
    own_keyspace: CassandraConnection, admin: AdminRunner
) -> None:
    before = datetime.now(UTC)
    # `--json` before `grow` (the parent's flag) as well as after it.
    grown = admin("parts", "--json", "grow", "--to", "96").json()  # from the default 64
    effective = parse(grown["effective_minute"])
    assert effective == ceil_minute(effective)
    assert before + timedelta(minutes=3) <= effective <= before + timedelta(minutes=4, seconds=5)
    assert (grown["previous_parts"], grown["parts"]) == (64, 96)
    assert grown["seeded_parts"] == list(range(64, 96))

    counts = PartCounts(own_keyspace.session, refresh_s=0)

    async def parts_around(minute: datetime) -> tuple[int, int]:
        return await counts.parts_at(minute - timedelta(minutes=1)), await counts.parts_at(minute)

    assert run(parts_around(effective)) == (64, 96)
    listed = admin("parts", "--json").json()
    assert listed["part_counts"] == [
        {"from_minute": "1970-01-01T00:00:00.000Z", "parts": 64},  # the default, made explicit
        {"from_minute": grown["effective_minute"], "parts": 96},
    ]
    later = [item for item in listed["parts"] if not item["in_force"]]
    assert [item["part"] for item in later] == list(range(64, 96))
    assert {(item["owner"], item["epoch"], item["checkpoint"]) for item in later} == {
        (None, 0, (effective - timedelta(minutes=1)).isoformat(timespec="milliseconds")[:-6] + "Z")
    }
    assert "64 (later)" in admin("parts").out

    # A seeded part is taken by the dispatchers' lease code and starts at the effective minute.
    lease = run(PartLeases(own_keyspace.session, "d", timedelta(seconds=15)).try_take(70))
    assert lease is not None
    assert (lease.epoch, lease.checkpoint) == (1, effective - timedelta(minutes=1))

    # A second grow comes after the first, never before it (the sequence only grows).
    again = admin("parts", "grow", "--to", "128", "--effective-in", "120", "--json").json()
    assert parse(again["effective_minute"]) > effective
    assert again["seeded_parts"] == list(range(96, 128))
    assert admin("parts", "grow", "--to", "100").code == 2


def test_a_grow_cut_short_while_seeding_is_finished_by_running_it_again(
    own_keyspace: CassandraConnection, admin: AdminRunner
) -> None:
    """Stopped (a timeout, Ctrl-C) after P was stored but before every new part was seeded:
    the unseeded parts would start an hour back, and running the same grow again was
    refused ("P only grows")."""
    grown = admin("parts", "--json", "grow", "--to", "96").json()
    effective = parse(grown["effective_minute"])
    for part in range(80, 96):
        own_keyspace.session.execute("DELETE FROM dispatch_parts WHERE part = %s", (part,))
    # One the dispatchers have worked since: it keeps its checkpoint.
    later = effective + timedelta(minutes=5)
    own_keyspace.session.execute(
        "UPDATE dispatch_parts SET checkpoint = %s WHERE part = 70", (later,)
    )

    again = admin("parts", "--json", "grow", "--to", "96")

    assert again.code == 0, again.err
    finished = again.json()
    assert finished["finished"] is True
    assert (finished["previous_parts"], finished["parts"]) == (64, 96)
    assert finished["effective_minute"] == grown["effective_minute"]
    assert finished["seeded_parts"] == list(range(80, 96))
    checkpoints = {
        row.part: row.checkpoint.replace(tzinfo=UTC)
        for row in own_keyspace.session.execute("SELECT part, checkpoint FROM dispatch_parts")
    }
    assert {checkpoints[part] for part in range(80, 96)} == {effective - timedelta(minutes=1)}
    assert checkpoints[70] == later
    told = admin("parts", "grow", "--to", "96")
    assert "was stored already; parts left unseeded by an earlier run, seeded now: 0" in told.out
    assert admin("parts", "grow", "--to", "95").code == 2  # P still only grows


def test_a_grow_moves_back_new_parts_a_concurrent_later_grow_seeded_first(
    own_keyspace: CassandraConnection, admin: AdminRunner
) -> None:
    """Two grows at once, both from P = 64: one to 96 from a minute ~3 min ahead, one to
    128 an hour later whose seeds of parts 64-95 landed first (an hour on). Parts 64-95 are
    in force from the earlier minute, so they must be read from it: their checkpoints are
    moved back, and none of that hour's entries is skipped."""
    later = ceil_minute(datetime.now(UTC) + timedelta(hours=1))
    for part in range(64, 128):
        own_keyspace.session.execute(
            "INSERT INTO dispatch_parts (part, checkpoint) VALUES (%s, %s) IF NOT EXISTS",
            (part, later - timedelta(minutes=1)),
        )

    grown = admin("parts", "--json", "grow", "--to", "96").json()

    effective = parse(grown["effective_minute"])
    assert grown["seeded_parts"] == list(range(64, 96))
    checkpoints = {
        row.part: row.checkpoint.replace(tzinfo=UTC)
        for row in own_keyspace.session.execute("SELECT part, checkpoint FROM dispatch_parts")
    }
    assert {checkpoints[part] for part in range(64, 96)} == {effective - timedelta(minutes=1)}
    assert {checkpoints[part] for part in range(96, 128)} == {later - timedelta(minutes=1)}


def test_a_concurrent_grow_storing_a_smaller_p_later_is_raised_not_left_to_shrink(
    own_keyspace: CassandraConnection, admin: AdminRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another grow, to 80 an hour on, lands between this one's read of the counts and its
    write (to 128, ~3 min on): P would fall from 128 to 80, and entries written under 128
    into parts 80-127 would go unread. The later count is raised to 128 instead (never
    deleted: some process may already have cached it)."""
    insert = parts_admin._insert_count
    later = ceil_minute(datetime.now(UTC) + timedelta(hours=1))

    async def with_a_concurrent_grow(admin_context: Admin, count: PartCount) -> bool:
        if count.parts == 128:
            await insert(admin_context, PartCount(later, 80))
        return await insert(admin_context, count)

    monkeypatch.setattr(parts_admin, "_insert_count", with_a_concurrent_grow)
    grown = admin("parts", "grow", "--to", "128")

    assert grown.code == 2
    assert "raised to" in grown.err
    counts = admin("parts", "--json").json()["part_counts"]
    assert [count["parts"] for count in counts] == [64, 128, 128]
    assert counts[-1]["from_minute"] == later.isoformat(timespec="milliseconds")[:-6] + "Z"
