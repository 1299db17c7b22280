"""API settings read at startup: a write deadline that breaks DESIGN.md invariant 3 is refused."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import ConfigError, MinuteTiming

LONGEST_WRITE_S = MinuteTiming().longest_write.total_seconds()  # G 20 s - skew 5 s


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REMINDERS_API_WRITE_DEADLINE_S": "0"}, "above 0"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": "-5"}, "expected 0 to 3600 s"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": "nan"}, "expected a number"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": "inf"}, "expected a number"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": f"{LONGEST_WRITE_S:g}"}, "grace G"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": f"{LONGEST_WRITE_S + 1:g}"}, "grace G"),
        # G and the skew are what the dispatcher reads from the same environment.
        (
            {"REMINDERS_API_WRITE_DEADLINE_S": "8", "REMINDERS_DISPATCH_GRACE_S": "12"},
            "grace G \\(12 s\\) minus its clock-skew allowance \\(5 s\\)",
        ),
        (
            {"REMINDERS_API_WRITE_DEADLINE_S": "10", "REMINDERS_DISPATCH_SKEW_S": "10"},
            "clock-skew allowance \\(10 s\\)",
        ),
    ],
    ids=[
        "zero",
        "negative",
        "nan",
        "inf",
        "equal-to-g-minus-skew",
        "above-g-minus-skew",
        "above-configured-g",
        "above-configured-skew",
    ],
)
def test_a_write_deadline_not_between_0_and_the_dispatchers_grace_minus_skew_is_refused(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=f"REMINDERS_API_WRITE_DEADLINE_S.*{message}"):
        ApiSettings.from_env(env)


def test_a_write_deadline_below_the_dispatchers_grace_minus_skew_is_accepted() -> None:
    assert ApiSettings.from_env({}).write_deadline < MinuteTiming().longest_write
    settings = ApiSettings.from_env(
        {"REMINDERS_API_WRITE_DEADLINE_S": "24.5", "REMINDERS_DISPATCH_GRACE_S": "30"}
    )
    assert settings.write_deadline == timedelta(seconds=24.5)


@pytest.mark.parametrize(
    ("env", "accepted"),
    [
        ({"REMINDERS_API_SHUTDOWN_GRACE_S": "9"}, False),
        ({"REMINDERS_API_SHUTDOWN_GRACE_S": "0"}, False),
        ({"REMINDERS_API_SHUTDOWN_GRACE_S": "10"}, True),
        ({"REMINDERS_API_SHUTDOWN_GRACE_S": "5", "REMINDERS_API_WRITE_DEADLINE_S": "5"}, True),
    ],
    ids=["below-the-deadline", "zero", "the-deadline", "both-shorter"],
)
def test_a_shutdown_grace_shorter_than_the_write_deadline_is_refused(
    env: dict[str, str], accepted: bool
) -> None:
    """A call cut by the stop mid-write answers UNAVAILABLE, which the contract calls safe
    to retry, though its change may have landed (a snooze then moved the ring twice)."""
    if accepted:
        assert ApiSettings.from_env(env).shutdown_grace.total_seconds() >= 5
    else:
        with pytest.raises(ConfigError, match=r"REMINDERS_API_SHUTDOWN_GRACE_S=.*at least"):
            ApiSettings.from_env(env)


@pytest.mark.parametrize(
    ("days", "message"),
    [
        ("0", "expected 1 to 30 days"),  # TTL 0: the records would never expire
        ("0.5", "expected 1 to 30 days"),
        ("-1", "expected 1 to 30 days"),
        ("31", "expected 1 to 30 days"),  # outlives a deleted row: a replay re-creates it
        ("1e12", "expected 1 to 30 days"),  # too large for a timedelta
        ("nan", "expected a number"),
    ],
    ids=["zero", "half-a-day", "negative", "past-the-deleted-row", "huge", "nan"],
)
def test_an_idempotency_retention_outside_1_day_to_a_deleted_rows_lifetime_is_refused(
    days: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=f"REMINDERS_IDEMPOTENCY_RETENTION_DAYS.*{message}"):
        ApiSettings.from_env({"REMINDERS_IDEMPOTENCY_RETENTION_DAYS": days})


@pytest.mark.parametrize("days", ["1", "7", "30"])
def test_an_idempotency_retention_up_to_a_deleted_rows_lifetime_is_accepted(days: str) -> None:
    settings = ApiSettings.from_env({"REMINDERS_IDEMPOTENCY_RETENTION_DAYS": days})
    assert settings.retention.idempotency == timedelta(days=int(days))
    assert settings.retention.idempotency <= settings.retention.tombstone


def test_the_shortest_snooze_is_a_minute_unless_configured() -> None:
    assert ApiSettings.from_env({}).limits.min_snooze == timedelta(minutes=1)
    assert ApiSettings.from_env({}).limits.snooze_range == "1 minute to 7 days"
    lowered = ApiSettings.from_env({"REMINDERS_API_MIN_SNOOZE_S": "5"}).limits
    assert lowered.min_snooze == timedelta(seconds=5)
    assert lowered.snooze_range == "5 seconds to 7 days"


@pytest.mark.parametrize("seconds", ["0", "-5", "3601", "inf", "soon"])
def test_a_shortest_snooze_outside_1_s_to_an_hour_is_refused(seconds: str) -> None:
    with pytest.raises(ConfigError, match="REMINDERS_API_MIN_SNOOZE_S"):
        ApiSettings.from_env({"REMINDERS_API_MIN_SNOOZE_S": seconds})
