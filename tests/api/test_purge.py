"""An operator's DeleteUserData: everything of one user goes, creates racing it are
fenced off, a cut-short call still finishes, and rings in flight are reported."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import grpc
import pytest
from cassandra import OperationTimedOut, WriteTimeout, WriteType
from cassandra import Unavailable as CassandraUnavailable
from cassandra.cluster import Session

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.api.auth import Authenticator
from reminders_svc.api.service import AdminServicer, ApiServicers, build_servicers
from reminders_svc.api.settings import ApiSettings
from reminders_svc.app import RemindersApp
from reminders_svc.config import HANDOFF_WINDOW, CassandraSettings, Retention
from reminders_svc.domain.errors import Unavailable
from reminders_svc.domain.limits import Limits
from reminders_svc.domain.reminder import Reminder
from reminders_svc.erasure import UserDataEraser
from reminders_svc.schedule import parse_repeat
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.purge import PURGE_FENCE, UserPurge
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import CassandraConnection
from reminders_svc.storage.statics import COUNT_ROW
from tests.api.conftest import (
    SEED_NOW,
    Api,
    FakeClock,
    code_of,
    one_off,
    reason_of,
    running_api,
    weekly_monday_nine,
)
from tests.api.test_service import at, create, record_deliveries
from tests.grpc_errors import retry_delay_of

# Every table holding one user's data, each partitioned by user_id.
USER_TABLES = ("reminders", "deliveries", "create_requests")


def rows_per_table(cassandra: CassandraConnection, user: str) -> dict[str, int]:
    """The user's rows in each table; in `reminders`, not its count row (statics.py)."""
    select = "SELECT * FROM {} WHERE user_id = %s"
    return {
        table: sum(
            1
            for row in cassandra.session.execute(select.format(table), (user,))
            if table != "reminders" or row.reminder_id != COUNT_ROW
        )
        for table in USER_TABLES
    }


def test_admin_deletes_all_of_one_users_data(
    api: Api, user: str, cassandra: CassandraConnection, caplog: pytest.LogCaptureFixture
) -> None:
    keeper = f"{user}-keep"
    first_request = pb.CreateReminderRequest(
        reminder=pb.Reminder(text="call mom", schedule=weekly_monday_nine()),
        request_id=uuid.uuid4().hex,
    )
    first = api.reminders.CreateReminder(first_request, metadata=api.as_user(user))
    mine = [
        first,
        create(api, user, weekly_monday_nine()),
        create(api, user, one_off("2026-11-20T18:00:00")),
    ]
    survivor = create(api, keeper, weekly_monday_nine())
    dues = [at("2026-10-26T13:00:00"), at("2026-11-02T14:00:00")]
    for reminder in mine[:2]:
        record_deliveries(cassandra, reminder, user, dues)
    record_deliveries(cassandra, survivor, keeper, dues)
    seeded = rows_per_table(cassandra, user)
    kept_before = rows_per_table(cassandra, keeper)

    user_token = code_of(
        lambda: api.admin.DeleteUserData(
            pb.DeleteUserDataRequest(user_id=user), metadata=api.as_user(user)
        )
    )
    with caplog.at_level(logging.INFO, logger="reminders.audit"):
        answer = api.admin.DeleteUserData(
            pb.DeleteUserDataRequest(user_id=user), metadata=api.as_admin()
        )

    # A valid user token is a known caller without the right: PERMISSION_DENIED.
    assert user_token == grpc.StatusCode.PERMISSION_DENIED
    answered = {
        "reminders": answer.reminders_deleted,
        "deliveries": answer.deliveries_deleted,
        "create_requests": answer.requests_deleted,
    }
    assert answered == seeded == {"reminders": 3, "deliveries": 4, "create_requests": 3}
    assert answer.rings_in_flight == 0
    assert rows_per_table(cassandra, user) == dict.fromkeys(USER_TABLES, 0)
    # Nothing of the partition either: its static cells and its count row went with the fence.
    assert (
        list(cassandra.session.execute("SELECT * FROM reminders WHERE user_id = %s", (user,))) == []
    )
    # Who wiped whose account stays on record: asked, then done with the counts.
    assert [r.getMessage() for r in caplog.records if r.name == "reminders.audit"] == [
        f"operator 'ops' deletes all data of user {user!r}",
        f"operator 'ops' deleted all data of user {user!r}: 3 reminders (0 rings in flight),"
        " 3 create records, 4 deliveries",
    ]
    kept = {"reminders": 1, "deliveries": 2, "create_requests": 1}
    assert kept_before == kept
    assert rows_per_table(cassandra, keeper) == kept
    # The idempotency record went too: a replayed create makes a new reminder, it does not
    # bring the purged one back.
    replayed = api.reminders.CreateReminder(first_request, metadata=api.as_user(user))
    assert replayed.id not in {reminder.id for reminder in mine}
    survived = api.reminders.GetReminder(
        pb.GetReminderRequest(id=survivor.id), metadata=api.as_user(keeper)
    )
    assert survived.id == survivor.id


