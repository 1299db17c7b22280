"""`reminders admin replan --zone Z` after a zone's rules change, and the time engine's
override hook that changes them (REMINDERS_TZ_OVERRIDE_DIR, read at a process's start).

The change: New York gets Chicago's rules (same DST dates, one hour behind), so every
local time in New York now falls one hour later in UTC.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

import pytest

from dispatcher.buckets import BucketReader
from reminders_svc.admin.replan import replanned, token_ranges, waits_for_its_ring
from reminders_svc.config import ConfigError, check_tz_override
from reminders_svc.domain import dispatch
from reminders_svc.domain.reminder import Claim, Reminder, Status, edit_text, pause, snooze
from reminders_svc.schedule import (
    Schedule,
    one_off_instant,
    one_off_local,
    parse_repeat,
    parse_rrule,
    validate_new,
)
from reminders_svc.storage.parts import DEFAULT_PARTS, MINUTE, floor_minute, part_of
from reminders_svc.storage.reminders_store import StoredReminder
from reminders_svc.storage.session import CassandraConnection
from tests.admin.conftest import SECRET_TEXT, at_instant, cassandra_env, change, put, run, store_of
from tests.dispatcher.stack import REMINDERS
from tests.unknown_outcome import UnknownOutcome

ZONE = "America/New_York"
HOUR = timedelta(hours=1)


def chicago_rules_for(directory: Path, *names: str) -> Path:
    """`directory` as an override where each of `names` holds Chicago's TZif file."""
    source = resources.files("tzdata.zoneinfo").joinpath("America", "Chicago")
    for name in names:
        target = directory.joinpath(*name.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        with source.open("rb") as zone_file, target.open("wb") as copy:
            shutil.copyfileobj(zone_file, copy)
    return directory


@pytest.fixture
def chicago_rules_for_new_york(tmp_path: Path) -> Path:
    """An override directory where America/New_York holds Chicago's TZif file."""
    return chicago_rules_for(tmp_path, ZONE)


def reminders(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [REMINDERS, *command],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def engine_says(code: str, override: str) -> list[str]:
    python = str(Path(REMINDERS).with_name("python"))
    env = {**os.environ, "REMINDERS_TZ_OVERRIDE_DIR": override}
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, env=env)
    return done.stdout.splitlines()


def test_the_override_takes_precedence_from_a_process_start(
    chicago_rules_for_new_york: Path,
) -> None:
    code = (
        "from datetime import datetime; from reminders_svc.schedule import to_utc, tzdata_version;"
        "print(to_utc(datetime(2027, 1, 4, 9, 0), 'America/New_York').isoformat());"
        "print(to_utc(datetime(2027, 1, 4, 9, 0), 'Europe/Paris').isoformat());"
        "print(tzdata_version());"
        "print(tzdata_version(naming_the_directory=False))"
    )
    pinned = engine_says(code, override="")
    overridden = engine_says(code, override=str(chicago_rules_for_new_york))
    assert pinned[:2] == ["2027-01-04T14:00:00+00:00", "2027-01-04T08:00:00+00:00"]
    assert overridden[:2] == ["2027-01-04T15:00:00+00:00", "2027-01-04T08:00:00+00:00"]
    assert "overrides" not in pinned[2]
    assert overridden[2] == (
        f"{pinned[2]} + overrides from {chicago_rules_for_new_york} (America/New_York)"
    )
    # What PreviewSchedule answers any caller: no path on the server's disk.
    assert overridden[3] == f"{pinned[2]} + overrides (America/New_York)"


def test_the_version_names_the_first_overridden_zones_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    """It goes into every PreviewSchedule answer: a whole tz release dropped into the
    directory must not make it ~600 names long."""
    zones = ["Europe/Berlin", "Europe/Paris", "Asia/Tokyo", "America/Chicago", "Africa/Cairo"]
    zones += ["America/Denver", "Australia/Sydney"]
    for zone in zones:
        (tmp_path / zone).parent.mkdir(exist_ok=True)
        (tmp_path / zone).write_bytes(
            resources.files("tzdata.zoneinfo").joinpath(zone).read_bytes()
        )
    code = "from reminders_svc.schedule import tzdata_version; print(tzdata_version())"
    [version] = engine_says(code, override=str(tmp_path))
    named = ", ".join(sorted(zones)[:5])
    assert version.endswith(f" + overrides from {tmp_path} ({named} and 2 more)")


@pytest.mark.parametrize("command", [["serve-api"], ["dispatch"]])
def test_a_process_computing_dues_refuses_an_override_that_is_no_directory(
    tmp_path: Path, command: list[str]
) -> None:
    """A mistyped path would leave every zone on the pinned rules while the operator
    believes the override in force: the process stops at its start, naming the variable."""
    env = {"REMINDERS_ENV": "dev", "REMINDERS_TZ_OVERRIDE_DIR": str(tmp_path / "missing")}
    refused = reminders(command, env)
    assert refused.returncode == 2
    assert f"REMINDERS_TZ_OVERRIDE_DIR={str(tmp_path / 'missing')!r}: not a directory" in (
        refused.stderr
    )
    assert "Traceback" not in refused.stderr


def test_an_override_that_cannot_be_loaded_is_refused_naming_the_variable(
    tmp_path: Path,
) -> None:
    """A path too long to open, and a zone's file that is not TZif: refused at the start,
    not a traceback there nor an INTERNAL answer to every create in the zone."""
    too_long = str(tmp_path / ("x" * 5000))
    with pytest.raises(ConfigError, match=r"REMINDERS_TZ_OVERRIDE_DIR=.*: cannot be read"):
        check_tz_override({"REMINDERS_TZ_OVERRIDE_DIR": too_long})
    (tmp_path / "Europe").mkdir()
    (tmp_path / "Europe" / "Paris").write_bytes(b"not a TZif file")
    with pytest.raises(ConfigError, match=r"Europe/Paris unusable: Invalid TZif file"):
        check_tz_override({"REMINDERS_TZ_OVERRIDE_DIR": str(tmp_path)})


def test_replan_refuses_an_override_directory_without_zone_files_before_connecting(
    own_keyspace: CassandraConnection, tmp_path: Path
) -> None:
    """Checked before connecting: the operator hears of the misnamed file at once, not
    after the driver's connect timeout against a cluster that is down."""
    (tmp_path / "America").mkdir()
    (tmp_path / "America" / "New_Yrok").write_bytes(b"TZif")  # misnamed: no zone's file
    unreachable = dataclasses.replace(own_keyspace.settings, port=1)
    env = {**cassandra_env(unreachable), "REMINDERS_TZ_OVERRIDE_DIR": str(tmp_path)}
    refused = reminders(["admin", "replan", "--zone", ZONE, "--dry-run"], env)
    assert refused.returncode == 2  # bad configuration, as every command says it
    assert "holds no zone file" in refused.stderr
    assert "cannot reach" not in refused.stderr


def daily_at_nine(zone: str) -> Schedule:
    return parse_repeat("every day 09:00", zone, datetime(2026, 1, 1, 0, 0))


def create(db: CassandraConnection, user: str, schedule: Schedule, now: datetime) -> StoredReminder:
    first = validate_new(schedule, now)
    return run(put(store_of(db), at_instant(user, first, now, schedule)))


def test_replan_moves_the_future_dues_of_the_zone_and_nothing_else(
    own_keyspace: CassandraConnection, chicago_rules_for_new_york: Path
) -> None:
    db, store = own_keyspace, store_of(own_keyspace)
    now = datetime.now(UTC).replace(microsecond=0)
    rows = {
        "daily": create(db, "ny-daily", daily_at_nine(ZONE), now),
        "local_once": create(db, "ny-once", one_off_local(datetime(2027, 3, 1, 9, 0), ZONE), now),
        "instant_once": create(db, "ny-instant", one_off_instant(now + 2 * 24 * HOUR, ZONE), now),
        "paused": create(db, "ny-paused", daily_at_nine(ZONE), now),
        "snoozed": create(db, "ny-snoozed", daily_at_nine(ZONE), now),
        "done": create(db, "ny-done", daily_at_nine(ZONE), now),
        "paris": create(db, "paris-daily", daily_at_nine("Europe/Paris"), now),
    }
    rows["paused"] = run(change(store, rows["paused"], pause(rows["paused"].reminder, now)))
    snoozed_until = now + timedelta(minutes=30)
    rows["snoozed"] = run(
        change(store, rows["snoozed"], snooze(rows["snoozed"].reminder, snoozed_until, now))
    )
    finished = dataclasses.replace(rows["done"].reminder, status=Status.DONE, due=None)
    rows["done"] = run(change(store, rows["done"], finished))

    env = {
        **cassandra_env(db.settings),
        "REMINDERS_TZ_OVERRIDE_DIR": str(chicago_rules_for_new_york),
    }
    command = ["admin", "replan", "--zone", ZONE, "--splits", "8", "--json"]
    replan = reminders(command, env)
    assert replan.returncode == 0, replan.stderr
    report = json.loads(replan.stdout)
    assert report["outcomes"] == {"moved": 4, "unchanged": 1}
    assert report["scanned"] >= len(rows)
    assert report["rules"].endswith(
        f"+ overrides from {chicago_rules_for_new_york} (America/New_York)"
    )
    assert SECRET_TEXT not in replan.stdout + replan.stderr

    def now_stored(name: str) -> Reminder:
        stored = run(store.get(rows[name].reminder.user_id, rows[name].reminder.reminder_id))
        assert stored is not None
        return stored.reminder

    for name in ("daily", "local_once", "paused", "snoozed"):
        before, after = rows[name].reminder, now_stored(name)
        assert before.occurrence is not None
        assert after.occurrence == before.occurrence + HOUR, name
        assert (after.status, after.version, after.updated_at) == (
            before.status,
            before.version,
            before.updated_at,
        )
        # Not a user change: the op_id still names the last one (which settles by it).
        assert after.op_id == before.op_id
    for name in ("daily", "local_once"):
        before, after = rows[name].reminder, now_stored(name)
        assert before.due is not None
        assert after.due == before.due + HOUR
        assert entry_for(db, after), f"{name}: the new due's bucket entry"
    assert now_stored("paused").due is None
    assert now_stored("snoozed").due == snoozed_until  # the snooze still rings first
    for name in ("instant_once", "done", "paris"):
        assert now_stored(name) == rows[name].reminder, name

    again = reminders(command, env)
    assert json.loads(again.stdout)["outcomes"] == {"unchanged": 5}
    dry = reminders(["admin", "replan", "--zone", ZONE, "--splits", "4", "--dry-run"], env)
    assert dry.returncode == 0, dry.stderr
    assert "dry run" in dry.stdout


def test_replan_moves_the_reminders_stored_under_the_zones_links_too(
    own_keyspace: CassandraConnection, tmp_path: Path
) -> None:
    """A reminder keeps the zone name it was created with, a link (US/Eastern) as well as
    the zone (America/New_York): new rules for the zone are new rules for its links, and
    their rows must move alike. A link the override has no file for keeps its rules."""
    db, store = own_keyspace, store_of(own_keyspace)
    now = datetime.now(UTC).replace(microsecond=0)
    link = create(db, "eastern-daily", daily_at_nine("US/Eastern"), now)
    zone = create(db, "ny-daily", daily_at_nine(ZONE), now)
    env = {**cassandra_env(db.settings), "REMINDERS_TZ_OVERRIDE_DIR": str(tmp_path)}
    command = ["admin", "replan", "--zone", ZONE, "--splits", "4", "--json"]

    chicago_rules_for(tmp_path / "zone-only", ZONE)
    env["REMINDERS_TZ_OVERRIDE_DIR"] = str(tmp_path / "zone-only")
    alone = reminders(command, env)
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["names"] == [ZONE]

    chicago_rules_for(tmp_path / "release", ZONE, "US/Eastern")
    env["REMINDERS_TZ_OVERRIDE_DIR"] = str(tmp_path / "release")
    replan = reminders(command, env)
    assert replan.returncode == 0, replan.stderr
    assert json.loads(replan.stdout)["names"] == [ZONE, "US/Eastern"]
    for before in (link.reminder, zone.reminder):
        after = run(store.get(before.user_id, before.reminder_id))
        assert after is not None
        assert before.occurrence is not None
        assert after.reminder.occurrence == before.occurrence + HOUR, before.schedule.zone


def test_a_row_whose_snooze_rings_as_the_scan_passes_is_replanned_once_that_ring_ends(
    own_keyspace: CassandraConnection, chicago_rules_for_new_york: Path
) -> None:
    """The finalize of a snooze's ring keeps the series' occurrence as stored (old rules):
    the scan must come back to the row, or it rings an hour off for good (it was skipped
    as "sending", reported nowhere, and a second run found it `moved`)."""
    db, store = own_keyspace, store_of(own_keyspace)
    now = datetime.now(UTC).replace(microsecond=0)
    stored = create(db, "ny-snooze-ringing", daily_at_nine(ZONE), now)
    before = stored.reminder
    assert before.occurrence is not None
    snoozed = run(change(store, stored, snooze(before, now - timedelta(seconds=1), now)))
    ringing = run(
        change(store, snoozed, dispatch.claimed(snoozed.reminder, uuid.uuid4(), now, 2 * MINUTE))
    )
    env = {
        **os.environ,
        **cassandra_env(db.settings),
        "REMINDERS_TZ_OVERRIDE_DIR": str(chicago_rules_for_new_york),
    }
    command = [REMINDERS, "admin", "replan", "--zone", ZONE, "--splits", "4", "--json"]
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as replan:
        assert replan.stderr is not None
        # Blocks until it waits (progress lines may come first), or ends without waiting.
        said = [replan.stderr.readline()]
        while said[-1] and "a row waits for its snooze's ring in flight" not in said[-1]:
            said.append(replan.stderr.readline())
        assert said[-1], said
        # The dispatcher finalizes the snooze's ring: the series' occurrence stays.
        finalized = dispatch.finalized(ringing.reminder, datetime.now(UTC))
        assert finalized.occurrence == before.occurrence
        run(change(store, ringing, finalized))
        out, err = replan.communicate(timeout=120)
    assert replan.returncode == 0, err
    assert json.loads(out)["outcomes"] == {"moved": 1}
    after = run(store.get(before.user_id, before.reminder_id))
    assert after is not None
    assert after.reminder.occurrence == before.occurrence + HOUR
    assert (after.reminder.status, after.reminder.due) == (Status.PENDING, before.occurrence + HOUR)
    assert entry_for(db, after.reminder)


def test_only_a_snooze_ringing_at_an_occurrence_the_rules_moved_waits_for_its_ring() -> None:
    now = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)
    row = at_instant("u", datetime(2027, 1, 5, 15, 0, tzinfo=UTC), now, daily_at_nine(ZONE))
    claim = Claim(uuid.uuid4(), now, now + MINUTE)
    ringing = dataclasses.replace(row, status=Status.SENDING, claim=claim, due=now)
    assert waits_for_its_ring(ringing, now)  # old rules said 15:00Z; 09:00 is 14:00Z now
    assert not waits_for_its_ring(as_of(ringing, datetime(2027, 1, 5, 14, 0, tzinfo=UTC)), now)
    assert not waits_for_its_ring(dataclasses.replace(ringing, status=Status.PENDING), now)
    # A regular ring in flight: its finalize computes the next occurrence with the new rules.
    assert not waits_for_its_ring(as_of(ringing, now), now)


