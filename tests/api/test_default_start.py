"""At the API's boundary: a repeat sent without `start_local_time` counts an INTERVAL
from its first matching period (tests/schedule/test_default_start.py has the rule)."""

from __future__ import annotations

from datetime import UTC, datetime

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.api.convert import schedule_from_proto
from reminders_svc.schedule import validate_new

SUNDAY = datetime(2026, 12, 13, 15, 0, tzinfo=UTC)


def first_ring(repeat: pb.Repeat) -> datetime:
    message = pb.Schedule(time_zone="America/New_York", repeat=repeat)
    return validate_new(schedule_from_proto(message, SUNDAY, "reminder.schedule"), SUNDAY)


def test_every_2_weeks_made_on_a_sunday_rings_on_the_monday_after() -> None:
    assert first_ring(pb.Repeat(expression="every 2 weeks on Mon 09:00")) == datetime(
        2026, 12, 14, 14, 0, tzinfo=UTC
    )
    assert first_ring(pb.Repeat(rrule="FREQ=WEEKLY;INTERVAL=2;BYDAY=MO;BYHOUR=9")) == datetime(
        2026, 12, 14, 14, 0, tzinfo=UTC
    )


def test_a_start_sent_counts_from_that_start() -> None:
    given = pb.Repeat(expression="every 2 weeks on Mon 09:00", start_local_time="2026-12-13T10:00")
    assert first_ring(given) == datetime(2026, 12, 21, 14, 0, tzinfo=UTC)