class PurgeHeldAtItsFirstRow(UserPurge):
    """The real purge, waiting at its first row (its fence is up) until the test releases
    it."""

    def __init__(self, session: Session) -> None:
        super().__init__(session, HANDOFF_WINDOW)
        self.fenced = threading.Event()
        self.release = threading.Event()
        self.cancelled = threading.Event()

    async def _purge_row(
        self, user_id: str, purge_id: uuid.UUID, listed: Any, now: datetime
    ) -> bool | None:
        if not self.fenced.is_set():
            self.fenced.set()
            try:
                await asyncio.to_thread(self.release.wait, 60)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return await super()._purge_row(user_id, purge_id, listed, now)


@pytest.fixture
def held(migrated_settings: CassandraSettings) -> Iterator[tuple[Api, PurgeHeldAtItsFirstRow]]:
    with serving_a_held_purge(migrated_settings) as (api, purger):
        yield api, purger
        purger.release.set()


@contextlib.contextmanager
def serving_a_held_purge(
    migrated_settings: CassandraSettings, shutdown_grace: timedelta | None = None
) -> Iterator[tuple[Api, PurgeHeldAtItsFirstRow]]:
    """An API whose purges wait at their first row until released."""
    purges: list[PurgeHeldAtItsFirstRow] = []

    def build(
        connection: CassandraConnection, auth: Authenticator, api: ApiSettings, clock: FakeClock
    ) -> ApiServicers:
        servicers = build_servicers(connection, auth, api, clock)
        purges.append(PurgeHeldAtItsFirstRow(connection.session))
        history = DeliveryHistory(connection.session, api.retention.history)
        admin = AdminServicer(UserDataEraser(purges[-1], history, clock), auth)
        return dataclasses.replace(servicers, admin=admin)

    clock = FakeClock(SEED_NOW)
    with running_api(migrated_settings, clock, build=build, shutdown_grace=shutdown_grace) as api:
        yield api, purges[0]


def active_count(cassandra: CassandraConnection, user: str) -> int | None:
    row = cassandra.session.execute(
        "SELECT active_count FROM reminders WHERE user_id = %s LIMIT 1", (user,)
    ).one()
    return None if row is None else row.active_count


def live_rows(cassandra: CassandraConnection, user: str) -> int:
    rows = cassandra.session.execute("SELECT status FROM reminders WHERE user_id = %s", (user,))
    return sum(1 for row in rows if row.status not in (None, "deleted"))


def purge(api: Api, user: str, timeout_s: float = 60) -> pb.DeleteUserDataResponse:
    request = pb.DeleteUserDataRequest(user_id=user)
    return api.admin.DeleteUserData(request, metadata=api.as_admin(), timeout=timeout_s)


