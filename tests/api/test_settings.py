"""API settings read at startup: a write deadline that breaks DESIGN.md invariant 3 is refused."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dispatcher.settings import DispatcherSettings
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import ConfigError

DEFAULT_GRACE_S = DispatcherSettings.grace.total_seconds()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REMINDERS_API_WRITE_DEADLINE_S": "0"}, "above 0"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": "-5"}, "above 0"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": "nan"}, "expected a number"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": "inf"}, "expected a number"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": f"{DEFAULT_GRACE_S:g}"}, "grace G"),
        ({"REMINDERS_API_WRITE_DEADLINE_S": f"{DEFAULT_GRACE_S + 1:g}"}, "grace G"),
        # G is what the dispatcher reads from the same environment, not a copy of its default.
        (
            {"REMINDERS_API_WRITE_DEADLINE_S": "10", "REMINDERS_DISPATCH_GRACE_S": "10"},
            "grace G \\(10 s\\)",
        ),
    ],
    ids=["zero", "negative", "nan", "inf", "equal-to-g", "above-g", "above-configured-g"],
)
def test_a_write_deadline_not_between_0_and_the_dispatchers_grace_is_refused(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=f"REMINDERS_API_WRITE_DEADLINE_S.*{message}"):
        ApiSettings.from_env(env)


def test_a_write_deadline_below_the_dispatchers_grace_is_accepted() -> None:
    assert ApiSettings.from_env({}).write_deadline < DispatcherSettings.grace
    settings = ApiSettings.from_env(
        {"REMINDERS_API_WRITE_DEADLINE_S": "29.5", "REMINDERS_DISPATCH_GRACE_S": "30"}
    )
    assert settings.write_deadline == timedelta(seconds=29.5)
