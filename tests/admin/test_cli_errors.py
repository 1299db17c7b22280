"""`reminders admin` refuses bad arguments and reports storage trouble in one line: exit 2
for a request refused, 1 for storage or configuration trouble, never a traceback."""

from __future__ import annotations

import pytest

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.migrations import default_cql_dir, load_migrations, migrate
from reminders_svc.storage.session import connect
from tests.admin.conftest import AdminRunner, admin_runner

_COUNT = "want a whole number from"
_RATE = "want a number from 0.01 to 1e+06"
_OUT_OF_RANGE = "argument --"  # a value out of range: a usage error, not a traceback
# A node nobody listens on: what is refused before connecting is refused all the same.
_NOWHERE = CassandraSettings(contact_points=("127.0.0.1",), port=1, keyspace="nowhere")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("replan", "--zone", "UTC", "--splits", "0"), _COUNT),
        (("replan", "--zone", "UTC", "--splits", "-1"), _COUNT),
        (("replan", "--zone", "UTC", "--parallel", "0"), _COUNT),
        (("inspect", "--minute", "2026-10-26T13:00Z", "--limit", "-1"), _COUNT),
        (("inspect", "--minute", "2026-10-26T13:00Z", "--part", "-3"), _COUNT),
        (("inspect", "--minute", "2026-10-26T13:00Z", "--limit", "many"), _COUNT),
        (("parts", "grow", "--to", "128", "--effective-in", "1e300"), _OUT_OF_RANGE),
        # A typo of a year would hold P where it is for that year: a day at most.
        (("parts", "grow", "--to", "128", "--effective-in", "31536000"), "0 to 86400"),
        (("parts", "grow", "--to", "128", "--effective-in", "1e12"), "0 to 86400"),
        # Seeded one LWT a part, read by every dispatcher every minute, forced or not.
        (("parts", "grow", "--to", "2147483648", "--force"), "from 1 to 65536"),
        (("parts", "grow", "--to", "0"), "from 1 to 65536"),
        (("inspect", "--minute", "2026-10-26T13:00Z", "--part", "2147483648"), _COUNT),
        # Pacing off (inf), a stall (1e-320 a second), or none at all.
        (
            (
                "replay",
                "--from",
                "2026-10-26T13:00Z",
                "--to",
                "2026-10-26T13:00Z",
                "--ops-per-s",
                "inf",
            ),
            _RATE,
        ),
        (("replan", "--zone", "UTC", "--rows-per-s", "1e-320"), _RATE),
        (("replan", "--zone", "UTC", "--writes-per-s", "nan"), _RATE),
        (("replan", "--zone", "UTC", "--writes-per-s", "fast"), _RATE),
        # A list of 10^8 ranges before the first read.
        (("replan", "--zone", "UTC", "--splits", "100000000"), _COUNT),
        (("replan", "--zone", "UTC", "--parallel", "100000"), _COUNT),
        (("inspect", "--minute", "0001-01-01T00:00+01:00"), _OUT_OF_RANGE),
        (
            ("replay", "--from", "9999-12-31T23:59-01:00", "--to", "9999-12-31T23:59Z"),
            _OUT_OF_RANGE,
        ),
    ],
)
def test_a_value_that_means_nothing_is_a_usage_error(
    argv: tuple[str, ...],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Refused as the arguments are read, before any connection: no keyspace needed.
    with pytest.raises(SystemExit) as usage:
        admin_runner(_NOWHERE, monkeypatch, capsys)(*argv)
    assert usage.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ("replay", "--from", "2026-10-26T13:05Z", "--to", "2026-10-26T13:00Z"),
            "--to 2026-10-26T13:00:00.000Z is before --from 2026-10-26T13:05:00.000Z",
        ),
        (
            ("parts", "grow", "--to", "128", "--effective-in", "60"),
            "--effective-in 60s is under the minimum 120s",
        ),
    ],
)
def test_a_request_refused_whatever_is_stored_is_refused_without_the_database(
    argv: tuple[str, ...],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused before connecting: with Cassandra unreachable it was "cannot reach" (exit 1),
    which sends an operator to the cluster for a typo."""
    refused = admin_runner(_NOWHERE, monkeypatch, capsys)(*argv)
    assert refused.code == 2, refused.err
    assert said in refused.err


def test_an_unknown_zone_is_a_request_refused(admin: AdminRunner) -> None:
    refused = admin("replan", "--zone", "Mars/Olympus_Mons", "--dry-run")
    assert refused.code == 2
    assert "Mars/Olympus_Mons" in refused.err
    assert "Traceback" not in refused.err


def test_storage_trouble_after_connecting_is_one_line(
    fresh_keyspace: CassandraSettings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A keyspace missing one of its tables (dropped by hand): the driver's error, named,
    on one line, where a traceback was."""
    with connect(fresh_keyspace, keyspace="") as connection:
        migrate(connection.session, fresh_keyspace, load_migrations(default_cql_dir()))
        connection.session.execute(f"DROP TABLE {fresh_keyspace.keyspace}.part_counts")
    outcome = admin_runner(fresh_keyspace, monkeypatch, capsys)("parts")
    assert outcome.code == 1
    assert outcome.err.startswith("reminders admin parts: storage: InvalidRequest: ")
    assert "part_counts" in outcome.err
    assert len(outcome.err.strip().splitlines()) == 1


def test_a_keyspace_behind_the_release_is_named_in_one_line(
    fresh_keyspace: CassandraSettings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    migrations = load_migrations(default_cql_dir())
    with connect(fresh_keyspace, keyspace="") as connection:
        migrate(connection.session, fresh_keyspace, migrations[:-1])
    outcome = admin_runner(fresh_keyspace, monkeypatch, capsys)("parts")
    assert outcome.code == 1
    assert outcome.err == (
        f"reminders admin parts: keyspace {fresh_keyspace.keyspace!r} lacks schema files"
        f" {migrations[-1].label} of this release: run `reminders migrate`\n"
    )


def test_a_keyspace_migrated_from_other_files_is_named_in_one_line(
    fresh_keyspace: CassandraSettings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A schema file applied as another build shipped it: a traceback until 2026-12-07."""
    migrations = load_migrations(default_cql_dir())
    with connect(fresh_keyspace, keyspace="") as connection:
        migrate(connection.session, fresh_keyspace, migrations)
        connection.session.execute(
            f"UPDATE {fresh_keyspace.keyspace}.schema_migrations SET checksum = 'another'"
            " WHERE version = %s",
            (migrations[-1].version,),
        )
    outcome = admin_runner(fresh_keyspace, monkeypatch, capsys)("parts")
    assert outcome.code == 1
    assert outcome.err.startswith("reminders admin parts: "), outcome.err
    assert migrations[-1].label in outcome.err
    assert len(outcome.err.strip().splitlines()) == 1