def test_creates_are_refused_while_a_purge_runs_and_accepted_after_it(
    held: tuple[Api, PurgeHeldAtItsFirstRow], user: str, cassandra: CassandraConnection
) -> None:
    """A create landing behind the purge's listing would outlive the purge: none can.
    Refused ones leave no create record; a user's delete meanwhile counts down from the
    fence and leaves the purge to finish."""
    api, purger = held
    md = api.as_user(user)
    first, second = (create(api, user, weekly_monday_nine()) for _ in range(2))
    with ThreadPoolExecutor(1) as pool:
        purging = pool.submit(purge, api, user)
        assert purger.fenced.wait(30)

        late = pb.CreateReminderRequest(
            reminder=pb.Reminder(text="too late", schedule=weekly_monday_nine()),
            request_id="late-request",
        )
        refused = lambda: api.reminders.CreateReminder(late, metadata=md)  # noqa: E731
        assert code_of(refused) == grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(refused) == "USER_DATA_BEING_DELETED"
        records = cassandra.session.execute(
            "SELECT request_id FROM create_requests WHERE user_id = %s", (user,)
        )
        assert "late-request" not in {row.request_id for row in records}
        api.reminders.DeleteReminder(pb.DeleteReminderRequest(id=second.id), metadata=md)

        purger.release.set()
        answer = purging.result(60)

    assert (answer.reminders_deleted, answer.rings_in_flight) == (2, 0)
    assert live_rows(cassandra, user) == 0
    assert active_count(cassandra, user) is None
    after = create(api, user, weekly_monday_nine())
    assert after.id not in {first.id, second.id}
    assert (live_rows(cassandra, user), active_count(cassandra, user)) == (1, 1)


def test_a_purge_whose_caller_gave_up_still_finishes(
    held: tuple[Api, PurgeHeldAtItsFirstRow], user: str, cassandra: CassandraConnection
) -> None:
    """Cut in the middle, a purge would leave the fence up (creates refused) and rows
    behind; it runs to its end whatever its caller does."""
    api, purger = held
    create(api, user, weekly_monday_nine())
    with pytest.raises(grpc.RpcError) as gave_up:
        purge(api, user, timeout_s=1)
    assert gave_up.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    purger.release.set()
    for _ in range(100):
        if active_count(cassandra, user) is None:
            break
        time.sleep(0.1)
    assert (live_rows(cassandra, user), active_count(cassandra, user)) == (0, None)
    create(api, user, weekly_monday_nine())
    # Run again, it removes only what was made since.
    again = purge(api, user)
    assert (again.reminders_deleted, again.requests_deleted) == (1, 1)


