"""Long admin runs (a replay of a day, a replan of hours) on the real Cassandra: storage
trouble on the way is waited out, progress is told, and a run that ends anyway says
where to go on from."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cassandra import OperationTimedOut

from dispatcher.buckets import BucketReader
from reminders_svc.admin import cli, patience
from reminders_svc.admin.replan import ZoneScan
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import CassandraConnection
from tests.admin.conftest import AdminRunner, minutes_ago, whole_minute
from tests.admin.test_replan import ZONE, create, daily_at_nine, left_by_old_rules
from tests.admin.test_replay_inspect import make_minute_of_every_kind


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pauses of a hundredth of a second and every progress line told.
    monkeypatch.setattr(patience, "_FIRST_PAUSE_S", 0.01)
    monkeypatch.setattr(cli, "PROGRESS_EVERY_S", 0.0)


def failing(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str, fails: Callable[[int], bool]
) -> list[int]:
    """`owner.name` raising OperationTimedOut on the calls `fails(n)` picks (n from 1)."""
    calls: list[int] = []
    real = getattr(owner, name)

    def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(calls) + 1)
        if fails(len(calls)):
            raise OperationTimedOut("injected")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, flaky)
    return calls


def test_a_replay_waits_out_storage_trouble_and_counts_each_entry_once(
    own_keyspace: CassandraConnection, admin: AdminRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    minute = minutes_ago(90)
    make_minute_of_every_kind(own_keyspace, minute)
    # The 1st and the 40th part read time out: a node restarting. It ended the run.
    failing(monkeypatch, BucketReader, "read", lambda n: n in (1, 40))

    replayed = admin(
        "replay", "--from", whole_minute(minute), "--to", whole_minute(minute), "--json"
    )

    assert replayed.code == 0, replayed.err
    report = replayed.json()
    assert report["entries"] == 7
    assert report["outcomes"] == {
        "re_armed": 2,
        "in_flight": 1,
        "paused": 1,
        "deleted": 1,
        "done": 1,
        "stale": 1,
    }
    retries = [line for line in replayed.err.splitlines() if "trying again" in line]
    assert len(retries) == 2, replayed.err
    assert retries[0].startswith(f"minute {minute.isoformat(timespec='milliseconds')[:-6]}Z")
    assert "OperationTimedOut" in retries[0]


def test_a_replay_tells_its_progress_and_where_to_go_on_from_when_it_ends(
    own_keyspace: CassandraConnection, admin: AdminRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = minutes_ago(30)
    third = first + timedelta(minutes=2)
    # The third minute's reads fail for good (64 parts a minute): the cluster is gone.
    failing(monkeypatch, BucketReader, "read", lambda n: n > 2 * 64)

    ended = admin("replay", "--from", whole_minute(first), "--to", whole_minute(third))

    assert ended.code == 1
    lines = ended.err.splitlines()
    told = [line for line in lines if line.startswith("replayed through")]
    assert told == [
        f"replayed through {iso(first)}: 1 minutes, 0 entries, 0 re-armed",
        f"replayed through {iso(first + timedelta(minutes=1))}: 2 minutes, 0 entries, 0 re-armed",
    ]
    assert (
        f"stopped after minute {iso(first + timedelta(minutes=1))} (2 minutes done): to go on,"
        f" run it again with --from {iso(third)}"
    ) in lines
    assert lines[-1].startswith("reminders admin replay: storage: OperationTimedOut")
    assert "Traceback" not in ended.err


def test_a_replan_waits_out_storage_trouble_and_tells_its_progress(
    own_keyspace: CassandraConnection, admin: AdminRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(own_keyspace, "utc-daily", daily_at_nine("UTC"), datetime.now(UTC))
    failing(monkeypatch, ZoneScan, "_page", lambda n: n == 1)

    replanned = admin("replan", "--zone", "UTC", "--splits", "4", "--dry-run", "--json")

    assert replanned.code == 0, replanned.err
    report = replanned.json()
    assert report["outcomes"] == {"unchanged": 1}
    assert (report["ranges_done"], report["ranges"]) == (4, 4)
    assert "OperationTimedOut; trying again" in replanned.err
    told = [line for line in replanned.err.splitlines() if line.startswith("token ranges done")]
    assert [line.split(";")[0] for line in told] == [
        f"token ranges done: {done} of 4" for done in range(1, 5)
    ]


def test_a_replan_write_that_landed_before_the_trouble_is_counted_as_moved(
    own_keyspace: CassandraConnection, admin: AdminRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write landed, then its settling read timed out too: the try after the pause
    found the row in place and counted it unchanged."""
    left_by_old_rules(own_keyspace, "ny-landed", datetime.now(UTC).replace(microsecond=0))
    real = ReminderStore.replace
    calls = 0

    async def lands_then_times_out(self: ReminderStore, *args: Any) -> bool:
        nonlocal calls
        calls += 1
        written = await real(self, *args)
        if calls == 1:
            raise OperationTimedOut("injected")
        return written

    monkeypatch.setattr(ReminderStore, "replace", lands_then_times_out)

    replanned = admin("replan", "--zone", ZONE, "--splits", "4", "--json")

    assert replanned.code == 0, replanned.err
    assert replanned.json()["outcomes"] == {"moved": 1}
    assert "OperationTimedOut; trying again" in replanned.err
    assert calls == 1  # the retry wrote nothing: the row was already moved


def iso(minute: datetime) -> str:
    return minute.isoformat(timespec="milliseconds").replace("+00:00", "Z")
