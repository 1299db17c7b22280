"""Each RPC's behaviour through real gRPC on the real Cassandra."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.config import HANDOFF_WINDOW, CassandraSettings, Retention
from reminders_svc.domain import dispatch
from reminders_svc.domain.delivery import Answer, Delivery
from reminders_svc.domain.limits import Limits
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.parts import PartCounts, floor_minute, part_of
from reminders_svc.storage.session import CassandraConnection
from tests.admin.conftest import at_instant, run, store_of
from tests.api.conftest import (
    SEED_NOW,
    Api,
    FakeClock,
    code_of,
    one_off,
    running_api,
    weekly_monday_nine,
)
from tests.api.test_bad_input import COSTLY
from tests.grpc_errors import assert_refused, error_info_of
from tests.tracing import scanned

Z = UTC


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def create(api: Api, user: str, schedule: pb.Schedule, text: str = "call mom") -> pb.Reminder:
    request = pb.CreateReminderRequest(
        reminder=pb.Reminder(text=text, schedule=schedule), request_id=uuid.uuid4().hex
    )
    return api.reminders.CreateReminder(request, metadata=api.as_user(user))


def test_a_create_record_is_kept_for_the_idempotency_retention(
    api: Api, cassandra: CassandraConnection, user: str
) -> None:
    """A replay within REMINDERS_IDEMPOTENCY_RETENTION_DAYS (7) finds its record; after
    it, the record is gone by itself (its TTL), with no sweep to run."""
    request = pb.CreateReminderRequest(
        reminder=pb.Reminder(text="t", schedule=weekly_monday_nine()), request_id="kept"
    )
    api.reminders.CreateReminder(request, metadata=api.as_user(user))

    record = cassandra.session.execute(
        "SELECT TTL(reminder_id) AS ttl FROM create_requests"
        " WHERE user_id = %s AND request_id = %s",
        (user, "kept"),
    ).one()
    retention_s = Retention().idempotency.total_seconds()
    assert retention_s - 60 < record.ttl <= retention_s


def test_create_returns_the_id_and_the_dst_correct_next_ring(api: Api, user: str) -> None:
    created = create(api, user, weekly_monday_nine())

    assert uuid.UUID(created.id)
    assert created.next_ring_time.ToDatetime(tzinfo=Z) == at("2026-10-26T13:00:00")
    assert created.state == pb.Reminder.STATE_PENDING
    assert created.version == 1
    assert created.schedule.description.startswith("Every Monday at 09:00")
    assert created.schedule.description.endswith("America/New_York")
    assert created.schedule.repeat.canonical_rrule.startswith("FREQ=WEEKLY")

    api.clock.now = at("2026-10-27T00:00:00")  # after the Oct 26 ring, before Nov 1 DST
    # A new schedule (a start of its own; sent back unchanged it would keep its rings).
    restarted = weekly_monday_nine()
    restarted.repeat.start_local_time = "2026-10-26T20:00:00"
    edited = api.reminders.UpdateReminder(
        pb.UpdateReminderRequest(
            reminder=pb.Reminder(id=created.id, version=1, schedule=restarted),
            update_mask=FieldMask(paths=["schedule"]),
        ),
        metadata=api.as_user(user),
    )
    # Nov 2 is after the fall-back: 09:00 EST is 14:00Z, not 13:00Z.
    assert edited.next_ring_time.ToDatetime(tzinfo=Z) == at("2026-11-02T14:00:00")
    assert edited.version == 2


def test_a_change_of_zone_alone_moves_the_next_ring_and_writes_its_bucket_entry(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    created = create(api, user, weekly_monday_nine())
    assert created.next_ring_time.ToDatetime(tzinfo=Z) == at("2026-10-26T13:00:00")

    edited = api.reminders.UpdateReminder(
        pb.UpdateReminderRequest(
            reminder=pb.Reminder(
                id=created.id, version=1, schedule=weekly_monday_nine("Europe/Paris")
            ),
            update_mask=FieldMask(paths=["schedule"]),
        ),
        metadata=api.as_user(user),
    )

    # Paris left summer time on Oct 25: 09:00 CET on Oct 26 is 08:00Z.
    paris_nine = at("2026-10-26T08:00:00")
    assert edited.next_ring_time.ToDatetime(tzinfo=Z) == paris_nine
    assert edited.schedule.time_zone == "Europe/Paris"
    entries = cassandra.session.execute(
        "SELECT reminder_id, due FROM due_buckets WHERE minute = %s AND part = %s",
        (floor_minute(paris_nine), part_of(user, 64)),
    )
    assert [e.due.replace(tzinfo=UTC) for e in entries if str(e.reminder_id) == created.id] == [
        paris_nine
    ]


def test_page_size_0_takes_the_default_and_a_larger_one_the_largest(
    migrated_settings: CassandraSettings, user: str
) -> None:
    """The contract's 50 and 500, shown with small limits of the same rule."""
    assert (Limits().default_page_size, Limits().max_page_size) == (50, 500)
    small = Limits(default_page_size=3, max_page_size=5)
    with running_api(migrated_settings, FakeClock(SEED_NOW), small) as api:
        created = {create(api, user, weekly_monday_nine()).id for _ in range(7)}
        md = api.as_user(user)
        first = {}
        for size in (0, 4, 6, 500):
            page = api.reminders.ListReminders(pb.ListRemindersRequest(page_size=size), metadata=md)
            first[size] = len(page.reminders)
            assert {r.id for r in page.reminders} <= created
            assert page.next_page_token
        assert first == {0: 3, 4: 4, 6: 5, 500: 5}


