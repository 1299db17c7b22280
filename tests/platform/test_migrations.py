"""Schema migrations on the real node: idempotent, concurrent-safe, immutable files."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from cassandra import ConsistencyLevel, OperationTimedOut, Unauthorized
from cassandra.cluster import NoHostAvailable, ResponseFuture
from cassandra.connection import ConnectionException

from reminders_svc.cli import main
from reminders_svc.config import CassandraSettings
from reminders_svc.storage import migrate_cli, migrations
from reminders_svc.storage.errors import STORAGE_ERRORS
from reminders_svc.storage.migrations import (
    MigrationError,
    SchemaBehind,
    default_cql_dir,
    load_migrations,
    migrate,
    require_current_schema,
    split_statements,
)
from reminders_svc.storage.session import connect
from tests.admin.conftest import cassandra_env
from tests.platform.helpers import REMINDERS, free_port, run_cli

EXPECTED_TABLES = {
    "reminders",
    "due_buckets",
    "part_counts",
    "dispatch_parts",
    "create_requests",
    "deliveries",
    "schema_migrations",
    "schema_migration_lock",
}


def _schema(settings: CassandraSettings) -> list[tuple[object, ...]]:
    with connect(settings, keyspace="") as connection:
        session = connection.session
        ks = settings.keyspace
        tables = session.execute(
            "SELECT table_name, id, compaction, gc_grace_seconds, default_time_to_live"
            " FROM system_schema.tables WHERE keyspace_name = %s",
            (ks,),
        )
        columns = session.execute(
            "SELECT table_name, column_name, kind, type FROM system_schema.columns"
            " WHERE keyspace_name = %s",
            (ks,),
        )
        rows = [tuple(r) for r in tables] + [tuple(r) for r in columns]
    return sorted(rows, key=repr)


def _history(settings: CassandraSettings) -> dict[int, str]:
    with connect(settings) as connection:
        rows = connection.session.execute("SELECT version, applied_by FROM schema_migrations")
        return {row.version: row.applied_by for row in rows}


def test_migrate_creates_every_table_and_a_second_run_changes_nothing(
    fresh_keyspace: CassandraSettings,
) -> None:
    migrations = load_migrations(default_cql_dir())
    with connect(fresh_keyspace, keyspace="") as connection:
        first = migrate(connection.session, fresh_keyspace, migrations)
    schema_after_first = _schema(fresh_keyspace)
    with connect(fresh_keyspace, keyspace="") as connection:
        second = migrate(connection.session, fresh_keyspace, migrations)

    assert first.applied == tuple(m.label for m in migrations)
    assert second.applied == ()
    assert second.already_applied == first.applied
    assert {row[0] for row in schema_after_first} >= EXPECTED_TABLES
    assert _schema(fresh_keyspace) == schema_after_first


def test_a_schema_behind_the_release_is_named_until_migrated(
    fresh_keyspace: CassandraSettings,
) -> None:
    migrations = load_migrations(default_cql_dir())
    with connect(fresh_keyspace, keyspace="") as connection:
        session = connection.session
        session.execute(
            f"CREATE KEYSPACE {fresh_keyspace.keyspace} WITH replication ="
            f" {fresh_keyspace.replication.cql()}"
        )
        with pytest.raises(SchemaBehind, match="has no schema_migrations table: run `reminders"):
            require_current_schema(session, fresh_keyspace.keyspace, migrations)  # made by hand

        migrate(session, fresh_keyspace, migrations[:-2])
        with pytest.raises(SchemaBehind) as behind:
            require_current_schema(session, fresh_keyspace.keyspace, migrations)
        assert str(behind.value) == (
            f"keyspace {fresh_keyspace.keyspace!r} lacks schema files"
            f" {migrations[-2].label}, {migrations[-1].label} of this release:"
            " run `reminders migrate`"
        )
        assert isinstance(behind.value, STORAGE_ERRORS)  # processes wait, not ready

        migrate(session, fresh_keyspace, migrations)
        require_current_schema(session, fresh_keyspace.keyspace)  # the files shipped


def test_two_migrate_commands_started_at_once_both_succeed_and_apply_each_file_once(
    fresh_keyspace: CassandraSettings,
) -> None:
    env = {"REMINDERS_CASSANDRA_KEYSPACE": fresh_keyspace.keyspace}
    processes = [
        subprocess.Popen(
            [REMINDERS, "migrate"],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=240) for process in processes]

    assert [p.returncode for p in processes] == [0, 0], outputs
    labels = [m.label for m in load_migrations(default_cql_dir())]
    applied_by_each = [
        [line.removeprefix("applied ") for line in out.splitlines() if line.startswith("applied ")]
        for out, _ in outputs
    ]
    assert sorted(applied_by_each[0] + applied_by_each[1]) == sorted(labels)
    assert sorted(_history(fresh_keyspace)) == [int(label[:4]) for label in labels]


def test_a_migrate_waiting_for_the_lock_says_so_and_stops_on_sigterm(
    fresh_keyspace: CassandraSettings,
) -> None:
    """It said nothing while it waited (its log was not configured), and SIGTERM killed it
    where it stood: one killed while holding the lock left the next to wait out the
    lock's TTL, 5 minutes, in silence."""
    with connect(fresh_keyspace, keyspace="") as connection:
        migrate(connection.session, fresh_keyspace, load_migrations(default_cql_dir()))
        connection.session.execute(
            f"INSERT INTO {fresh_keyspace.keyspace}.schema_migration_lock (name, owner)"
            " VALUES ('migrate', 'another-migrator') USING TTL 30"
        )
    env = {**os.environ, "REMINDERS_CASSANDRA_KEYSPACE": fresh_keyspace.keyspace}
    with subprocess.Popen(
        [REMINDERS, "migrate"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as waiting:
        assert waiting.stderr is not None
        said = []  # its log up to the line saying it waits (or all of it, if it never does)
        for line in waiting.stderr:
            said.append(line)
            if "waiting for the schema lock, held by another-migrator" in line:
                break
        else:
            pytest.fail(f"it never said it waits: {said}")
        waiting.send_signal(signal.SIGTERM)
        out, err = waiting.communicate(timeout=30)

    assert waiting.returncode == 143, (out, err)
    assert "reminders migrate: stopped while waiting for the schema lock; run it again" in err


def test_a_new_file_is_applied_and_a_changed_applied_file_is_refused(
    fresh_keyspace: CassandraSettings, tmp_path: Path
) -> None:
    cql = tmp_path / "cql"
    shutil.copytree(default_cql_dir(), cql)
    ks = fresh_keyspace.keyspace
    with connect(fresh_keyspace, keyspace="") as connection:
        migrate(connection.session, fresh_keyspace, load_migrations(cql))
        (cql / "9001_extra.cql").write_text(
            "-- a later issue's table\n"
            "CREATE TABLE IF NOT EXISTS extra (k int PRIMARY KEY, v text);"
        )
        report = migrate(connection.session, fresh_keyspace, load_migrations(cql))
        assert report.applied == ("9001_extra",)

        (cql / "9001_extra.cql").write_text(
            "CREATE TABLE IF NOT EXISTS extra2 (k int PRIMARY KEY);"
        )
        with pytest.raises(MigrationError, match=r"9001_extra\.cql changed after it was applied"):
            migrate(connection.session, fresh_keyspace, load_migrations(cql))
        # A process checks the files too, not their numbers alone (it then failed on the
        # first statement naming what the other file made), and stops: waiting cannot mend.
        with pytest.raises(MigrationError, match=r"9001_extra\.cql changed after it was applied"):
            require_current_schema(connection.session, ks, load_migrations(cql))
        (cql / "9001_extra.cql").rename(cql / "9001_label.cql")
        with pytest.raises(MigrationError, match="9001 was applied as extra, but this release"):
            require_current_schema(connection.session, ks, load_migrations(cql))


def test_an_older_release_serves_on_a_newer_schema_and_its_migrate_applies_nothing(
    fresh_keyspace: CassandraSettings, tmp_path: Path
) -> None:
    """A notifier rolled back (it migrates at its start) crash-looped on a schema one file
    ahead, and the older release's migrate Job failed for an hour of retries: both find
    their own files applied and leave the newer schema as it is."""
    newer = tmp_path / "cql"
    shutil.copytree(default_cql_dir(), newer)
    (newer / "9003_newer.cql").write_text("CREATE TABLE IF NOT EXISTS newer (k int PRIMARY KEY);")
    older = load_migrations(default_cql_dir())
    with connect(fresh_keyspace, keyspace="") as connection:
        migrate(connection.session, fresh_keyspace, load_migrations(newer))
        with pytest.raises(MigrationError, match=r"versions \[9003\] that this release does not"):
            migrate(connection.session, fresh_keyspace, older)
        report = migrate(connection.session, fresh_keyspace, older, ahead_ok=True)
    assert report.applied == ()
    assert report.already_applied == tuple(m.label for m in older)

    command = run_cli("migrate", env=cassandra_env(fresh_keyspace), timeout=120)
    assert command.returncode == 0, command.stderr
    assert "the schema is ahead of this release (versions [9003])" in command.stderr
    assert f"0 applied, {len(older)} already applied" in command.stdout
    assert 9003 in _history(fresh_keyspace)


def test_a_failing_file_is_not_recorded_and_applies_once_fixed(
    fresh_keyspace: CassandraSettings, tmp_path: Path
) -> None:
    cql = tmp_path / "cql"
    shutil.copytree(default_cql_dir(), cql)
    (cql / "9002_broken.cql").write_text(
        "CREATE TABLE IF NOT EXISTS half (k int PRIMARY KEY);\nCREATE TABLE oops (;"
    )
    with connect(fresh_keyspace, keyspace="") as connection:
        with pytest.raises(
            MigrationError, match=r"9002_broken.cql, statement 2 \(CREATE TABLE oops"
        ):
            migrate(connection.session, fresh_keyspace, load_migrations(cql))
        assert 9002 not in _history(fresh_keyspace)

        (cql / "9002_broken.cql").write_text(
            "CREATE TABLE IF NOT EXISTS half (k int PRIMARY KEY);\n"
            "CREATE TABLE IF NOT EXISTS whole (k int PRIMARY KEY);"
        )
        report = migrate(connection.session, fresh_keyspace, load_migrations(cql))
    assert report.applied == ("9002_broken",)


@pytest.mark.parametrize(
    "release_error",
    [
        OperationTimedOut("injected"),
        NoHostAvailable("injected", {}),
        ConnectionException("injected"),
    ],
    ids=["timeout", "no-host", "broken-connection"],
)
def test_a_failing_file_is_the_error_told_when_the_lock_cannot_be_released_either(
    fresh_keyspace: CassandraSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    release_error: Exception,
) -> None:
    """Storage gone mid-run: the release's failure hid the statement's error."""
    cql = tmp_path / "cql"
    shutil.copytree(default_cql_dir(), cql)
    (cql / "9003_broken.cql").write_text("CREATE TABLE oops (;")

    def unreleasable(self: object) -> None:
        raise release_error

    monkeypatch.setattr(migrations._Lock, "release", unreleasable)
    with (
        connect(fresh_keyspace, keyspace="") as connection,
        pytest.raises(MigrationError, match=r"9003_broken.cql, statement 1"),
    ):
        migrate(connection.session, fresh_keyspace, load_migrations(cql))


def test_the_migrate_command_tells_storage_refusals_in_one_line(
    fresh_keyspace: CassandraSettings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CREATE grant missing (Deploy step 4): a traceback until 2026-12-07."""

    def refused(*args: object, **kwargs: object) -> None:
        raise Unauthorized("User reminders has no CREATE permission on <all keyspaces>")

    monkeypatch.setattr(migrate_cli, "migrate", refused)
    for name, value in cassandra_env(fresh_keyspace).items():
        monkeypatch.setenv(name, value)

    assert main(["migrate"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "reminders migrate: storage: Unauthorized:"
        " User reminders has no CREATE permission on <all keyspaces>\n"
    )


def test_migrate_command_reports_an_unreachable_cluster_clearly() -> None:
    port = free_port()
    result = run_cli("migrate", env={"REMINDERS_CASSANDRA_PORT": str(port)}, timeout=60)

    assert result.returncode == 1
    assert f"cannot reach Cassandra at 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_split_statements_keeps_quoted_semicolons_and_drops_comments() -> None:
    text = (
        "-- header; with a semicolon\n"
        "CREATE TABLE a (k int PRIMARY KEY) WITH comment = 'x; y';\n"
        "// another comment\n"
        "INSERT INTO a (k) VALUES (1);\n\n"
    )
    assert split_statements(text) == (
        "CREATE TABLE a (k int PRIMARY KEY) WITH comment = 'x; y'",
        "INSERT INTO a (k) VALUES (1)",
    )


def test_schema_file_names_are_checked(tmp_path: Path) -> None:
    (tmp_path / "1_Initial.cql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"NNNN_lowercase_name\.cql"):
        load_migrations(tmp_path)


def test_tables_written_only_with_ttls_keep_expired_cells_hours_not_days(
    migrated_settings: CassandraSettings,
) -> None:
    """Their expired cells are tombstones every read scans until gc_grace: the heartbeats of
    every dispatcher that ever restarted would pile up in the one partition all read."""
    with connect(migrated_settings, keyspace="") as connection:
        rows = connection.session.execute(
            "SELECT table_name, gc_grace_seconds FROM system_schema.tables"
            " WHERE keyspace_name = %s",
            (migrated_settings.keyspace,),
        )
        gc_grace = {row.table_name: row.gc_grace_seconds for row in rows}
    assert gc_grace["dispatcher_members"] == gc_grace["due_buckets"] == 3 * 3600


def test_migrate_warns_of_a_keyspace_replicated_other_than_asked_or_by_one_replica(
    fresh_keyspace: CassandraSettings,
) -> None:
    """The replication setting applies only when the keyspace is made: a first run without
    it made one replica (SimpleStrategy:1), and a later run with the production setting
    said nothing and changed nothing."""
    env = {**os.environ, "REMINDERS_CASSANDRA_KEYSPACE": fresh_keyspace.keyspace}
    env.pop("REMINDERS_ENV", None)
    env.pop("REMINDERS_CASSANDRA_REPLICATION", None)

    def migrate_with(**more: str) -> subprocess.CompletedProcess[str]:
        command = [REMINDERS, "migrate"]
        return subprocess.run(command, env={**env, **more}, capture_output=True, text=True)

    first = migrate_with()
    again = migrate_with(REMINDERS_CASSANDRA_REPLICATION="NetworkTopologyStrategy:datacenter1=3")
    in_dev = migrate_with(REMINDERS_ENV="dev")

    assert (first.returncode, again.returncode, in_dev.returncode) == (0, 0, 0)
    assert "uses SimpleStrategy outside REMINDERS_ENV=dev" in first.stderr
    assert "not as REMINDERS_CASSANDRA_REPLICATION says" not in first.stderr
    assert (
        f"ALTER KEYSPACE {fresh_keyspace.keyspace} WITH replication = "
        "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}"
    ) in again.stderr
    assert "warning" not in in_dev.stderr


def test_the_schema_is_read_at_the_serial_level_the_settings_name(
    fresh_keyspace: CassandraSettings,
) -> None:
    """It was always SERIAL: with LOCAL_SERIAL configured (a data centre may be lost), the
    read every process makes at its start failed with one gone, and every pod restarting
    in the others waited NOT_SERVING."""
    local = dataclasses.replace(fresh_keyspace, serial_consistency="LOCAL_SERIAL")
    levels: list[int] = []

    def seen(future: ResponseFuture) -> None:
        if "schema_migrations" in str(getattr(future.query, "query_string", "")):
            levels.append(future.query.consistency_level)

    with connect(local, keyspace="") as connection:
        migrate(connection.session, local, load_migrations(default_cql_dir()))
        connection.session.add_request_init_listener(seen)
        require_current_schema(connection.session, local.keyspace)

    assert levels
    assert set(levels) == {ConsistencyLevel.LOCAL_SERIAL}
