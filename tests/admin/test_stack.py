"""Admin commands against the whole service as processes (API, notifier, a dispatcher;
P = 4, fast timings): what a replay re-arms rings once, and growing P loses no ring."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from reminders_svc.admin.parts import MIN_LEAD_ENV, ceil_minute
from reminders_svc.config import CassandraSettings
from reminders_svc.storage.parts import part_of
from tests.admin.conftest import admin_runner, at_instant, put, run, store_of, whole_minute
from tests.dispatcher.stack import Stack, caught_up, running_stack


@pytest.fixture
def stack(cassandra_settings: CassandraSettings, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with running_stack(cassandra_settings, "d", request=request) as running:
        yield running


def rings_per_reminder(stack: Stack) -> Counter[str]:
    return Counter(push.idempotency_key.split("/")[0] for push in stack.pushes())


def test_a_replayed_minute_rings_what_was_missed_once_and_only_once(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = admin_runner(stack.settings, monkeypatch, capsys)
    # A ring whose only entry sits three hours back, long before any checkpoint or the
    # dispatcher's look-back: as after an outage longer than promised, or a lost minute.
    minute = (datetime.now(UTC) - timedelta(hours=3)).replace(second=0, microsecond=0)
    lost = run(
        put(store_of(stack.db), at_instant("user-lost", minute + timedelta(seconds=20), minute))
    )
    reminder_id = str(lost.reminder.reminder_id)
    # Every minute from the look-back on worked, and the entry was not among them.
    caught_up(stack)
    assert rings_per_reminder(stack)[reminder_id] == 0

    span = ("--from", whole_minute(minute), "--to", whole_minute(minute))
    assert admin("replay", *span, "--json").json()["outcomes"] == {"re_armed": 1}
    assert len(stack.wait_for_pushes(1, "user-lost", reminder_id)) == 1
    assert stack.wait_status("user-lost", reminder_id, "done").status == "done"  # type: ignore[attr-defined]

    # Again: the row says it is done, so nothing is re-armed and nothing rings twice.
    assert admin("replay", *span, "--json").json()["outcomes"] == {"done": 1}
    time.sleep(4)
    assert rings_per_reminder(stack)[reminder_id] == 1
    assert stack.notifier_answers().get("duplicate", 0) == 0  # nor handed off twice


def users_in_every_part(parts: int, per_part: int) -> list[str]:
    chosen: dict[int, list[str]] = {part: [] for part in range(parts)}
    index = 0
    while any(len(users) < per_part for users in chosen.values()):
        user = f"grow-user-{index}"
        if len(chosen[part_of(user, parts)]) < per_part:
            chosen[part_of(user, parts)].append(user)
        index += 1
    return [user for users in chosen.values() for user in users]


def sleep_until(instant: datetime) -> None:
    time.sleep(max(0.0, (instant - datetime.now(UTC)).total_seconds()))


@pytest.mark.slow
def test_growing_parts_loses_no_ring(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = admin_runner(stack.settings, monkeypatch, capsys)
    monkeypatch.setenv(MIN_LEAD_ENV, "30")  # test-only: the real floor is 2 minutes
    users = users_in_every_part(8, 2)
    second = timedelta(seconds=1)
    effective = ceil_minute(datetime.now(UTC) + 50 * second)

    # Due after the change, written before it (the API reads P = 4, caches it 30 s):
    # their entries go into parts under P = 4.
    ids = [stack.create_at(user, effective + 4 * second).id for user in users]
    # The grow takes the first whole minute at least `lead` from its own start: up to 15 s
    # short of `effective` (above the 30 s floor) lands there however slowly the command
    # connects on a busy machine (1 s short did not).
    lead = max(30.5, (effective - datetime.now(UTC)).total_seconds() - 15)
    grown = admin("parts", "grow", "--to", "8", "--effective-in", f"{lead:.1f}", "--json").json()
    assert datetime.fromisoformat(grown["effective_minute"]) == effective
    assert grown["seeded_parts"] == [4, 5, 6, 7]

    # Written once every cache has the new P (its 30 s refresh has passed): due before
    # the change (P = 4 for that minute) and after it (P = 8, new parts included).
    sleep_until(effective - 10 * second)
    ids += [stack.create_at(user, effective - 5 * second).id for user in users]
    ids += [stack.create_at(user, effective + 7 * second).id for user in users]

    pushes = stack.wait_for_pushes(len(ids), timeout_s=60)
    time.sleep(3)  # a second push of anything would show by now
    assert rings_per_reminder(stack) == Counter(dict.fromkeys(ids, 1))
    assert stack.notifier_answers().get("duplicate", 0) == 0  # nor a second hand-off
    lateness = [
        (push.push_time.ToDatetime() - push.due_time.ToDatetime()).total_seconds()
        for push in pushes
    ]
    with capsys.disabled():
        print(
            f"\nlateness after growing P: min {min(lateness):.2f} s, max {max(lateness):.2f} s"
            f" over {len(lateness)} rings"
        )
    assert min(lateness) >= 0  # none early: each handed off at its due, not when read
    assert max(lateness) < 10  # the new parts start at the effective minute, not behind it

    new_part_entries = sum(
        len(
            list(
                stack.db.session.execute(
                    "SELECT reminder_id FROM due_buckets WHERE minute = %s AND part = %s",
                    (effective, part),
                )
            )
        )
        for part in range(4, 8)
    )
    assert new_part_entries == len(users) // 2  # only the late writes of users in parts 4..7
    owners = {item["part"]: item["owner"] for item in admin("parts", "--json").json()["parts"]}
    assert owners == dict.fromkeys(range(8), "d")