def left_by_old_rules(db: CassandraConnection, user: str, now: datetime) -> StoredReminder:
    """A daily reminder whose stored occurrence (and due) the rules in force now put an
    hour earlier: one that `replanned` moves (an hour later stays in the future at any
    time of day)."""
    stored = create(db, user, daily_at_nine(ZONE), now)
    assert stored.reminder.occurrence is not None
    return run(
        change(store_of(db), stored, as_of(stored.reminder, stored.reminder.occurrence + HOUR))
    )


def replan_of(stored: StoredReminder, now: datetime) -> Reminder:
    after = replanned(stored.reminder, now)
    assert after is not None
    return after


@pytest.mark.parametrize("lands", [True, False], ids=["landed", "lost"])
def test_a_replan_write_of_unknown_outcome_is_settled_by_what_it_wrote(
    own_keyspace: CassandraConnection, lands: bool
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    stored = left_by_old_rules(own_keyspace, "ny-settle", now)
    unsure = store_of(own_keyspace, UnknownOutcome(lands=lands))
    assert run(unsure.replace(stored, replan_of(stored, now), now)) is lands


def test_a_users_edit_of_unknown_outcome_is_settled_as_landed_under_a_replan(
    own_keyspace: CassandraConnection,
) -> None:
    """The edit lands unheard, a replan moves the row on top of it, then the edit's SERIAL
    read settles it: landed (the replan kept the edit's op_id), not refused as stale."""
    now = datetime.now(UTC).replace(microsecond=0)
    stored = left_by_old_rules(own_keyspace, "ny-edit", now)
    store = store_of(own_keyspace)

    async def a_replan_lands() -> None:
        current = await store.get_serial(stored.reminder.user_id, stored.reminder.reminder_id)
        assert current is not None
        assert await store.replace(current, replan_of(current, now), now)

    unsure = store_of(own_keyspace, UnknownOutcome(lands=True, then=a_replan_lands))
    assert run(unsure.replace(stored, edit_text(stored.reminder, "edited", now), now))
    after = run(store.get(stored.reminder.user_id, stored.reminder.reminder_id))
    assert after is not None
    assert after.reminder.version == stored.reminder.version + 1
    assert after.reminder.occurrence == replan_of(stored, now).occurrence


@pytest.mark.parametrize("step", ["claim", "snooze"])
def test_a_step_computed_from_a_read_before_a_replan_loses_to_it(
    own_keyspace: CassandraConnection, step: str
) -> None:
    """A pending row whose due is a snooze: the replan moves its occurrence and leaves
    version, status, claim and due as they were. A dispatcher's claim (or a user's snooze)
    computed from a read before it matched every column it compared, landed, and wrote the
    old rules' occurrence back as the due: an hour off, then a second ring that day."""
    db, store = own_keyspace, store_of(own_keyspace)
    now = datetime.now(UTC).replace(microsecond=0)
    created = left_by_old_rules(db, f"ny-{step}-stale", now)
    read = run(change(store, created, snooze(created.reminder, now + MINUTE, now)))
    assert run(store.replace(read, replan_of(read, now), now))

    if step == "claim":
        stale = dispatch.claimed(read.reminder, uuid.uuid4(), now, 2 * MINUTE)
    else:  # a second snooze, after the old occurrence: due = earliest(old occurrence, it)
        stale = snooze(read.reminder, now + timedelta(days=2), now)
    assert not run(store.replace(read, stale, now))

    after = run(store.get(read.reminder.user_id, read.reminder.reminder_id))
    assert after is not None
    assert after.reminder == replan_of(read, now)


def entry_for(db: CassandraConnection, row: Reminder) -> bool:
    assert row.due is not None
    minute, part = floor_minute(row.due), part_of(row.user_id, DEFAULT_PARTS)
    found = run(BucketReader(db.session).read(minute, part))
    return any(entry.reminder_id == row.reminder_id and entry.due == row.due for entry in found)


def as_of(reminder: Reminder, occurrence: datetime) -> Reminder:
    """The row as the old rules left it: its occurrence (and due) at `occurrence`."""
    return dataclasses.replace(reminder, occurrence=occurrence, due=occurrence)


def test_the_same_local_occurrence_is_the_nearest_ring_under_the_new_rules() -> None:
    now = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)
    schedule = daily_at_nine(ZONE)  # 09:00 New York = 14:00Z in January
    row = at_instant("u", datetime(2027, 1, 5, 14, 0, tzinfo=UTC), now, schedule)
    # Old rules put tomorrow's 09:00 an hour earlier or later: it comes back to 14:00Z,
    # not to today's ring (already given) nor to the day after.
    for old in (datetime(2027, 1, 5, 13, 0, tzinfo=UTC), datetime(2027, 1, 5, 15, 0, tzinfo=UTC)):
        moved = replanned(as_of(row, old), now)
        assert moved is not None
        assert (moved.occurrence, moved.due) == (datetime(2027, 1, 5, 14, 0, tzinfo=UTC),) * 2
    assert replanned(row, now) is None  # already right: nothing to write


