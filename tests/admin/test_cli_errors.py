"""`reminders admin` refuses bad arguments and reports storage trouble in one line: exit 2
for a request refused, 1 for storage or configuration trouble, never a traceback."""

from __future__ import annotations

import dataclasses

import pytest

from reminders_svc.storage.session import CassandraConnection
from tests.admin.conftest import AdminRunner, admin_runner


@pytest.mark.parametrize(
    "argv",
    [
        ("replan", "--zone", "UTC", "--splits", "0"),
        ("replan", "--zone", "UTC", "--splits", "-1"),
        ("replan", "--zone", "UTC", "--parallel", "0"),
        ("inspect", "--minute", "2026-10-26T13:00Z", "--limit", "-1"),
        ("inspect", "--minute", "2026-10-26T13:00Z", "--part", "-3"),
        ("inspect", "--minute", "2026-10-26T13:00Z", "--limit", "many"),
    ],
)
def test_a_count_that_means_nothing_is_a_usage_error(
    admin: AdminRunner, argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as usage:
        admin(*argv)
    assert usage.value.code == 2
    assert "want a whole number, at least" in capsys.readouterr().err


def test_an_unknown_zone_is_a_request_refused(admin: AdminRunner) -> None:
    refused = admin("replan", "--zone", "Mars/Olympus_Mons", "--dry-run")
    assert refused.code == 2
    assert "Mars/Olympus_Mons" in refused.err
    assert "Traceback" not in refused.err


def test_a_keyspace_without_the_schema_is_storage_trouble_in_one_line(
    own_keyspace: CassandraConnection,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A keyspace that exists but holds none of the tables (a wrong
    REMINDERS_CASSANDRA_KEYSPACE): the driver's error, named, on one line."""
    wrong = dataclasses.replace(own_keyspace.settings, keyspace="system_auth")
    outcome = admin_runner(wrong, monkeypatch, capsys)("parts")
    assert outcome.code == 1
    assert outcome.err.startswith("reminders admin parts: storage: InvalidRequest: ")
    assert "schema_migrations" in outcome.err
    assert len(outcome.err.strip().splitlines()) == 1