def test_a_page_past_the_byte_budget_is_cut_short_with_a_token_and_loses_nothing(
    migrated_settings: CassandraSettings, user: str
) -> None:
    """500 reminders of the longest texts and rules came within 7% of a client's default
    4 MiB receive limit: a page is cut at a byte budget (2 MiB; 3 KB here) instead."""
    assert Limits().max_page_bytes == 2 * 1024 * 1024
    with running_api(migrated_settings, FakeClock(SEED_NOW), Limits(max_page_bytes=3000)) as api:
        long_text = "\U0001f600" * 500  # 2,000 bytes on the wire
        created = {create(api, user, weekly_monday_nine(), text=long_text).id for _ in range(5)}
        md = api.as_user(user)
        pages: list[list[str]] = []
        token = ""
        while True:
            page = api.reminders.ListReminders(
                pb.ListRemindersRequest(page_size=500, page_token=token), metadata=md
            )
            pages.append([r.id for r in page.reminders])
            token = page.next_page_token
            if not token:
                break

    assert [len(ids) for ids in pages] == [1, 1, 1, 1, 1]  # one fits, a second would not
    listed = [reminder_id for ids in pages for reminder_id in ids]
    assert listed == sorted(created, key=uuid.UUID)


def test_one_off_in_the_repeated_hour_rings_at_the_first(api: Api, user: str) -> None:
    created = create(api, user, one_off("2026-11-01T01:30:00"))
    assert created.next_ring_time.ToDatetime(tzinfo=Z) == at("2026-11-01T05:30:00")