def test_a_change_of_half_the_period_takes_the_earlier_ring_and_skips_none() -> None:
    """An hourly repeat whose zone moves by 30 minutes: the stored 06:00Z lies between the
    new rules' 05:30Z and 06:30Z. The earlier is taken; the later follows it."""
    now = datetime(2027, 1, 4, 4, 40, tzinfo=UTC)
    start = datetime(2027, 1, 4, 0, 0)
    schedule = parse_rrule("FREQ=HOURLY", "Asia/Kolkata", start)  # :30 UTC every hour
    row = at_instant("u", datetime(2027, 1, 4, 6, 0, tzinfo=UTC), now, schedule)
    moved = replanned(row, now)
    assert moved is not None
    assert moved.due == datetime(2027, 1, 4, 5, 30, tzinfo=UTC)


def test_an_occurrence_moved_into_the_past_rings_now_rather_than_never() -> None:
    now = datetime(2027, 1, 4, 14, 30, tzinfo=UTC)
    schedule = daily_at_nine(ZONE)
    row = at_instant("u", datetime(2027, 1, 4, 15, 0, tzinfo=UTC), now, schedule)
    moved = replanned(row, now)  # old rules said 15:00Z; today's 09:00 is 14:00Z now
    assert moved is not None
    assert moved.due == datetime(2027, 1, 4, 14, 0, tzinfo=UTC)
    assert moved.due <= now  # its entry goes into the current minute: it rings, late


def test_only_pending_and_paused_rows_with_a_future_occurrence_are_replanned() -> None:
    now = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)
    row = at_instant("u", datetime(2027, 1, 5, 13, 0, tzinfo=UTC), now, daily_at_nine(ZONE))
    for status in (Status.SENDING, Status.DONE, Status.DELETED):
        assert replanned(dataclasses.replace(row, status=status), now) is None
    assert replanned(as_of(row, now - HOUR), now) is None  # being rung: its finalize replans


def test_token_ranges_cover_the_whole_ring_once() -> None:
    ranges = token_ranges(7)
    assert ranges[0][0] == -(2**63)
    assert ranges[-1][1] == 2**63 - 1
    assert all(end == start for (_, end), (start, _) in itertools.pairwise(ranges))
