"""Parts are a stable hash of the user id: the same in every process, machine and release."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from reminders_svc.storage.parts import (
    MAX_TTL_S,
    NO_EXPIRY,
    bucket_minute,
    entry_ttl,
    floor_minute,
    part_of,
)


@pytest.mark.parametrize(
    ("user", "parts", "expected"),
    [
        ("alice", 64, 9),
        ("bob", 64, 18),
        ("user-0001", 64, 40),
        ("user-0001", 128, 104),
        ("8f14e45f-ceea-467a-9575-6b3fb5c3b6a5", 1024, 647),
    ],
)
def test_known_users_land_in_pinned_parts(user: str, parts: int, expected: int) -> None:
    assert part_of(user, parts) == expected


def test_another_process_with_another_hash_seed_agrees() -> None:
    code = "from reminders_svc.storage.parts import part_of; print(part_of('alice', 64))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "9"


def test_entries_never_go_into_a_minute_already_past() -> None:
    now = datetime(2026, 10, 26, 13, 0, 42, tzinfo=UTC)
    assert bucket_minute(now + timedelta(minutes=3), now) == datetime(
        2026, 10, 26, 13, 3, tzinfo=UTC
    )
    assert bucket_minute(now - timedelta(hours=2), now) == floor_minute(now)


def test_an_entry_lives_until_its_due_plus_the_retention() -> None:
    now = datetime(2026, 10, 26, 13, 0, tzinfo=UTC)
    assert entry_ttl(now + timedelta(hours=1), now, timedelta(days=7)) == 3600 + 7 * 86400
    assert entry_ttl(now - timedelta(hours=1), now, timedelta(days=7)) == 7 * 86400


def test_an_entry_due_beyond_the_longest_ttl_never_expires_rather_than_expire_early() -> None:
    # A repeat's next ring 20 years on (Feb 29 on a Tuesday, Sunday or Friday: 2036,
    # then 2056): any TTL Cassandra accepts would drop the entry before its due.
    now = datetime(2036, 2, 29, 9, 0, tzinfo=UTC)
    due = datetime(2056, 2, 29, 9, 0, tzinfo=UTC)
    assert entry_ttl(due, now, timedelta(days=7)) == NO_EXPIRY
    assert entry_ttl(now + timedelta(days=3650), now, timedelta(days=7)) < MAX_TTL_S
