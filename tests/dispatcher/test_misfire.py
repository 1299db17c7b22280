"""The misfire policy end to end (DESIGN.md invariant 9): after an outage a repeat rings
once, for its latest missed occurrence, then continues in the future.

The outage is simulated as the suite does elsewhere: a row whose due (its oldest missed
occurrence) passed two hours ago, with its bucket entry in that minute, and its part's
checkpoint rewound to before it; then a dispatcher starts and catches up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.parts import floor_minute, part_of
from tests.dispatcher.stack import PARTS, Stack, move_due, new_user, running_stack

NEW_YORK = ZoneInfo("America/New_York")
HOUR = timedelta(hours=1)


@pytest.fixture
def stack(cassandra_settings: CassandraSettings, request: pytest.FixtureRequest) -> Iterator[Stack]:
    # No dispatcher: each test starts it after its outage.
    with running_stack(cassandra_settings, request=request) as running:
        yield running


def test_after_an_outage_a_repeat_rings_once_for_its_latest_missed_occurrence(
    stack: Stack,
) -> None:
    user = new_user()
    # Hourly at a whole minute in New York; its latest occurrence passed 2 minutes ago.
    latest = floor_minute(datetime.now(UTC)) - timedelta(minutes=2)
    oldest = latest - 2 * HOUR
    start_local = oldest.astimezone(NEW_YORK).strftime("%Y-%m-%dT%H:%M:00")
    created = stack.create_repeat(user, start_local, "FREQ=HOURLY", "America/New_York")
    assert created.next_ring_time.ToDatetime(tzinfo=UTC) == latest + HOUR
    # The outage: the row still waits for its oldest occurrence (three missed: oldest,
    # oldest + 1 h, latest), and its part was checkpointed before it.
    move_due(stack, user, created.id, oldest)
    stack.db.session.execute(
        "INSERT INTO dispatch_parts (part, epoch, checkpoint) VALUES (%s, 1, %s)",
        (part_of(user, PARTS), floor_minute(oldest) - timedelta(minutes=1)),
    )

    stack.start_dispatcher("after-outage", REMINDERS_DISPATCH_CATCH_UP_MINUTES_PER_S="1000")

    pushes = stack.wait_for_pushes(1, user, created.id, timeout_s=40)
    time.sleep(2)  # would another missed occurrence ring?
    assert len(stack.pushes(user, created.id)) == 1
    assert pushes[0].idempotency_key == f"{created.id}/{latest:%Y-%m-%dT%H:%M:%S.%fZ}"
    stack.wait_status(user, created.id, "pending")  # finalized, so its history recorded
    history = stack.deliveries(user, created.id)
    assert [(d.due_time.ToDatetime(tzinfo=UTC), d.late) for d in history] == [(latest, True)]
    # The lateness recorded is the latest occurrence's (minutes), not the oldest's (hours).
    assert timedelta(minutes=2) <= history[0].lateness.ToTimedelta() < timedelta(minutes=10)
    # Then the series continues in the future.
    row = stack.wait_status(user, created.id, "pending")
    assert row.due.replace(tzinfo=UTC) == latest + HOUR  # type: ignore[attr-defined]
