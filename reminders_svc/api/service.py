"""The gRPC servicers: authenticate, convert, call the use case, convert back. Nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from genproto.reminders.v1 import reminders_pb2 as pb
from genproto.reminders.v1 import reminders_pb2_grpc as pb_grpc
from reminders_svc.api import convert, paging
from reminders_svc.api.auth import Authenticator
from reminders_svc.api.errors import MAY_HAVE_BEEN_APPLIED, translated
from reminders_svc.api.settings import ApiSettings
from reminders_svc.app import Changed, Clock, RemindersApp, utc_now
from reminders_svc.config import Retention
from reminders_svc.deliveries import DeliveryRecords
from reminders_svc.domain.errors import DeadlineExceeded, InvalidArgument
from reminders_svc.domain.limits import span_to
from reminders_svc.domain.reminder import Reminder, Status
from reminders_svc.erasure import UserDataEraser
from reminders_svc.schedule import Schedule, ScheduleError, occurrences, tzdata_version
from reminders_svc.schedule.zones import MAX_YEAR, MIN_YEAR, load_zone
from reminders_svc.storage.history import DeliveryHistory
from reminders_svc.storage.migrations import require_current_schema
from reminders_svc.storage.purge import UserPurge
from reminders_svc.storage.reminders_store import ReminderStore
from reminders_svc.storage.session import CassandraConnection
from reminders_svc.timestamps import timestamp

Context = grpc.aio.ServicerContext[Any, Any]
_UPDATABLE = frozenset({"text", "schedule"})
# A Reminder's fields no caller sets (AIP-203 OUTPUT_ONLY and IDENTIFIER; the version is
# the compare, not a value): ignored in an update mask (AIP-161), so the mask a client
# reads with can be sent back with the whole resource.
_NOT_UPDATED = frozenset(pb.Reminder.DESCRIPTOR.fields_by_name) - _UPDATABLE
_MAX_PREVIEW = 100
_PREVIEW_FROM = (
    datetime(MIN_YEAR, 1, 2, tzinfo=UTC),
    datetime(MAX_YEAR, 12, 30, 23, 59, 59, tzinfo=UTC),
)
# The expansion steps one preview may spend (~0.2 s of CPU on a slow core): a dense
# BYSETPOS rule costs ~1,000 steps a ring, so 100 of them would hold a core for ~0.5 s.
_PREVIEW_MAX_STEPS = 50_000


def metadata_of(context: Context) -> tuple[tuple[str, str | bytes], ...]:
    return tuple((key, value) for key, value in context.invocation_metadata() or ())


class RemindersServicer(pb_grpc.RemindersServiceServicer):
    def __init__(
        self,
        app: RemindersApp,
        deliveries: DeliveryRecords,
        auth: Authenticator,
        settings: ApiSettings,
        clock: Clock = utc_now,
    ) -> None:
        self._app = app
        self._clock = clock
        self._deliveries = deliveries
        self._auth = auth
        self._limits = settings.limits
        self._write_deadline = settings.write_deadline.total_seconds()
        # Previews expand off the event loop, one at a time: many costly ones at once
        # queue here instead of stalling every other call this process serves. A worker
        # of its own, so an expansion whose caller gave up still holds it to its end.
        self._expander = ThreadPoolExecutor(max_workers=1, thread_name_prefix="preview")
        # Pages holding paused reminders are read off the loop too (each shows what
        # resuming now would ring: an expansion, up to ~5 ms for a costly COUNT rule, so
        # 2-2.5 s for a page of 500), apart from previews so a list never waits behind one.
        self._page_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="page")

    @contextlib.asynccontextmanager
    async def _within_write_deadline(self) -> AsyncIterator[None]:
        """Bounds a change in time (DESIGN.md invariant 3). A statement already sent may
        still land, so running out is not "unavailable, retry" but "may have been applied"."""
        deadline = asyncio.timeout(self._write_deadline)
        try:
            async with deadline:
                yield
        except TimeoutError as error:
            if not deadline.expired():
                raise  # the driver's own timeout: a storage error, answered as such
            raise DeadlineExceeded(
                f"the change did not finish in time and {MAY_HAVE_BEEN_APPLIED}"
            ) from error

    def _page_size(self, requested: int) -> int:
        return paging.page_size(
            requested, self._limits.default_page_size, self._limits.max_page_size
        )

    def _user(self, context: Context) -> str:
        return self._auth.user_id(metadata_of(context))

    @translated
    async def CreateReminder(
        self, request: pb.CreateReminderRequest, context: Context
    ) -> pb.Reminder:
        user = self._user(context)
        convert.require(request, "reminder", "reminder")
        convert.require(request.reminder, "schedule", "reminder.schedule")
        # The payload that a replay must repeat: what the caller asked for, not when.
        payload = convert.create_payload(request.reminder)
        try:
            schedule = convert.schedule_from_proto(
                request.reminder.schedule, self._clock(), "reminder.schedule"
            )
        except InvalidArgument:
            # A repeat without a start begins now, so a replay can fail where its original
            # passed (its end now behind it): answer with what the original made. Any other
            # schedule, or one wrong at any start, is refused whenever it comes, without a
            # read (so while storage is down too).
            earliest_record = self._clock() - Retention.tombstone  # none is older
            if not convert.valid_when_sent_at(request.reminder.schedule, earliest_record):
                raise
            if (made := await self._app.replayed(user, request.request_id, payload)) is not None:
                return convert.reminder_to_proto(made, self._clock())
            raise
        with convert.schedule_errors(request.reminder.schedule, "reminder.schedule"):
            async with self._within_write_deadline():
                created = await self._app.create(
                    user, request.request_id, request.reminder.text, schedule, payload
                )
        return convert.reminder_to_proto(created, self._clock())

    @translated
    async def GetReminder(self, request: pb.GetReminderRequest, context: Context) -> pb.Reminder:
        user = self._user(context)
        reminder = await self._app.get(user, convert.reminder_id(request.id))
        return convert.reminder_to_proto(reminder, self._clock())

    @translated
    async def ListReminders(
        self, request: pb.ListRemindersRequest, context: Context
    ) -> pb.ListRemindersResponse:
        user = self._user(context)
        status = convert.state_filter(request.state)
        pages = paging.Pages(f"reminders:{status or ''}:{paging.owner_tag(user)}", uuid.UUID, str)
        after = pages.cursor(request.page_token)
        size = self._page_size(request.page_size)
        page, next_after = await self._app.list(user, after, size, status)
        seen = await self._as_seen(page)
        listed = pb.ListRemindersResponse(reminders=seen, next_page_token=pages.token(next_after))
        budget = self._limits.max_page_bytes
        if listed.ByteSize() <= budget:  # one call in C: a page almost always fits
            return listed
        kept = _within_bytes(seen, budget)
        return pb.ListRemindersResponse(
            reminders=seen[:kept], next_page_token=pages.token(page[kept - 1].reminder_id)
        )

    async def _as_seen(self, page: list[Reminder]) -> list[pb.Reminder]:
        now = self._clock()

        def read() -> list[pb.Reminder]:
            return [convert.reminder_to_proto(reminder, now) for reminder in page]

        if not any(reminder.status is Status.PAUSED for reminder in page):
            return read()
        return await asyncio.get_running_loop().run_in_executor(self._page_reader, read)

    @translated
    async def UpdateReminder(
        self, request: pb.UpdateReminderRequest, context: Context
    ) -> pb.Reminder:
        user = self._user(context)
        paths = set(request.update_mask.paths)
        if paths == {"*"}:  # AIP-134: every field the caller may change
            paths = set(_UPDATABLE)
        if unknown := paths - _UPDATABLE - _NOT_UPDATED:
            raise InvalidArgument("update_mask", f"cannot update {', '.join(sorted(unknown))}")
        paths -= _NOT_UPDATED
        if not paths:
            raise InvalidArgument("update_mask", "name the fields to change: text, schedule")
        convert.require(request, "reminder", "reminder")
        version = convert.version_seen(request.reminder.version, "reminder.version")
        if version is None:
            raise InvalidArgument("reminder.version", "the version you last saw is required")
        target = convert.reminder_id(request.reminder.id, "reminder.id")
        schedule = None
        if "schedule" in paths:
            convert.require(request.reminder, "schedule", "reminder.schedule")
            schedule = convert.schedule_from_proto(
                request.reminder.schedule, self._clock(), "reminder.schedule"
            )
        text = request.reminder.text if "text" in paths else None
        with convert.schedule_errors(request.reminder.schedule, "reminder.schedule"):
            async with self._within_write_deadline():
                updated = await self._app.update(user, target, version, text, schedule)
        return self._answer(updated)

    @translated
    async def DeleteReminder(
        self, request: pb.DeleteReminderRequest, context: Context
    ) -> pb.DeleteReminderResponse:
        user = self._user(context)
        target = convert.reminder_id(request.id)
        async with self._within_write_deadline():
            deleted = await self._app.delete(user, target, convert.version_seen(request.version))
        return pb.DeleteReminderResponse(
            reminder=self._answer(deleted), was_sending=deleted.was_sending
        )

    @translated
    async def SnoozeReminder(
        self, request: pb.SnoozeReminderRequest, context: Context
    ) -> pb.Reminder:
        user = self._user(context)
        target = convert.reminder_id(request.id)
        which = request.WhichOneof("until")
        if which is None:
            raise InvalidArgument(
                "until", "one of duration, snooze_until_time or snooze_until_local_time is required"
            )
        if which == "duration":
            until: Any = convert.duration_of(request.duration, which, self._limits.max_snooze)
            # Before the reminder is looked up: a bad amount is that, whatever the id.
            self._limits.check_snooze(until, which)
        elif which == "snooze_until_time":
            until = convert.instant_of(request.snooze_until_time, which)
            # Likewise an instant reached already or too far (the app checks the whole
            # range at its own now, unless it is the retry of a snooze that landed).
            self._limits.check_snooze(span_to(until, self._clock()), which, retried=True)
        else:
            # Naive: a local time in the reminder's zone, read as the app snoozes it.
            until = convert.local_time(request.snooze_until_local_time, which)
        async with self._within_write_deadline():
            snoozed = await self._app.snooze(user, target, until, which)
        return self._answer(snoozed)

    @translated
    async def PauseReminder(
        self, request: pb.PauseReminderRequest, context: Context
    ) -> pb.Reminder:
        return await self._state_change(self._app.pause, request, context)

    @translated
    async def ResumeReminder(
        self, request: pb.ResumeReminderRequest, context: Context
    ) -> pb.Reminder:
        return await self._state_change(self._app.resume, request, context)

    async def _state_change(
        self,
        change: Callable[[str, uuid.UUID, int | None], Awaitable[Changed]],
        request: pb.PauseReminderRequest | pb.ResumeReminderRequest,
        context: Context,
    ) -> pb.Reminder:
        """Pause and resume: an id and an optional version the change must find."""
        user = self._user(context)
        target = convert.reminder_id(request.id)
        async with self._within_write_deadline():
            changed = await change(user, target, convert.version_seen(request.version))
        return self._answer(changed)

    def _answer(self, changed: Changed) -> pb.Reminder:
        """A change's answer: the reminder, saying whether a ring it cannot recall may
        still arrive."""
        return convert.reminder_to_proto(
            changed.reminder, self._clock(), ring_in_flight=changed.ring_in_flight
        )

    @translated
    async def PreviewSchedule(
        self, request: pb.PreviewScheduleRequest, context: Context
    ) -> pb.PreviewScheduleResponse:
        self._user(context)
        start = (
            convert.instant_of(request.from_time, "from_time")
            if request.HasField("from_time")
            else self._clock()
        )
        if not _PREVIEW_FROM[0] <= start <= _PREVIEW_FROM[1]:
            # A repeat without a start begins at from_time's local time, up to a day off it
            # in UTC: that must be within the engine's years, or the rule would be blamed.
            first, last = (instant.date().isoformat() for instant in _PREVIEW_FROM)
            raise InvalidArgument("from_time", f"{first} to {last} (UTC)")
        if not 0 <= request.count <= _MAX_PREVIEW:
            raise InvalidArgument("count", f"0 to {_MAX_PREVIEW}")
        convert.require(request, "schedule", "schedule")
        # Named at `start` as a create then would keep it: the preview shows its rings.
        schedule = convert.schedule_from_proto(request.schedule, start, "schedule")
        zone = load_zone(schedule.zone)
        with convert.schedule_errors(request.schedule, "schedule"):
            found = await self._expand(schedule, start, request.count or 10)
        return pb.PreviewScheduleResponse(
            occurrences=[
                pb.Occurrence(
                    time=timestamp(instant),
                    local_time=instant.astimezone(zone).isoformat(),
                )
                for instant in found
            ],
            schedule=convert.schedule_to_proto(schedule),
            tzdata_version=tzdata_version(naming_the_directory=False),
        )

    async def _expand(self, schedule: Schedule, start: datetime, count: int) -> list[datetime]:
        expand = functools.partial(occurrences, schedule, start, count, _PREVIEW_MAX_STEPS)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._expander, expand)
        except ScheduleError as error:
            if error.field != "count":
                raise
            raise InvalidArgument("count", error.message) from None

    @translated
    async def ListDeliveries(
        self, request: pb.ListDeliveriesRequest, context: Context
    ) -> pb.ListDeliveriesResponse:
        user = self._user(context)
        target = convert.reminder_id(request.reminder_id, "reminder_id")
        pages = paging.Pages(f"deliveries:{target}", convert.utc_instant, datetime.isoformat)
        before = pages.cursor(request.page_token)
        size = self._page_size(request.page_size)
        page, next_before = await self._deliveries.page(user, target, before, size)
        return pb.ListDeliveriesResponse(
            deliveries=[convert.delivery_to_proto(d) for d in page],
            next_page_token=pages.token(next_before),
        )


class AdminServicer(pb_grpc.RemindersAdminServiceServicer):
    def __init__(self, eraser: UserDataEraser, auth: Authenticator) -> None:
        self._eraser = eraser
        self._auth = auth

    @translated
    async def DeleteUserData(
        self, request: pb.DeleteUserDataRequest, context: Context
    ) -> pb.DeleteUserDataResponse:
        operator = self._auth.require_admin(metadata_of(context))
        erased = await self._eraser.erase(operator, request.user_id)
        return pb.DeleteUserDataResponse(
            reminders_deleted=erased.reminders,
            deliveries_deleted=erased.deliveries,
            requests_deleted=erased.requests,
            rings_in_flight=erased.rings_in_flight,
        )

    async def finish(self, timeout_s: float) -> None:
        """Let the erasures under way finish within `timeout_s` (a shutdown's grace)."""
        await self._eraser.finish(timeout_s)


@dataclass(frozen=True)
class ApiServicers:
    reminders: RemindersServicer
    admin: AdminServicer

    async def finish(self, timeout_s: float) -> None:
        """Let work the servicers run past their calls finish (an operator's purge)."""
        await self.admin.finish(timeout_s)


def build_servicers(
    connection: CassandraConnection,
    auth: Authenticator,
    settings: ApiSettings,
    clock: Clock = utc_now,
) -> ApiServicers:
    require_current_schema(connection.session, connection.settings.keyspace)
    store = ReminderStore(
        connection.session, settings.retention, list_scan_rows=settings.limits.list_scan_rows
    )
    history = DeliveryHistory(connection.session, settings.retention.history)
    app = RemindersApp(store, settings.limits, clock, settings.still_pushed_for)
    eraser = UserDataEraser(
        UserPurge(connection.session, settings.still_pushed_for), history, clock
    )
    return ApiServicers(
        reminders=RemindersServicer(app, DeliveryRecords(app, history), auth, settings, clock),
        admin=AdminServicer(eraser, auth),
    )


def _within_bytes(reminders: list[pb.Reminder], budget: int) -> int:
    """How many of `reminders`, from the first, fit in `budget` bytes; at least one, so a
    listing always moves on."""
    used = 0
    for count, reminder in enumerate(reminders):
        used += reminder.ByteSize()
        if used > budget and count > 0:
            return count
    return len(reminders)