def test_create_writes_the_bucket_entry_for_the_first_ring(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    created = create(api, user, weekly_monday_nine())
    minute = floor_minute(at("2026-10-26T13:00:00"))
    part = part_of(user, 64)
    rows = cassandra.session.execute(
        "SELECT reminder_id, user_id, due, TTL(due) AS ttl FROM due_buckets"
        " WHERE minute = %s AND part = %s",
        (minute, part),
    )
    entries = [r for r in rows if str(r.reminder_id) == created.id]
    assert len(entries) == 1
    assert entries[0].user_id == user
    # TTL: until due, counted from the server's (seeded) clock, plus 7 days of retention:
    # an entry that expired before its due would never ring.
    lives = at("2026-10-26T13:00:00") - SEED_NOW + timedelta(days=7)
    assert lives.total_seconds() - 120 < entries[0].ttl <= lives.total_seconds()


def test_an_entry_due_beyond_the_longest_ttl_is_kept_until_its_due(
    user: str, cassandra: CassandraConnection
) -> None:
    """A repeat's next ring can be 20 years on (Feb 29 on given weekdays): its entry must
    not expire before its due, which a TTL capped at Cassandra's 20 years would do."""
    now = datetime.now(UTC)
    due = floor_minute(now + timedelta(days=21 * 365))
    reminder = at_instant(user, due, now)
    run(store_of(cassandra).write_bucket_entry(reminder, now))
    rows = cassandra.session.execute(
        "SELECT reminder_id, TTL(due) AS ttl FROM due_buckets WHERE minute = %s AND part = %s",
        (due, part_of(user, 64)),
    )
    [entry] = [row for row in rows if row.reminder_id == reminder.reminder_id]
    assert entry.ttl is None


def test_get_and_list_show_only_the_callers_reminders_in_stable_pages(api: Api, user: str) -> None:
    mine = {create(api, user, weekly_monday_nine(), text=f"r{i}").id for i in range(5)}
    create(api, f"{user}-other", weekly_monday_nine())

    seen: list[str] = []
    token = ""
    while True:
        page = api.reminders.ListReminders(
            pb.ListRemindersRequest(page_size=2, page_token=token), metadata=api.as_user(user)
        )
        assert len(page.reminders) <= 2
        seen += [r.id for r in page.reminders]
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted(seen, key=uuid.UUID)
    assert set(seen) == mine
    one = next(iter(mine))
    got = api.reminders.GetReminder(pb.GetReminderRequest(id=one), metadata=api.as_user(user))
    assert got.id == one


def test_list_filters_by_state_and_hides_deleted(api: Api, user: str) -> None:
    paused = create(api, user, weekly_monday_nine())
    pending = create(api, user, weekly_monday_nine())
    deleted = create(api, user, weekly_monday_nine())
    md = api.as_user(user)
    api.reminders.PauseReminder(pb.PauseReminderRequest(id=paused.id), metadata=md)
    api.reminders.DeleteReminder(pb.DeleteReminderRequest(id=deleted.id), metadata=md)

    def ids(state: pb.Reminder.State.ValueType) -> set[str]:
        page = api.reminders.ListReminders(pb.ListRemindersRequest(state=state), metadata=md)
        return {r.id for r in page.reminders}

    assert ids(pb.Reminder.STATE_PAUSED) == {paused.id}
    assert ids(pb.Reminder.STATE_PENDING) == {pending.id}
    assert ids(pb.Reminder.STATE_UNSPECIFIED) == {paused.id, pending.id}


def test_an_update_mask_of_star_replaces_text_and_schedule(api: Api, user: str) -> None:
    """AIP-134's full replacement, which generated clients send for "update everything"."""
    created = create(api, user, weekly_monday_nine())
    replacement = pb.Reminder(
        id=created.id, version=1, text="stand-up", schedule=one_off("2026-10-20T10:00:00")
    )

    replaced = api.reminders.UpdateReminder(
        pb.UpdateReminderRequest(reminder=replacement, update_mask=FieldMask(paths=["*"])),
        metadata=api.as_user(user),
    )

    assert (replaced.text, replaced.version) == ("stand-up", 2)
    assert replaced.schedule.once.local_time == "2026-10-20T10:00:00"
    assert replaced.next_ring_time.ToDatetime(tzinfo=Z) == at("2026-10-20T14:00:00")


def test_a_whole_reminder_sent_back_with_its_schedule_unchanged_keeps_its_rings(
    api: Api, user: str
) -> None:
    """A client editing by sending back what GetReminder gave, mask "*": the schedule it
    carries is not a new one. Taken for one, it dropped the snooze, and skipped a ring
    that was due and not yet rung (or refused the edit, a one-off's time having passed)."""
    md = api.as_user(user)
    weekly = create(api, user, weekly_monday_nine())
    api.reminders.SnoozeReminder(
        pb.SnoozeReminderRequest(id=weekly.id, duration=Duration(seconds=600)), metadata=md
    )
    soon = create(api, user, one_off("2026-10-19T08:30:00"))
    api.clock.advance(timedelta(hours=1))  # its time passed; no dispatcher rang it yet

    def send_back(reminder_id: str, text: str) -> pb.Reminder:
        got = api.reminders.GetReminder(pb.GetReminderRequest(id=reminder_id), metadata=md)
        edited = pb.Reminder()
        edited.CopyFrom(got)
        edited.text = text
        request = pb.UpdateReminderRequest(reminder=edited, update_mask=FieldMask(paths=["*"]))
        updated = api.reminders.UpdateReminder(request, metadata=md)
        assert (updated.text, updated.version) == (text, got.version + 1)
        assert updated.next_ring_time == got.next_ring_time
        assert updated.snooze_until_time == got.snooze_until_time
        return updated

    assert send_back(weekly.id, "call dad").snooze_until_time.ToDatetime(tzinfo=Z) == at(
        "2026-10-19T12:10:00"
    )
    assert send_back(soon.id, "call the plumber").next_ring_time == soon.next_ring_time


def test_a_whole_reminder_sent_back_at_a_stale_version_is_aborted_not_bad_input(
    api: Api, user: str
) -> None:
    """A one-off whose time passed, snoozed meanwhile from its notification (no version
    sent), sent back by an app still holding the version before the snooze: its own
    schedule was judged a new one ("in the past", INVALID_ARGUMENT, which a client takes
    for permanent) where the answer is "re-read and retry"."""
    md = api.as_user(user)
    passed = create(api, user, one_off("2026-10-19T08:30:00"))
    api.clock.advance(timedelta(hours=1))
    api.reminders.SnoozeReminder(
        pb.SnoozeReminderRequest(id=passed.id, duration=Duration(seconds=600)), metadata=md
    )
    echoed = pb.Reminder()
    echoed.CopyFrom(passed)
    echoed.text = "call the plumber"
    request = pb.UpdateReminderRequest(reminder=echoed, update_mask=FieldMask(paths=["*"]))

    refusal = error_info_of(lambda: api.reminders.UpdateReminder(request, metadata=md))

    assert (refusal.reason, dict(refusal.metadata)) == ("VERSION_STALE", {"current_version": "2"})
    # A schedule of its own that has passed is still bad input, at any version.
    request.reminder.schedule.once.local_time = "2026-10-19T08:00:00"
    with pytest.raises(grpc.RpcError) as moved:
        api.reminders.UpdateReminder(request, metadata=md)
    assert moved.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_an_update_mask_naming_output_only_fields_ignores_them(api: Api, user: str) -> None:
    """AIP-161: a mask may name fields no caller sets, so that the mask a client reads the
    whole reminder with can go back with it; they were refused ("cannot update state")."""
    md = api.as_user(user)
    created = create(api, user, weekly_monday_nine())

    def update(*paths: str) -> pb.Reminder:
        edited = pb.Reminder()
        edited.CopyFrom(created)
        edited.text = "call dad"
        edited.state = pb.Reminder.STATE_PAUSED  # output only: never taken from a request
        request = pb.UpdateReminderRequest(reminder=edited, update_mask=FieldMask(paths=paths))
        return api.reminders.UpdateReminder(request, metadata=md)

    updated = update("text", "state", "update_time", "next_ring_time", "id", "version")
    assert (updated.text, updated.state, updated.version) == ("call dad", created.state, 2)
    assert updated.next_ring_time == created.next_ring_time
    for nothing_to_change in (("state",), ()):
        with pytest.raises(grpc.RpcError) as refused:
            update(*nothing_to_change)
        assert_refused(
            refused.value, grpc.StatusCode.INVALID_ARGUMENT, "update_mask", "INVALID_FIELD"
        )
    with pytest.raises(grpc.RpcError) as unknown:
        update("text", "colour")
    assert_refused(unknown.value, grpc.StatusCode.INVALID_ARGUMENT, "update_mask", "INVALID_FIELD")


def test_an_update_that_changes_nothing_keeps_the_version(api: Api, user: str) -> None:
    """A form saved untouched (the same text), or the whole reminder sent back (mask "*"):
    each bumped the version, so every other client's copy went stale and its next edit
    was ABORTED."""
    md = api.as_user(user)
    created = create(api, user, weekly_monday_nine())

    def update(*paths: str) -> pb.Reminder:
        request = pb.UpdateReminderRequest(reminder=created, update_mask=FieldMask(paths=paths))
        return api.reminders.UpdateReminder(request, metadata=md)

    for paths in (("text",), ("*",), ("text", "schedule")):
        assert update(*paths) == created, paths
    got = api.reminders.GetReminder(pb.GetReminderRequest(id=created.id), metadata=md)
    assert got == created


def test_update_needs_the_current_version(api: Api, user: str) -> None:
    created = create(api, user, weekly_monday_nine())
    md = api.as_user(user)

    def update(version: int, text: str) -> pb.Reminder:
        return api.reminders.UpdateReminder(
            pb.UpdateReminderRequest(
                reminder=pb.Reminder(id=created.id, version=version, text=text),
                update_mask=FieldMask(paths=["text"]),
            ),
            metadata=md,
        )

    updated = update(1, "call dad")
    assert (updated.text, updated.version) == ("call dad", 2)
    assert updated.next_ring_time == created.next_ring_time  # a text edit keeps the rings
    with pytest.raises(grpc.RpcError) as stale:
        update(1, "call grandma")
    assert stale.value.code() == grpc.StatusCode.ABORTED
    refusal = error_info_of(lambda: update(1, "call grandma"))
    # The version to re-read at, without parsing a message: a client whose own change
    # landed unheard can tell it from the version it expected.
    assert (refusal.reason, dict(refusal.metadata)) == ("VERSION_STALE", {"current_version": "2"})
    got = api.reminders.GetReminder(pb.GetReminderRequest(id=created.id), metadata=md)
    assert (got.text, got.version) == ("call dad", 2)


def test_snooze_adds_a_ring_and_leaves_the_series_untouched(api: Api, user: str) -> None:
    created = create(api, user, weekly_monday_nine())
    md = api.as_user(user)

    snoozed = api.reminders.SnoozeReminder(
        pb.SnoozeReminderRequest(id=created.id, duration=Duration(seconds=600)), metadata=md
    )

    assert snoozed.snooze_until_time.ToDatetime(tzinfo=Z) == at("2026-10-19T12:10:00")
    assert snoozed.next_ring_time.ToDatetime(tzinfo=Z) == at("2026-10-19T12:10:00")
    assert snoozed.next_occurrence_time == created.next_occurrence_time
    assert snoozed.version == 2

    too_long = code_of(
        lambda: api.reminders.SnoozeReminder(
            pb.SnoozeReminderRequest(id=created.id, duration=Duration(seconds=8 * 86400)),
            metadata=md,
        )
    )
    assert too_long == grpc.StatusCode.INVALID_ARGUMENT


def test_a_snooze_to_a_time_retried_changes_nothing_and_keeps_others_versions_current(
    api: Api, user: str
) -> None:
    """The retry the contract calls safe (after a DEADLINE_EXCEEDED, say) bumped the
    version again, so another client's next edit at the version it had seen was ABORTED."""
    created = create(api, user, weekly_monday_nine())
    md = api.as_user(user)
    until = Timestamp()
    until.FromDatetime(at("2026-10-19T12:30:00"))
    request = pb.SnoozeReminderRequest(id=created.id, snooze_until_time=until)

    snoozed = api.reminders.SnoozeReminder(request, metadata=md)
    retried = api.reminders.SnoozeReminder(request, metadata=md)
    # Retried once its time is less than the shortest snooze away: it was refused
    # (INVALID_ARGUMENT), and the caller could not tell whether its snooze had landed.
    api.clock.now = at("2026-10-19T12:29:30")
    retried_late = api.reminders.SnoozeReminder(request, metadata=md)

    assert retried == retried_late == snoozed
    assert snoozed.version == 2
    edited = api.reminders.UpdateReminder(
        pb.UpdateReminderRequest(
            reminder=pb.Reminder(id=created.id, text="moved", version=snoozed.version),
            update_mask=FieldMask(paths=["text"]),
        ),
        metadata=md,
    )
    assert (edited.version, edited.snooze_until_time) == (3, until)
    later = api.reminders.SnoozeReminder(
        pb.SnoozeReminderRequest(id=created.id, duration=Duration(seconds=3600)), metadata=md
    )
    assert later.version == 4  # another time is a change


def test_a_snooze_shorter_than_the_configured_minimum_is_refused_with_the_range(
    migrated_settings: CassandraSettings, user: str
) -> None:
    with running_api(
        migrated_settings, FakeClock(SEED_NOW), Limits(min_snooze=timedelta(seconds=5))
    ) as api:
        created = create(api, user, weekly_monday_nine())
        md = api.as_user(user)
        with pytest.raises(grpc.RpcError) as refused:
            api.reminders.SnoozeReminder(
                pb.SnoozeReminderRequest(id=created.id, duration=Duration(seconds=4)), metadata=md
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "must be 5 seconds to 7 days from now" in (refused.value.details() or "")
        unchanged = api.reminders.GetReminder(pb.GetReminderRequest(id=created.id), metadata=md)
        assert unchanged.version == 1

        snoozed = api.reminders.SnoozeReminder(
            pb.SnoozeReminderRequest(id=created.id, duration=Duration(seconds=5)), metadata=md
        )
        assert snoozed.snooze_until_time.ToDatetime(tzinfo=Z) == SEED_NOW + timedelta(seconds=5)


def test_a_snooze_asked_at_a_fraction_of_a_second_rings_no_sooner_than_asked(
    api: Api, user: str
) -> None:
    """Rings are whole seconds: "for a minute" at 12:00:00.400 rings at 12:01:01 (it rang
    at 12:01:00, 59.6 s on); "for a week", the most, is not refused for the rounding."""
    created = create(api, user, weekly_monday_nine())
    api.clock.now = SEED_NOW + timedelta(milliseconds=400)
    for seconds in (60, 7 * 86400):
        snoozed = api.reminders.SnoozeReminder(
            pb.SnoozeReminderRequest(id=created.id, duration=Duration(seconds=seconds)),
            metadata=api.as_user(user),
        )
        expected = SEED_NOW + timedelta(seconds=seconds + 1)
        assert snoozed.snooze_until_time.ToDatetime(tzinfo=Z) == expected


@pytest.mark.parametrize("field", ["snooze_until_time", "snooze_until_local_time"])
def test_a_snooze_to_a_time_a_minute_past_the_current_second_is_accepted(
    api: Api, user: str, field: str
) -> None:
    """A client snoozes "for a minute" to a time (the contract's safe retry): its clock's
    second plus 60 s, as times are whole seconds. At 12:00:00.500 that was 59.5 s away
    and refused as under the minimum: half the time, or always once the trip took a
    while. A time less than a minute past the current second is still refused."""
    created = create(api, user, weekly_monday_nine())
    api.clock.now = SEED_NOW + timedelta(milliseconds=500)

    def snooze_to(seconds: int) -> pb.Reminder:
        until = SEED_NOW + timedelta(seconds=seconds)
        request = pb.SnoozeReminderRequest(id=created.id)
        if field == "snooze_until_time":
            request.snooze_until_time.FromDatetime(until)
        else:  # the reminder's zone: 08:00 EDT is 12:00Z
            local = until.astimezone(ZoneInfo("America/New_York")).replace(tzinfo=None)
            request.snooze_until_local_time = local.isoformat()
        return api.reminders.SnoozeReminder(request, metadata=api.as_user(user))

    with pytest.raises(grpc.RpcError) as refused:
        snooze_to(59)
    assert_refused(refused.value, grpc.StatusCode.INVALID_ARGUMENT, field, "INVALID_FIELD")
    assert "must be 1 minute to 7 days from now" in (refused.value.details() or "")

    snoozed = snooze_to(60)
    assert snoozed.snooze_until_time.ToDatetime(tzinfo=Z) == SEED_NOW + timedelta(minutes=1)
    assert snoozed.version == 2


def preview_rings(api: Api, user: str, created: pb.Reminder) -> list[datetime]:
    preview = api.reminders.PreviewSchedule(
        pb.PreviewScheduleRequest(
            schedule=created.schedule, from_time=created.create_time, count=10
        ),
        metadata=api.as_user(user),
    )
    return [o.time.ToDatetime(tzinfo=Z) for o in preview.occurrences]


def test_a_repeat_without_a_start_rings_its_whole_count(api: Api, user: str) -> None:
    """The start defaults to now: the next whole minute, so COUNT's first ring is one to
    come (it was the minute under way, already past: COUNT=3 rang twice, COUNT=1 was
    refused as never ringing)."""
    api.clock.now = SEED_NOW + timedelta(seconds=20)
    for count in (1, 3):
        schedule = pb.Schedule(
            time_zone="UTC", repeat=pb.Repeat(rrule=f"FREQ=HOURLY;COUNT={count}")
        )
        created = create(api, user, schedule)
        assert created.schedule.repeat.start_local_time == "2026-10-19T12:01:00"
        rings = preview_rings(api, user, created)
        assert rings == [SEED_NOW + timedelta(hours=n, minutes=1) for n in range(count)]
        assert created.next_ring_time.ToDatetime(tzinfo=Z) == rings[0]


def test_a_repeat_begun_in_a_repeated_hour_without_a_start_rings_its_whole_count(
    api: Api, user: str
) -> None:
    """At 01:30:10 EST on the fall-back night the next minute's wall time, 01:31, is first
    an instant an hour ago (EDT): the series begins at 02:31 EST, where a series at :31 rings
    next (a repeat rings at a repeated time's first pass). It began at 01:31 and COUNT=3
    rang twice, COUNT=1 was refused as never ringing; then at 02:00, and rang at :00."""
    api.clock.now = datetime(2026, 11, 1, 6, 30, 10, tzinfo=Z)
    schedule = pb.Schedule(
        time_zone="America/New_York", repeat=pb.Repeat(rrule="FREQ=HOURLY;COUNT=3")
    )
    created = create(api, user, schedule)
    assert created.schedule.repeat.start_local_time == "2026-11-01T02:31:00"
    expected = [datetime(2026, 11, 1, hour, 31, tzinfo=Z) for hour in (7, 8, 9)]
    assert preview_rings(api, user, created) == expected
    assert created.next_ring_time.ToDatetime(tzinfo=Z) == expected[0]


def test_a_start_within_a_minute_begins_at_its_end(api: Api, user: str) -> None:
    """Rings are on whole minutes and none before the start given: 12:00:30 begins at
    12:01 (it was 12:00, so a COUNT=1 made at 12:00:10 was refused as never ringing)."""
    api.clock.now = SEED_NOW + timedelta(seconds=10)
    schedule = pb.Schedule(
        time_zone="UTC",
        repeat=pb.Repeat(rrule="FREQ=HOURLY;COUNT=1", start_local_time="2026-10-19T12:00:30"),
    )
    created = create(api, user, schedule)
    assert created.schedule.repeat.start_local_time == "2026-10-19T12:01:00"
    assert preview_rings(api, user, created) == [SEED_NOW + timedelta(minutes=1)]


@pytest.mark.parametrize(
    ("now", "local", "snoozed_until"),
    [
        ("2026-10-31T12:00:00", "2026-11-01T01:30:00", "2026-11-01T05:30:00"),
        # At 01:10 EST (the second 01:10 of the fall-back night), "until 01:40" is 30
        # minutes ahead; the first 01:40 passed an hour ago (it was refused as past).
        ("2026-11-01T06:10:00", "2026-11-01T01:40:00", "2026-11-01T06:40:00"),
    ],
    ids=["the first of a repeated time", "the one ahead during the repeated hour"],
)
def test_snooze_to_a_local_time_follows_the_zone_rules(
    api: Api, user: str, now: str, local: str, snoozed_until: str
) -> None:
    created = create(api, user, weekly_monday_nine())
    api.clock.now = at(now)
    snoozed = api.reminders.SnoozeReminder(
        pb.SnoozeReminderRequest(id=created.id, snooze_until_local_time=local),
        metadata=api.as_user(user),
    )
    assert snoozed.snooze_until_time.ToDatetime(tzinfo=Z) == at(snoozed_until)


def test_a_one_off_named_in_the_repeated_hour_after_its_first_pass_rings_at_the_second(
    api: Api, user: str
) -> None:
    """At 01:10 EST (the second 01:10 of the fall-back night), "at 01:30" is 20 minutes
    ahead, as a snooze to it is; the first 01:30 passed 40 minutes ago (it was refused as
    past). Kept as that instant, so every later reading finds the same ring."""
    api.clock.now = at("2026-11-01T06:10:00")
    created = create(api, user, one_off("2026-11-01T01:30:00"))
    assert created.next_ring_time.ToDatetime(tzinfo=Z) == at("2026-11-01T06:30:00")
    assert created.schedule.once.instant.ToDatetime(tzinfo=Z) == at("2026-11-01T06:30:00")
    assert created.schedule.time_zone == "America/New_York"
    # A preview from then shows the ring the reminder has.
    preview = api.reminders.PreviewSchedule(
        pb.PreviewScheduleRequest(
            schedule=one_off("2026-11-01T01:30:00"), from_time=created.create_time
        ),
        metadata=api.as_user(user),
    )
    assert [o.time.ToDatetime(tzinfo=Z) for o in preview.occurrences] == [at("2026-11-01T06:30:00")]


def test_pause_stops_and_resume_continues_from_the_next_occurrence(api: Api, user: str) -> None:
    created = create(api, user, weekly_monday_nine())
    md = api.as_user(user)

    paused = api.reminders.PauseReminder(pb.PauseReminderRequest(id=created.id), metadata=md)
    assert paused.state == pb.Reminder.STATE_PAUSED
    assert not paused.HasField("next_ring_time")

    api.clock.now = at("2026-11-10T00:00:00")
    # Read while paused, it shows what resuming would ring, not the Oct 26 it paused at.
    shown = api.reminders.GetReminder(pb.GetReminderRequest(id=created.id), metadata=md)
    assert shown.next_occurrence_time.ToDatetime(tzinfo=Z) == at("2026-11-16T14:00:00")
    (listed,) = api.reminders.ListReminders(pb.ListRemindersRequest(), metadata=md).reminders
    assert listed == shown  # a page with paused reminders is read off the event loop
    resumed = api.reminders.ResumeReminder(pb.ResumeReminderRequest(id=created.id), metadata=md)
    assert resumed.state == pb.Reminder.STATE_PENDING
    assert resumed.next_ring_time.ToDatetime(tzinfo=Z) == at("2026-11-16T14:00:00")
    assert resumed.next_occurrence_time == shown.next_occurrence_time
    assert resumed.version == 3


def test_resuming_a_one_off_whose_time_passed_is_refused(api: Api, user: str) -> None:
    created = create(api, user, one_off("2026-10-20T09:00:00"))
    md = api.as_user(user)
    api.reminders.PauseReminder(pb.PauseReminderRequest(id=created.id), metadata=md)
    api.clock.now = at("2026-10-21T00:00:00")
    shown = api.reminders.GetReminder(pb.GetReminderRequest(id=created.id), metadata=md)
    assert not shown.HasField("next_occurrence_time")  # nothing a resume would ring

    with pytest.raises(grpc.RpcError) as refused:
        api.reminders.ResumeReminder(pb.ResumeReminderRequest(id=created.id), metadata=md)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "edit its time" in (refused.value.details() or "")


def claim_now(api: Api, cassandra: CassandraConnection, user: str, created: pb.Reminder) -> None:
    """`created` claimed at the API's now, as a dispatcher claims a ring due (through the
    store, for a 30 s lease): STATE_SENDING, its ring handed off."""
    store = store_of(cassandra)
    stored = run(store.get_serial(user, uuid.UUID(created.id)))
    assert stored is not None
    now = api.clock.now
    claimed = dispatch.claimed(stored.reminder, uuid.uuid4(), now, timedelta(seconds=30))
    assert run(store.replace(stored, claimed, now))


def test_a_ring_under_way_after_missed_occurrences_shows_as_the_next_ring(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    """A weekly reminder whose Mondays were missed (an outage) rings once, for the latest
    (invariant 9). While that ring is handed off, next_ring_time is the ring in flight, as
    the contract says; it showed the oldest missed Monday, three weeks back."""
    created = create(api, user, weekly_monday_nine())
    api.clock.now = at("2026-11-10T00:00:00")
    claim_now(api, cassandra, user, created)

    shown = api.reminders.GetReminder(
        pb.GetReminderRequest(id=created.id), metadata=api.as_user(user)
    )

    assert shown.state == pb.Reminder.STATE_SENDING
    assert shown.next_ring_time.ToDatetime(tzinfo=Z) == at("2026-11-09T14:00:00")  # 09:00 EST


def test_delete_makes_it_invisible_and_says_whether_a_ring_was_in_flight(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    quiet = create(api, user, weekly_monday_nine())
    ringing = create(api, user, weekly_monday_nine())
    md = api.as_user(user)
    claimed = cassandra.session.execute(
        "UPDATE reminders SET status = 'sending', claim_token = %s"
        " WHERE user_id = %s AND reminder_id = %s IF status = 'pending'",
        (uuid.uuid4(), user, uuid.UUID(ringing.id)),
    ).one()
    assert claimed.applied

    first = api.reminders.DeleteReminder(pb.DeleteReminderRequest(id=quiet.id), metadata=md)
    second = api.reminders.DeleteReminder(pb.DeleteReminderRequest(id=ringing.id), metadata=md)

    assert (first.was_sending, second.was_sending) == (False, True)
    assert second.reminder.state == pb.Reminder.STATE_DELETED
    assert not any(  # a deleted reminder rings nothing more
        second.reminder.HasField(name)
        for name in ("next_ring_time", "next_occurrence_time", "snooze_until_time")
    )
    row = cassandra.session.execute(
        "SELECT status, claim_token FROM reminders WHERE user_id = %s AND reminder_id = %s",
        (user, uuid.UUID(ringing.id)),
    ).one()
    assert (row.status, row.claim_token) == ("deleted", None)  # the dispatcher's claim is void
    gone = code_of(
        lambda: api.reminders.GetReminder(pb.GetReminderRequest(id=quiet.id), metadata=md)
    )
    assert gone == grpc.StatusCode.NOT_FOUND


def test_a_delete_after_a_pause_took_a_claim_away_says_a_ring_may_be_in_flight(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    """Paused while its ring was being handed off, then deleted: the ring may still go out
    until its claim would have expired, and the notifier may push it until that hand-off's
    own expiry (the ring expiry, by a clock up to the skew behind): the delete says so
    until then; past that, it does not (a chaos run saw a push after "not in flight")."""
    md = api.as_user(user)
    rings: dict[str, pb.Reminder] = {}
    for name in ("soon deleted", "deleted past the claim", "deleted past the push"):
        rings[name] = created = create(api, user, weekly_monday_nine())
        claimed = cassandra.session.execute(
            "UPDATE reminders SET status = 'sending', claim_token = %s, claim_due = %s,"
            " claim_expires = %s WHERE user_id = %s AND reminder_id = %s IF status = 'pending'",
            (
                uuid.uuid4(),
                SEED_NOW,
                SEED_NOW + timedelta(seconds=30),
                user,
                uuid.UUID(created.id),
            ),
        ).one()
        assert claimed.applied
        paused = api.reminders.PauseReminder(pb.PauseReminderRequest(id=created.id), metadata=md)
        assert paused.state == pb.Reminder.STATE_PAUSED

    def delete(name: str) -> bool:
        request = pb.DeleteReminderRequest(id=rings[name].id)
        return api.reminders.DeleteReminder(request, metadata=md).was_sending

    soon = delete("soon deleted")
    claim_expired = SEED_NOW + timedelta(seconds=30)
    api.clock.now = claim_expired + timedelta(seconds=1)
    past_the_claim = delete("deleted past the claim")
    api.clock.now = claim_expired + HANDOFF_WINDOW + timedelta(seconds=1)
    past_the_push = delete("deleted past the push")

    assert (soon, past_the_claim, past_the_push) == (True, True, False)


def test_a_change_landing_while_a_ring_is_handed_off_says_that_ring_may_still_arrive(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    """DESIGN.md invariant 5: a change landing after the claim cannot recall the ring, and
    the API says so. Only a delete did (`was_sending`): a pause answered a bare reminder,
    STATE_PAUSED, with nothing to tell the user the phone may ring in a moment."""
    md = api.as_user(user)
    paused_one, edited_one, snoozed_one, quiet = (
        create(api, user, weekly_monday_nine()) for _ in range(4)
    )
    api.clock.now = at("2026-10-26T13:00:00")  # the first Monday, 09:00 EDT: all due
    for ringing in (paused_one, edited_one, snoozed_one):
        claim_now(api, cassandra, user, ringing)

    def pause(reminder: pb.Reminder) -> pb.Reminder:
        return api.reminders.PauseReminder(pb.PauseReminderRequest(id=reminder.id), metadata=md)

    paused = pause(paused_one)
    edited = api.reminders.UpdateReminder(
        pb.UpdateReminderRequest(
            reminder=pb.Reminder(id=edited_one.id, version=1, text="call dad"),
            update_mask=FieldMask(paths=["text"]),
        ),
        metadata=md,
    )
    snoozed = api.reminders.SnoozeReminder(
        pb.SnoozeReminderRequest(id=snoozed_one.id, duration=Duration(seconds=600)), metadata=md
    )
    paused_quietly = pause(quiet)  # due too, but no dispatcher has claimed it

    assert (paused.state, edited.state) == (pb.Reminder.STATE_PAUSED, pb.Reminder.STATE_SENDING)
    answers = (paused, edited, snoozed, paused_quietly)
    assert [answer.ring_in_flight for answer in answers] == [True, True, True, False]
    # A pause retried (it changes nothing) says it too; a read never does.
    assert pause(paused_one).ring_in_flight
    got = api.reminders.GetReminder(pb.GetReminderRequest(id=paused_one.id), metadata=md)
    listed = api.reminders.ListReminders(pb.ListRemindersRequest(), metadata=md).reminders
    assert [got.ring_in_flight, *(r.ring_in_flight for r in listed)] == [False] * 5
    deleted = api.reminders.DeleteReminder(pb.DeleteReminderRequest(id=edited_one.id), metadata=md)
    assert deleted.was_sending == deleted.reminder.ring_in_flight is True
    # Once the notifier can no longer push it (the claim's expiry and the push window):
    api.clock.now += timedelta(seconds=30) + HANDOFF_WINDOW + timedelta(seconds=1)
    resumed = api.reminders.ResumeReminder(pb.ResumeReminderRequest(id=paused_one.id), metadata=md)
    assert (resumed.state, resumed.ring_in_flight) == (pb.Reminder.STATE_PENDING, False)


def test_preview_schedule_lists_occurrences_without_storing(api: Api, user: str) -> None:
    answer = api.reminders.PreviewSchedule(
        pb.PreviewScheduleRequest(schedule=weekly_monday_nine(), count=3),
        metadata=api.as_user(user),
    )
    assert [o.time.ToDatetime(tzinfo=Z) for o in answer.occurrences] == [
        at("2026-10-26T13:00:00"),
        at("2026-11-02T14:00:00"),
        at("2026-11-09T14:00:00"),
    ]
    assert answer.occurrences[1].local_time == "2026-11-02T09:00:00-05:00"
    assert answer.tzdata_version
    listed = api.reminders.ListReminders(pb.ListRemindersRequest(), metadata=api.as_user(user))
    assert list(listed.reminders) == []


def test_costly_previews_queue_off_the_event_loop_while_other_calls_answer(
    api: Api, user: str
) -> None:
    """Previews expand in a worker, one at a time: a burst of the costliest ones allowed
    queues there, and a GetReminder sent behind them answers before they are all done."""
    md = api.as_user(user)
    created = create(api, user, weekly_monday_nine())
    costly = pb.PreviewScheduleRequest(schedule=COSTLY, count=30)
    previews = [api.reminders.PreviewSchedule.future(costly, metadata=md) for _ in range(8)]
    got = api.reminders.GetReminder(pb.GetReminderRequest(id=created.id), metadata=md)
    pending = sum(not preview.done() for preview in previews)
    assert got.id == created.id
    assert all(len(preview.result().occurrences) == 30 for preview in previews)
    assert pending > 0


def test_list_deliveries_reads_the_history_newest_first(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    created = create(api, user, weekly_monday_nine())
    record_deliveries(
        cassandra, created, user, [at(f"2026-10-{day}T13:00:00") for day in (26, 27, 28)]
    )
    md = api.as_user(user)
    first = api.reminders.ListDeliveries(
        pb.ListDeliveriesRequest(reminder_id=created.id, page_size=2), metadata=md
    )
    rest = api.reminders.ListDeliveries(
        pb.ListDeliveriesRequest(reminder_id=created.id, page_token=first.next_page_token),
        metadata=md,
    )
    dues = [d.due_time.ToDatetime(tzinfo=Z).day for d in [*first.deliveries, *rest.deliveries]]
    assert dues == [28, 27, 26]
    assert first.deliveries[0].answer == pb.Delivery.ANSWER_ACCEPTED
    assert first.deliveries[0].lateness.ToMilliseconds() == 1000
    assert not rest.next_page_token
    other = code_of(
        lambda: api.reminders.ListDeliveries(
            pb.ListDeliveriesRequest(reminder_id=created.id), metadata=api.as_user(f"{user}-x")
        )
    )
    assert other == grpc.StatusCode.NOT_FOUND


def record_deliveries(
    cassandra: CassandraConnection, reminder: pb.Reminder, user: str, dues: list[datetime]
) -> None:
    """History rows as the dispatcher writes them: one accepted hand-off per due, 1 s late."""
    history = DeliveryHistory(cassandra.session)

    async def record() -> None:
        for due in dues:
            await history.record(
                Delivery(
                    user_id=user,
                    reminder_id=uuid.UUID(reminder.id),
                    claim_due=due,
                    claim_token=uuid.uuid4(),
                    claimed_at=due,
                    handed_off_at=due + timedelta(seconds=1),
                    answer=Answer.ACCEPTED,
                    reason=None,
                    late=False,
                ),
                written_at=datetime.now(UTC),
            )

    asyncio.run(record())


def test_the_part_table_defaults_to_64_parts(cassandra: CassandraConnection) -> None:

    assert asyncio.run(PartCounts(cassandra.session).parts_at(at("2026-10-26T13:00:00"))) == 64


def test_a_deleted_row_keeps_every_cell_only_until_the_tombstone_ttl(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    created = create(api, user, weekly_monday_nine())
    api.reminders.DeleteReminder(
        pb.DeleteReminderRequest(id=created.id), metadata=api.as_user(user)
    )
    row = cassandra.session.execute(
        "SELECT TTL(status) AS status_ttl, TTL(body) AS body_ttl, TTL(created_at) AS created_ttl"
        " FROM reminders WHERE user_id = %s AND reminder_id = %s",
        (user, uuid.UUID(created.id)),
    ).one()
    # Every cell expires past the retry horizon (30 days), so the row vanishes whole.
    for ttl in (row.status_ttl, row.body_ttl, row.created_ttl):
        assert 29 * 86400 < ttl <= 30 * 86400


def test_creating_editing_and_deleting_leave_no_tombstones_for_reads_to_scan(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    # A null written for an absent value (no claim, no snooze, a repeat's missing instant)
    # is a tombstone cell that every read of the user's partition scans until compaction:
    # Cassandra warns past 1,000 in one read, and fails the read past 100,000.
    kept = create(api, user, weekly_monday_nine())
    create(api, user, one_off("2026-11-01T01:30:00"))
    deleted = create(api, user, one_off("2026-11-02T09:00:00"))
    api.reminders.UpdateReminder(
        pb.UpdateReminderRequest(
            reminder=pb.Reminder(id=kept.id, version=kept.version, text="call dad"),
            update_mask=FieldMask(paths=["text"]),
        ),
        metadata=api.as_user(user),
    )
    api.reminders.DeleteReminder(
        pb.DeleteReminderRequest(id=deleted.id), metadata=api.as_user(user)
    )

    read = scanned(cassandra.session, "SELECT * FROM reminders WHERE user_id = %s", (user,))
    # Five rows: the three reminders, the partition's static one (the active count) and its
    # count row (statics.py); the one tombstone is the deleted reminder's cleared due.
    assert read == ["Read 5 live rows and 1 tombstone cells"]