def test_a_purge_the_shutdown_grace_cuts_short_is_named_in_the_audit_trail(
    migrated_settings: CassandraSettings,
    user: str,
    cassandra: CassandraConnection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stopping server lets a purge run on through its grace, then cancels it; its caller
    may be gone, so the audit trail says whose deletion to run again."""
    with (
        caplog.at_level(logging.INFO, logger="reminders.audit"),
        ThreadPoolExecutor(1) as pool,
    ):
        grace = timedelta(seconds=1)
        with serving_a_held_purge(migrated_settings, shutdown_grace=grace) as (api, purger):
            create(api, user, weekly_monday_nine())
            purging = pool.submit(purge, api, user)
            assert purger.fenced.wait(30)
        # Stopped, its grace over with the purge still held at its first row: cancelled.
        assert purger.cancelled.is_set()
        with pytest.raises(grpc.RpcError):
            purging.result(30)
        purger.release.set()

    audit = [r.getMessage() for r in caplog.records if r.name == "reminders.audit"]
    assert audit == [
        f"operator 'ops' deletes all data of user {user!r}",
        f"operator 'ops''s deletion of all data of user {user!r} failed (the server stopped);"
        " run it again: the user's creates stay refused until a deletion finishes (a new run"
        " takes this one's fence over 2 minutes after its last refresh)",
    ]
    assert live_rows(cassandra, user) == 1  # its first row not deleted


def test_a_purge_reports_the_rings_in_flight(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    create(api, user, weekly_monday_nine())  # a quiet one beside it
    ringing = create(api, user, weekly_monday_nine())
    claimed = cassandra.session.execute(
        "UPDATE reminders SET status = 'sending', claim_token = %s"
        " WHERE user_id = %s AND reminder_id = %s IF status = 'pending'",
        (uuid.uuid4(), user, uuid.UUID(ringing.id)),
    ).one()
    assert claimed.applied

    answer = purge(api, user)

    assert (answer.reminders_deleted, answer.rings_in_flight) == (2, 1)


def test_creates_racing_a_purge_leave_the_count_equal_to_the_rows_left(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    """Whatever lands before or after the purge, the cap's count stays true: a count left
    below the rows would let the cap be passed, one above it would refuse creates."""
    md = api.as_user(user)

    def create_one(index: int) -> str:
        request = pb.CreateReminderRequest(
            reminder=pb.Reminder(text=f"r{index}", schedule=weekly_monday_nine()),
            request_id=f"race-{index}",
        )
        try:
            api.reminders.CreateReminder(request, metadata=md, timeout=30)
            return "created"
        except grpc.RpcError as error:
            return error.code().name

    with ThreadPoolExecutor(8) as pool:
        creates: list[Future[str]] = [pool.submit(create_one, i) for i in range(12)]
        purging = pool.submit(purge, api, user)
        creates += [pool.submit(create_one, i) for i in range(12, 24)]
        answers = [future.result(60) for future in creates]
        purging.result(60)

    assert set(answers) <= {"created", "FAILED_PRECONDITION"}
    assert (active_count(cassandra, user) or 0) == live_rows(cassandra, user)


class StoreReadingAFenceItsPurgeThenLifts(ReminderStore):
    """A create, its request recorded, tries its row with a count that read a purge's
    fence (`read_the_fence`), or the count it read before that purge; that purge then
    finishes, its create records (this one's too) deleted and its fence lifted, before
    the create reads the count again through Paxos and lands its row."""

    def __init__(self, session: Session, *, read_the_fence: bool = True) -> None:
        super().__init__(session, Retention())
        self._purge = UserPurge(session, HANDOFF_WINDOW)
        self._read_the_fence = read_the_fence
        self.purged = False

    async def create(self, reminder: Reminder, active_count: int | None, max_active: int) -> bool:
        if self.purged:
            return await super().create(reminder, active_count, max_active)
        self.purged = True
        await self._purge.run(reminder.user_id, SEED_NOW)
        compared = PURGE_FENCE if self._read_the_fence else active_count
        return await super().create(reminder, compared, max_active)


@pytest.mark.parametrize(
    "read_the_fence", [True, False], ids=["count-read-the-fence", "count-read-before-it"]
)
def test_a_create_landing_after_a_purge_keeps_its_record_so_a_retry_makes_no_other(
    cassandra: CassandraConnection, user: str, read_the_fence: bool
) -> None:
    """The record, written before the purge's lift, went with the purge's; the row landed
    after the lift. A retry of the create (safe, says the contract) made a second
    reminder: also when the create's count was read before the fence (it only lost its
    compare, to the lifted count), which nothing marked as a purge seen."""
    schedule = parse_repeat("every Monday 09:00", "America/New_York", datetime(2026, 10, 19, 10))
    honest = RemindersApp(
        ReminderStore(cassandra.session, Retention()), Limits(), FakeClock(SEED_NOW)
    )
    asyncio.run(honest.create(user, "earlier", "water the plants", schedule, b"earlier"))
    racing_store = StoreReadingAFenceItsPurgeThenLifts(
        cassandra.session, read_the_fence=read_the_fence
    )
    racing = RemindersApp(racing_store, Limits(), FakeClock(SEED_NOW))
    made = asyncio.run(racing.create(user, "req", "call mom", schedule, b"payload"))
    assert racing_store.purged
    assert live_rows(cassandra, user) == 1  # the earlier one purged, this one made after

    retried = asyncio.run(honest.create(user, "req", "call mom", schedule, b"payload"))
    assert retried.reminder_id == made.reminder_id
    assert live_rows(cassandra, user) == 1


class StoreFailingToRecordAgain(StoreReadingAFenceItsPurgeThenLifts):
    """As above, and the record written again after the row landed times out, the first
    `failures` times."""

    def __init__(self, session: Session, failures: int) -> None:
        super().__init__(session)
        self.failures = failures

    async def record_create_request(self, user_id: str, request_id: str, *args: Any) -> Any:
        if self.purged and self.failures > 0:
            self.failures -= 1
            raise OperationTimedOut("injected")
        return await super().record_create_request(user_id, request_id, *args)


@pytest.mark.parametrize("failures", [1, 10], ids=["once", "every-time"])
def test_a_create_whose_row_landed_is_answered_with_it_though_recording_it_again_fails(
    cassandra: CassandraConnection, user: str, failures: int
) -> None:
    """It was answered "unavailable; retry", its reminder made: the retry, finding no
    record, made a second one. Recorded on a second try; else answered all the same."""
    schedule = parse_repeat("every Monday 09:00", "America/New_York", datetime(2026, 10, 19, 10))
    racing = RemindersApp(
        StoreFailingToRecordAgain(cassandra.session, failures), Limits(), FakeClock(SEED_NOW)
    )

    made = asyncio.run(racing.create(user, "req", "call mom", schedule, b"payload"))

    assert live_rows(cassandra, user) == 1
    honest = RemindersApp(
        ReminderStore(cassandra.session, Retention()), Limits(), FakeClock(SEED_NOW)
    )
    retried = asyncio.run(honest.create(user, "req", "call mom", schedule, b"payload"))
    # Recorded on the second try: the retry finds it. Never recorded: a second reminder.
    assert (retried.reminder_id == made.reminder_id) is (failures == 1)


def fence_owner(cassandra: CassandraConnection, user: str) -> Any:
    return cassandra.session.execute(
        "SELECT active_count, purge_id FROM reminders WHERE user_id = %s LIMIT 1", (user,)
    ).one()


def test_a_second_purge_while_one_runs_joins_it_here_and_waits_its_turn_elsewhere(
    held: tuple[Api, PurgeHeldAtItsFirstRow], user: str, cassandra: CassandraConnection
) -> None:
    """A caller's retry reaches this replica (it joins the purge under way) or another one
    (UNAVAILABLE until that purge is done). Two purges of one user at once each thought
    the other's fence their own: the first lifted it while the second still deleted, so a
    create in between was purged and its count left behind for good."""
    api, purger = held
    create(api, user, weekly_monday_nine())
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(purge, api, user)
        assert purger.fenced.wait(30)
        retried_here = pool.submit(purge, api, user)

        async def elsewhere() -> None:
            await UserPurge(cassandra.session, HANDOFF_WINDOW).run(user, SEED_NOW)

        with pytest.raises(Unavailable) as refused:
            asyncio.run(elsewhere())
        assert refused.value.reason == "PURGE_UNDER_WAY"

        purger.release.set()
        assert first.result(60) == retried_here.result(60)
    assert first.result().reminders_deleted == 1
    assert fence_owner(cassandra, user) is None  # fence lifted, nothing left
    create(api, user, weekly_monday_nine())
    assert (live_rows(cassandra, user), active_count(cassandra, user)) == (1, 1)


def test_a_deletion_found_under_way_on_another_server_is_audited_as_such_not_as_failed(
    held: tuple[Api, PurgeHeldAtItsFirstRow],
    api: Api,
    user: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The retry reaching another server is answered PURGE_UNDER_WAY; its audit line said
    the deletion failed and was to be run again, while the first server finished it."""
    holding, purger = held
    create(holding, user, weekly_monday_nine())
    with ThreadPoolExecutor(1) as pool, caplog.at_level(logging.INFO, logger="reminders.audit"):
        first = pool.submit(purge, holding, user)
        assert purger.fenced.wait(30)
        assert reason_of(lambda: purge(api, user)) == "PURGE_UNDER_WAY"
        # A gateway's Retry-After: a purge takes seconds.
        assert retry_delay_of(lambda: purge(api, user)) == timedelta(seconds=5)
        purger.release.set()
        assert first.result(60).reminders_deleted == 1

    audit = [r.getMessage() for r in caplog.records if r.name == "reminders.audit"]
    assert not [line for line in audit if "failed" in line], audit
    assert (
        f"operator 'ops''s deletion of all data of user {user!r} found another under way"
        " (on another server): that one finishes it" in audit
    ), audit


def test_a_purge_taken_over_deletes_nothing_more_and_leaves_the_fence_to_its_new_owner(
    held: tuple[Api, PurgeHeldAtItsFirstRow], user: str, cassandra: CassandraConnection
) -> None:
    api, purger = held
    create(api, user, weekly_monday_nine())
    with ThreadPoolExecutor(1) as pool:
        stalled = pool.submit(purge, api, user)
        assert purger.fenced.wait(30)
        successor = uuid.uuid4()  # as a purge taking over a fence it found stale
        cassandra.session.execute(
            "UPDATE reminders SET purge_id = %s WHERE user_id = %s", (successor, user)
        )
        purger.release.set()
        with pytest.raises(grpc.RpcError) as answered:
            stalled.result(60)
    assert answered.value.code() == grpc.StatusCode.UNAVAILABLE
    assert live_rows(cassandra, user) == 1  # not its rows any more
    owner = fence_owner(cassandra, user)
    assert (owner.active_count, owner.purge_id) == (2_000_000_000, successor)


def test_the_fence_of_a_purge_that_died_is_taken_over_by_the_next(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    """A pod killed mid-purge leaves its fence: creates are refused until a purge runs
    again, which takes the fence over once it is stale by the database's clock."""
    create(api, user, weekly_monday_nine())
    cassandra.session.execute(
        "UPDATE reminders SET active_count = 2000000000, purge_id = %s,"
        " purge_at = '2026-01-01T00:00:00Z' WHERE user_id = %s",
        (uuid.uuid4(), user),
    )
    assert reason_of(lambda: create(api, user, weekly_monday_nine())) == ("USER_DATA_BEING_DELETED")

    answer = purge(api, user)

    assert answer.reminders_deleted == 1
    assert fence_owner(cassandra, user) is None
    create(api, user, weekly_monday_nine())
    assert (live_rows(cassandra, user), active_count(cassandra, user)) == (1, 1)


class PurgeStalling(UserPurge):
    """The real purge, stalling once until released: after its last row ("row"), or
    after the refresh that precedes its delete of the create records ("refresh")."""

    def __init__(self, session: Session, at: str) -> None:
        super().__init__(session, HANDOFF_WINDOW)
        self.at = at
        self.stalled = asyncio.Event()
        self.release = asyncio.Event()

    async def _stall(self, where: str) -> None:
        if where == self.at and not self.stalled.is_set():
            self.stalled.set()
            await self.release.wait()

    async def _purge_row(
        self, user_id: str, purge_id: uuid.UUID, listed: Any, now: datetime
    ) -> bool | None:
        purged = await super()._purge_row(user_id, purge_id, listed, now)
        await self._stall("row")
        return purged

    async def _refresh_fence(self, user_id: str, purge_id: uuid.UUID) -> None:
        await super()._refresh_fence(user_id, purge_id)
        await self._stall("refresh")


@pytest.mark.parametrize("stalled_at", ["row", "refresh"])
def test_a_purge_that_stalled_and_was_taken_over_leaves_later_create_records_alone(
    api: Api, user: str, cassandra: CassandraConnection, stalled_at: str
) -> None:
    """A purge stalls (a paused pod) past STALE_AFTER; an operator's retry takes its fence
    over, finishes and lifts it; the user creates a reminder. The stalled purge, waking,
    deleted every create record of the user, that one's too: the client's retry of its
    create (its answer lost) then made a second reminder."""
    create(api, user, weekly_monday_nine())
    request = pb.CreateReminderRequest(
        reminder=pb.Reminder(text="after", schedule=weekly_monday_nine()), request_id="after"
    )

    def create_after() -> pb.Reminder:
        return api.reminders.CreateReminder(request, metadata=api.as_user(user))

    async def scenario() -> pb.Reminder:
        stalling = PurgeStalling(cassandra.session, stalled_at)
        first = asyncio.create_task(stalling.run(user, SEED_NOW))
        await asyncio.wait_for(stalling.stalled.wait(), 30)
        # Unrefreshed for STALE_AFTER, as the database sees it: the retry takes it over.
        cassandra.session.execute(
            "UPDATE reminders SET purge_at = '2026-01-01T00:00:00Z' WHERE user_id = %s", (user,)
        )
        await UserPurge(cassandra.session, HANDOFF_WINDOW).run(user, SEED_NOW)
        made = await asyncio.to_thread(create_after)
        stalling.release.set()
        with pytest.raises(Unavailable) as refused:
            await first
        assert refused.value.reason == "PURGE_UNDER_WAY"
        return made

    made = asyncio.run(scenario())

    assert create_after().id == made.id  # the replay finds its record: no second reminder
    assert (live_rows(cassandra, user), active_count(cassandra, user)) == (1, 1)


class PurgeMeetingStorageTrouble(UserPurge):
    """The real purge, whose first row delete lands but is answered with a write timeout
    (outcome unknown), and whose first fence refresh fails (the driver timed out)."""

    def __init__(self, session: Session) -> None:
        super().__init__(session, HANDOFF_WINDOW)
        self.timeouts = 0
        self.failed_refreshes = 0

    async def _delete_row(self, as_read: tuple[object, ...], purge_id: uuid.UUID) -> bool:
        applied = await super()._delete_row(as_read, purge_id)
        if not self.timeouts:
            self.timeouts += 1
            raise WriteTimeout("injected", write_type=WriteType.CAS)
        return applied

    async def _refresh_fence(self, user_id: str, purge_id: uuid.UUID) -> None:
        if not self.failed_refreshes:
            self.failed_refreshes += 1
            raise OperationTimedOut("injected")
        await super()._refresh_fence(user_id, purge_id)


def test_a_purge_meeting_storage_trouble_finishes_and_lifts_its_fence(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    """One timeout ended a purge with its fence up: every create of the user was refused
    until an operator ran it again (the fence does not lift by itself)."""
    for _ in range(3):
        create(api, user, weekly_monday_nine())
    purger = PurgeMeetingStorageTrouble(cassandra.session)

    purged = asyncio.run(purger.run(user, SEED_NOW))

    assert (purger.timeouts, purger.failed_refreshes) == (1, 1)
    assert (purged.reminders, purged.requests) == (3, 3)
    assert fence_owner(cassandra, user) is None
    assert rows_per_table(cassandra, user)["create_requests"] == 0
    create(api, user, weekly_monday_nine())
    assert (live_rows(cassandra, user), active_count(cassandra, user)) == (1, 1)


class PurgeRecordingItsSteps(UserPurge):
    """The real purge, recording its row deletes and fence refreshes; its first delete is
    refused for want of replicas (nothing sent: not an unknown outcome), ending its
    first run."""

    def __init__(self, session: Session) -> None:
        super().__init__(session, HANDOFF_WINDOW)
        self.steps: list[str] = []

    async def _delete_row(self, as_read: tuple[object, ...], purge_id: uuid.UUID) -> bool:
        self.steps.append("delete")
        if self.steps == ["delete"]:
            raise CassandraUnavailable("injected", required_replicas=1, alive_replicas=0)
        return await super()._delete_row(as_read, purge_id)

    async def _refresh_fence(self, user_id: str, purge_id: uuid.UUID) -> None:
        self.steps.append("refresh")
        await super()._refresh_fence(user_id, purge_id)


def test_a_purge_run_again_under_its_own_fence_refreshes_it_first(
    api: Api, user: str, cassandra: CassandraConnection
) -> None:
    """A run cut short by storage is run again after a backoff; the fence it finds is its
    own, last refreshed before that wait: refreshed again before any delete, so the wait
    does not bring it nearer to another purge taking it over mid-run."""
    for _ in range(3):
        create(api, user, weekly_monday_nine())
    purger = PurgeRecordingItsSteps(cassandra.session)

    purged = asyncio.run(purger.run(user, SEED_NOW))

    assert purger.steps[:2] == ["delete", "refresh"]
    assert purged.reminders == 3
    assert fence_owner(cassandra, user) is None
