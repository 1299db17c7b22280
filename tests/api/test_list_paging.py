"""ListReminders reads a bounded number of rows per call, through real gRPC on the real
Cassandra: a filter matching few of a user's many rows (or many deleted rows) answers
short, possibly empty, pages whose token resumes the scan, never one call that scans the
whole partition."""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Iterator
from typing import Any, cast

import grpc
import pytest
from cassandra.cluster import Session

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.api.auth import Authenticator
from reminders_svc.api.service import ApiServicers, build_servicers
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import CassandraSettings
from reminders_svc.domain.limits import Limits
from reminders_svc.storage.session import CassandraConnection
from tests.api.conftest import SEED_NOW, Api, FakeClock, code_of, running_api, weekly_monday_nine

SCAN = 25  # rows one List call may read, far below the production bound
REMINDERS = 120  # several scan bounds' worth
DELETED = 10
PAUSED = 3


class ListQueries:
    """A session that notes the LIMIT of every listing query; all else goes through."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.limits: list[int] = []

    def execute_async(self, statement: Any, params: Any = None, **options: Any) -> Any:
        if "reminder_id > ?" in getattr(statement, "query_string", ""):
            self.limits.append(params[2])
        return self._session.execute_async(statement, params, **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


@pytest.fixture(scope="module")
def scanning(migrated_settings: CassandraSettings) -> Iterator[tuple[Api, ListQueries]]:
    """An API whose store reads at most SCAN rows per List call, and its listing queries."""
    queries: list[ListQueries] = []

    def build(
        connection: CassandraConnection, auth: Authenticator, api: ApiSettings, clock: FakeClock
    ) -> ApiServicers:
        queries.append(ListQueries(connection.session))
        counted = dataclasses.replace(connection, session=cast(Session, queries[-1]))
        return build_servicers(counted, auth, api, clock)

    limits = Limits(list_scan_rows=SCAN)
    with running_api(migrated_settings, FakeClock(SEED_NOW), limits, build=build) as api:
        yield api, queries[0]


@pytest.fixture(scope="module")
def crowded(scanning: tuple[Api, ListQueries]) -> tuple[str, list[str], list[str]]:
    """A user with REMINDERS rows: DELETED deleted among them, the last PAUSED (by id,
    the listing's order) paused. Returns the user, the live ids and the paused ids."""
    api, _ = scanning
    user = f"user-{uuid.uuid4().hex[:10]}"
    md = api.as_user(user)
    ids = sorted(
        (
            api.reminders.CreateReminder(
                pb.CreateReminderRequest(
                    reminder=pb.Reminder(text=f"r{i}", schedule=weekly_monday_nine()),
                    request_id=uuid.uuid4().hex,
                ),
                metadata=md,
            ).id
            for i in range(REMINDERS)
        ),
        key=uuid.UUID,
    )
    deleted = ids[20 : 20 + DELETED]  # a run of deleted rows the listing must skip
    for reminder_id in deleted:
        api.reminders.DeleteReminder(pb.DeleteReminderRequest(id=reminder_id), metadata=md)
    paused = ids[-PAUSED:]
    for reminder_id in paused:
        api.reminders.PauseReminder(pb.PauseReminderRequest(id=reminder_id), metadata=md)
    return user, [i for i in ids if i not in deleted], paused


def list_all(
    scanning: tuple[Api, ListQueries],
    user: str,
    page_size: int,
    state: pb.Reminder.State.ValueType = pb.Reminder.STATE_UNSPECIFIED,
) -> list[pb.ListRemindersResponse]:
    """Every page of a listing, checking that no call asks for more than SCAN rows."""
    api, queries = scanning
    pages: list[pb.ListRemindersResponse] = []
    token = ""
    while len(pages) <= REMINDERS:  # a listing that never ends fails below, not hangs
        queries.limits.clear()
        page = api.reminders.ListReminders(
            pb.ListRemindersRequest(page_size=page_size, page_token=token, state=state),
            metadata=api.as_user(user),
        )
        assert 0 < sum(queries.limits) <= SCAN, queries.limits
        assert len(page.reminders) <= page_size
        pages.append(page)
        token = page.next_page_token
        if not token:
            return pages
    raise AssertionError("the listing did not end")


def ids_of(pages: list[pb.ListRemindersResponse]) -> list[str]:
    return [reminder.id for page in pages for reminder in page.reminders]


def test_a_filter_matching_only_the_last_rows_is_answered_in_bounded_calls(
    scanning: tuple[Api, ListQueries], crowded: tuple[str, list[str], list[str]]
) -> None:
    user, _, paused = crowded
    pages = list_all(scanning, user, page_size=1, state=pb.Reminder.STATE_PAUSED)

    assert ids_of(pages) == paused  # in order, none skipped or repeated
    assert all(r.state == pb.Reminder.STATE_PAUSED for page in pages for r in page.reminders)
    # The rows before the paused ones took several calls, each stopping at the bound
    # with an empty page and a token that resumes the scan.
    assert len(pages) >= math.ceil((REMINDERS - PAUSED) / SCAN)
    assert any(not page.reminders and page.next_page_token for page in pages)


@pytest.mark.parametrize("page_size", [7, 40])
def test_unfiltered_pages_skip_deleted_rows_and_cover_every_live_one_once(
    scanning: tuple[Api, ListQueries], crowded: tuple[str, list[str], list[str]], page_size: int
) -> None:
    user, live, _ = crowded
    pages = list_all(scanning, user, page_size)

    assert ids_of(pages) == live
    # A page larger than the bound is answered short, with a token.
    assert max(len(page.reminders) for page in pages) == min(page_size, SCAN)


def test_a_resuming_token_stays_tied_to_its_filter_and_its_caller(
    scanning: tuple[Api, ListQueries], crowded: tuple[str, list[str], list[str]]
) -> None:
    api, _ = scanning
    user, _, _ = crowded
    md = api.as_user(user)
    first = api.reminders.ListReminders(
        pb.ListRemindersRequest(page_size=1, state=pb.Reminder.STATE_PAUSED), metadata=md
    )
    assert not first.reminders  # stopped at the bound, with a token
    assert first.next_page_token

    def with_other_filter() -> object:
        return api.reminders.ListReminders(
            pb.ListRemindersRequest(page_size=1, page_token=first.next_page_token), metadata=md
        )

    assert code_of(with_other_filter) == grpc.StatusCode.INVALID_ARGUMENT

    def as_another_user() -> object:
        request = pb.ListRemindersRequest(
            page_size=1, state=pb.Reminder.STATE_PAUSED, page_token=first.next_page_token
        )
        return api.reminders.ListReminders(request, metadata=api.as_user(f"{user}-other"))

    # The same filter, another caller: a token is its own listing's.
    assert code_of(as_another_user) == grpc.StatusCode.INVALID_ARGUMENT
