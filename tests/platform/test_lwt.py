"""Lightweight transactions round-trip on the real node (Paxos v2), as the design relies on."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from cassandra import ConsistencyLevel
from cassandra.query import SimpleStatement

from reminders_svc.config import CassandraSettings, SerialConsistencyName
from reminders_svc.storage import aio
from reminders_svc.storage.session import (
    CassandraConnection,
    cassandra_duration_s,
    connect,
    serial_read_level,
)


def test_insert_if_not_exists_applies_once_and_reports_the_existing_row(
    cassandra: CassandraConnection,
) -> None:
    session = cassandra.session
    user, reminder = f"u-{uuid.uuid4()}", uuid.uuid4()
    insert = (
        "INSERT INTO reminders (user_id, reminder_id, status, version) VALUES (%s, %s, %s, %s)"
        " IF NOT EXISTS"
    )

    first = session.execute(insert, (user, reminder, "pending", 1)).one()
    second = session.execute(insert, (user, reminder, "paused", 7)).one()

    assert first.applied is True
    assert second.applied is False
    assert (second.status, second.version) == ("pending", 1)


def test_conditional_update_applies_only_when_the_condition_holds(
    cassandra: CassandraConnection,
) -> None:
    session = cassandra.session
    user, reminder = f"u-{uuid.uuid4()}", uuid.uuid4()
    session.execute(
        "INSERT INTO reminders (user_id, reminder_id, status, version)"
        " VALUES (%s, %s, 'pending', 1) IF NOT EXISTS",
        (user, reminder),
    )
    claim = (
        "UPDATE reminders SET status = 'sending', claim_token = %s"
        " WHERE user_id = %s AND reminder_id = %s IF status = 'pending' AND version = %s"
    )

    stale = session.execute(claim, (uuid.uuid4(), user, reminder, 2)).one()
    token = uuid.uuid4()
    won = session.execute(claim, (token, user, reminder, 1)).one()
    lost = session.execute(claim, (uuid.uuid4(), user, reminder, 1)).one()

    assert (stale.applied, stale.status, stale.version) == (False, "pending", 1)
    assert won.applied is True
    assert (lost.applied, lost.status) == (False, "sending")
    row = session.execute(
        SimpleStatement(
            "SELECT status, claim_token FROM reminders WHERE user_id = %s AND reminder_id = %s",
            consistency_level=ConsistencyLevel.SERIAL,
        ),
        (user, reminder),
    ).one()
    assert (row.status, row.claim_token) == ("sending", token)


def test_the_default_profile_uses_the_configured_consistency(
    cassandra: CassandraConnection,
) -> None:
    profile = cassandra.cluster.profile_manager.default
    assert profile.consistency_level == ConsistencyLevel.LOCAL_QUORUM
    assert profile.serial_consistency_level == ConsistencyLevel.SERIAL


@pytest.mark.parametrize("level", ["SERIAL", "LOCAL_SERIAL"])
def test_reads_that_settle_lwts_use_the_serial_level_the_lwts_are_written_at(
    migrated_settings: CassandraSettings, level: SerialConsistencyName
) -> None:
    with connect(dataclasses.replace(migrated_settings, serial_consistency=level)) as connection:
        assert serial_read_level(connection.session) == ConsistencyLevel.name_to_value[level]


def test_a_sessions_cas_bound_is_the_clusters_as_its_node_reports_it(
    cassandra: CassandraConnection,
) -> None:
    """How long an unheard LWT's settling read waits (`aio.or_settled`): the node's CAS
    contention timeout plus its write timeout (on the development node, 5 s + 10 s)."""
    reported = {
        row.name: row.value
        for row in cassandra.session.execute(
            "SELECT name, value FROM system_views.settings"
            " WHERE name IN ('cas_contention_timeout', 'write_request_timeout')"
        )
    }
    expected = sum(cassandra_duration_s(value) for value in reported.values())

    assert len(reported) == 2
    assert aio.cas_bound_s(cassandra.session) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("5000ms", 5.0), ("10s", 10.0), ("2000", 2.0), ("1m", 60.0), ("1.5s", 1.5), ("800us", 8e-4)],
)
def test_cassandra_durations_read_with_their_unit(value: str, seconds: float) -> None:
    assert cassandra_duration_s(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "ten seconds", "5 fortnights", "-1s"])
def test_a_duration_not_understood_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        cassandra_duration_s(value)
