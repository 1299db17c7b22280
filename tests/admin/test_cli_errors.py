"""`reminders admin` refuses bad arguments and reports storage trouble in one line: exit 2
for a request refused, 1 for storage or configuration trouble, never a traceback."""

from __future__ import annotations

import pytest

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.migrations import default_cql_dir, load_migrations, migrate
from reminders_svc.storage.session import connect
from tests.admin.conftest import AdminRunner, admin_runner

_COUNT = "want a whole number, at least"
_OUT_OF_RANGE = "argument --"  # a value out of range: a usage error, not a traceback


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
        (("inspect", "--minute", "0001-01-01T00:00+01:00"), _OUT_OF_RANGE),
        (
            ("replay", "--from", "9999-12-31T23:59-01:00", "--to", "9999-12-31T23:59Z"),
            _OUT_OF_RANGE,
        ),
    ],
)
def test_a_value_that_means_nothing_is_a_usage_error(
    admin: AdminRunner, argv: tuple[str, ...], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as usage:
        admin(*argv)
    assert usage.value.code == 2
    assert said in capsys.readouterr().err


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
