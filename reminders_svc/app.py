"""The reminders use cases: read the row, apply a domain step, write it back by LWT.

Takes and returns domain values only; the gRPC layer converts at its boundary. A step
whose LWT loses (a dispatcher or another call changed the row in between) is re-read and
re-applied a bounded number of times; a caller-supplied version that no longer matches
is a VersionConflict, never silently re-applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from reminders_svc.concurrency import UserLocks, to_the_end
from reminders_svc.config import HANDOFF_WINDOW
from reminders_svc.domain import reminder as steps
from reminders_svc.domain.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
    Unavailable,
    UserDataBeingDeleted,
    VersionConflict,
)
from reminders_svc.domain.limits import Limits, over_the_cap, span_to
from reminders_svc.domain.reminder import Reminder, Status
from reminders_svc.schedule import Schedule, ScheduleError, validate_new
from reminders_svc.schedule.zones import round_up, upcoming_utc
from reminders_svc.storage.errors import STORAGE_ERRORS
from reminders_svc.storage.purge import PURGE_FENCE_FLOOR
from reminders_svc.storage.reminders_store import CreateRecord, ReminderStore, StoredReminder

Clock = Callable[[], datetime]
_MAX_ATTEMPTS = 10
# A create's record written again after its row landed (see `_record_again`).
_RECORD_AGAIN_ATTEMPTS = 3

log = logging.getLogger(__name__)


async def _backoff(attempt: int) -> None:
    """Lost an LWT race: wait a little, with jitter, so contenders spread out."""
    if attempt:
        await asyncio.sleep(random.uniform(0, 0.005 * 2**attempt))


async def _finished_despite_cancellation(write: Awaitable[None]) -> None:
    """Runs `write` to its end: a write a create makes once its answer is settled (a
    refusal at the cap, or the row made), which the call's cancellation, its write
    deadline above all, must not cut short or turn into another answer. Cut short, a
    refusal was answered "may have been applied" with its request_id left taken (and the
    caller's retry then marked the record, taking it for good), and a made row was left
    unrecorded for a retry to make again. So the cancellation is absorbed: the caller
    answers right after, and `asyncio.timeout` lets that answer through. It runs past
    the deadline by a request timeout per attempt at most; it writes a request record,
    never a row or a bucket entry, so the deadline's bound on those (DESIGN.md invariant
    3) holds."""
    with contextlib.suppress(asyncio.CancelledError):
        await to_the_end(write)


def utc_now() -> datetime:
    # Cassandra keeps milliseconds; the domain works at that precision so values round-trip.
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


@dataclass(frozen=True)
class Changed:
    """The answer to a change: the reminder as the change left it, and whether a ring
    handed off before the change landed may still reach the user (the row was being
    sent, or a change took its claim away shortly before): no change can recall it, and
    the API says so (DESIGN.md invariant 5)."""

    reminder: Reminder
    ring_in_flight: bool


class Deleted(Changed):
    @property
    def was_sending(self) -> bool:
        """A delete's answer names it so (DeleteReminderResponse.was_sending)."""
        return self.ring_in_flight


def _reused(request_id: str) -> FailedPrecondition:
    return FailedPrecondition(
        "request_id was already used for a different reminder: use a new request_id",
        field="request_id",
        reason="REQUEST_ID_REUSED",
    )


class RemindersApp:
    def __init__(
        self,
        store: ReminderStore,
        limits: Limits,
        clock: Clock = utc_now,
        still_pushed_for: timedelta = HANDOFF_WINDOW,
    ) -> None:
        self._users = UserLocks()
        self._store = store
        self._limits = limits
        self._clock = clock
        self._still_pushed_for = still_pushed_for

    async def create(
        self, user_id: str, request_id: str, text: str, schedule: Schedule, payload: bytes
    ) -> Reminder:
        """Idempotent per (user, request_id); `payload` is the request's canonical bytes.

        A replay answers with the reminder the first request made, even once its time has
        passed or the user is at the cap. A refused create leaves no record behind, so
        its request_id stays free, unless a replay of it marked the record to make its row.
        """
        if not 1 <= len(request_id) <= 128:
            raise InvalidArgument("request_id", "1 to 128 characters required")
        self._limits.check_text(text)
        now = self._clock()
        payload_hash = hashlib.sha256(payload).digest()
        try:
            first = validate_new(schedule, now)
        except ScheduleError:
            if (made := await self.replayed(user_id, request_id, payload)) is not None:
                return made
            raise
        # One at a time per user on this server, from the count read to the row: each
        # create counts the others' rows, so none writes an entry for a row the cap then
        # refuses (across servers, the row's compare-and-set still holds the cap).
        async with self._users.hold(user_id):
            count = await self._count_unless_past_the_cap(user_id, request_id)
            proposed = steps.new_reminder(user_id, text, schedule, first, now)
            return await self._record_and_insert(proposed, request_id, payload_hash, count, now)

    async def _record_and_insert(
        self,
        proposed: Reminder,
        request_id: str,
        payload_hash: bytes,
        count: int | None,
        now: datetime,
    ) -> Reminder:
        user_id = proposed.user_id
        for _ in range(_MAX_ATTEMPTS):
            wanted = CreateRecord(payload_hash, proposed.reminder_id)
            record = await self._store.record_create_request(user_id, request_id, wanted, now)
            if record == wanted:
                break
            # A replay: answer with what the first request made, completing it if the first
            # attempt crashed between the record and the row.
            made = await self._made_by(user_id, request_id, record, payload_hash)
            if made is not None:
                return made
            # Marked first, so the first request, if refused at the cap meanwhile, leaves
            # the record to the row this replay may make. A record already taken back: this
            # request starts over as a new one.
            if await self._store.mark_create_replay(user_id, request_id, record, now):
                proposed = dataclasses.replace(proposed, reminder_id=record.reminder_id)
                break
        else:
            raise Unavailable.contention("this request_id")
        try:
            made, first_try = await self._insert(proposed, count)
        except (QuotaExceeded, UserDataBeingDeleted):
            if record == wanted:
                # This request wrote the record and made nothing: take the record back,
                # unless a replay marked it. (A replay leaves it to the request that wrote
                # it.)
                await _finished_despite_cancellation(self._take_back(user_id, request_id, record))
            raise
        if not first_try:
            # The row landed after losing a compare on the count: a purge may have come
            # and gone meanwhile (its fence read, or its lift the count's change), taking
            # this request's record with its own. Recorded again, now, so that a retry
            # answers with this reminder instead of making a second. (A user's first
            # reminder compares a count that a whole purge leaves as it was, null: a purge
            # run entirely between its record and its row, a few milliseconds, is left.)
            again = CreateRecord(payload_hash, made.reminder_id)
            await _finished_despite_cancellation(
                self._record_again(user_id, request_id, again, now)
            )
        return made

    async def _count_unless_past_the_cap(self, user_id: str, request_id: str) -> int | None:
        """The user's active count (a plain read: the row's compare-and-set checks it),
        after refusing a create the cap refuses before its record is written (a refusal
        writes nothing), unless a record stands: a replay (answered with what it made,
        even at the cap) or a reuse, which the record decides as ever. Refused only by a
        count read through Paxos."""
        limit = self._limits.max_active_per_user

        def at_the_cap(count: int | None) -> bool:
            return limit <= (count or 0) < PURGE_FENCE_FLOOR  # a purge's fence: not here

        count = await self._store.active_count(user_id)
        if not at_the_cap(count):
            return count
        if await self._store.create_record(user_id, request_id) is not None:
            return count  # a replay, or a reuse: the record decides
        count = await self._store.active_count(user_id, serial=True)
        if at_the_cap(count):
            raise over_the_cap(limit)
        return count

    async def _take_back(self, user_id: str, request_id: str, record: CreateRecord) -> None:
        """Best effort: the refusal is the answer, not storage trouble after it (answered
        "unavailable", the caller would retry a request that cannot succeed). A record
        left standing keeps its request_id taken until its retention ends: the same
        request is refused alike, another payload under that id as a reuse."""
        try:
            await self._store.forget_create_request(user_id, request_id, record)
        except STORAGE_ERRORS as error:
            log.warning(
                "a refused create's request record was not taken back (%s)", type(error).__name__
            )

    async def _record_again(
        self, user_id: str, request_id: str, record: CreateRecord, now: datetime
    ) -> None:
        """The row has landed: the call answers with it, whatever this write meets (an
        "unavailable" would have its caller retry, and the retry, finding no record, make
        a second reminder). Tried a few times; then, logged, the row stands unrecorded."""
        for attempt in range(_RECORD_AGAIN_ATTEMPTS):
            try:
                await self._store.record_create_request(user_id, request_id, record, now)
                return
            except STORAGE_ERRORS as error:
                if attempt == _RECORD_AGAIN_ATTEMPTS - 1:
                    log.warning(
                        "a create's request record, written again after a purge, was not"
                        " written (%s): a retry of it may make a second reminder",
                        type(error).__name__,
                    )

    async def replayed(self, user_id: str, request_id: str, payload: bytes) -> Reminder | None:
        """The reminder an earlier request with this request_id and payload made, found by
        a read (no write); None if there is none.

        For a create whose schedule fails validation now but did not when an identical
        request made it (its time, or its repeat's end, has passed since). A record of
        another payload is no answer either: the request is refused for its own fields,
        which are wrong whatever an earlier request made, not for reusing the request_id.
        """
        if not 1 <= len(request_id) <= 128:
            return None
        earlier = await self._store.create_record(user_id, request_id)
        if earlier is None or earlier.payload_hash != hashlib.sha256(payload).digest():
            return None
        return await self._made(user_id, earlier)

    async def _made_by(
        self, user_id: str, request_id: str, record: CreateRecord, payload_hash: bytes
    ) -> Reminder | None:
        """The reminder the request that wrote `record` made, if its row exists; a reused
        request_id with another payload is refused."""
        if record.payload_hash != payload_hash:
            raise _reused(request_id)
        return await self._made(user_id, record)

    async def _made(self, user_id: str, record: CreateRecord) -> Reminder | None:
        """The reminder made under `record`, if its row exists (a SERIAL read)."""
        existing = await self._store.get_serial(user_id, record.reminder_id)
        return None if existing is None else existing.reminder

    async def _insert(self, proposed: Reminder, count: int | None) -> tuple[Reminder, bool]:
        """The reminder made (or found made by a concurrent replay), and whether on the
        first try. `count`: the user's active count, read under the user's lock (which
        the caller holds), for the first try."""
        user_id = proposed.user_id
        for attempt in range(_MAX_ATTEMPTS):
            await _backoff(attempt)
            if attempt > 0:
                count = await self._store.active_count(user_id, serial=True)
            refused: QuotaExceeded | UserDataBeingDeleted | None = None
            try:
                limit = self._limits.max_active_per_user
                if await self._store.create(proposed, count, limit):
                    return proposed, attempt == 0
            except (QuotaExceeded, UserDataBeingDeleted) as error:
                if attempt == 0:
                    # A plain read's count may lag a delete (or a lifted purge fence):
                    # only one read through Paxos refuses.
                    continue
                refused = error
            # The count moved, or the cap is reached: a concurrent replay of this
            # request may have made the row (taking the last slot).
            existing = await self._store.get_serial(user_id, proposed.reminder_id)
            if existing is not None:
                return existing.reminder, False
            if refused is not None:
                raise refused
        raise Unavailable.contention("this user's reminders")

    async def get(self, user_id: str, reminder_id: uuid.UUID) -> Reminder:
        return (await self._visible(user_id, reminder_id)).reminder

    async def list(
        self, user_id: str, after: uuid.UUID | None, page_size: int, status: Status | None
    ) -> tuple[list[Reminder], uuid.UUID | None]:
        return await self._store.list_page(user_id, after, page_size, status)

    async def update(
        self,
        user_id: str,
        reminder_id: uuid.UUID,
        version: int,
        text: str | None,
        schedule: Schedule | None,
    ) -> Changed:
        if text is not None:
            self._limits.check_text(text)
        refusal: ScheduleError | None = None
        if schedule is not None:
            # A schedule with no ring ahead is refused before the row is read (the step
            # checks again at its own now); unless it is the reminder's own, sent back.
            try:
                validate_new(schedule, self._clock())
            except ScheduleError as error:
                refusal = error

        def step(current: Reminder, now: datetime) -> Reminder:
            new_text = current.text if text is None else text
            if schedule is None or schedule == current.schedule:
                # Unchanged (a whole reminder sent back, mask "*"): not a new schedule, so
                # its snooze and a ring due or under way stay.
                return steps.edit_text(current, new_text, now)
            if refusal is not None:
                raise refusal
            first = validate_new(schedule, now)
            return steps.edit_schedule(current, new_text, schedule, first, now)

        try:
            return await self._apply(user_id, reminder_id, version, step)
        except NotFound:
            if refusal is not None:
                raise refusal from None  # bad input, whatever the id
            raise
        except VersionConflict:
            if refusal is not None and not await self._is_own(user_id, reminder_id, schedule):
                raise refusal from None  # bad input, whatever the version
            raise  # a stale echo of the reminder's own schedule: re-read and retry

    async def _is_own(
        self, user_id: str, reminder_id: uuid.UUID, schedule: Schedule | None
    ) -> bool:
        """Whether `schedule` is the reminder's (one past its rings is no new input)."""
        stored = await self._store.get(user_id, reminder_id)
        return stored is not None and stored.reminder.schedule == schedule

    async def snooze(
        self, user_id: str, reminder_id: uuid.UUID, until: datetime | timedelta, field: str
    ) -> Changed:
        """`until`: a duration from now, an instant, or a naive local time in the
        reminder's zone (the gap rule applies; of a repeated time, the one ahead)."""

        def step(current: Reminder, now: datetime) -> Reminder:
            if isinstance(until, timedelta):
                at = now + until
            elif until.tzinfo is None:
                at = upcoming_utc(until, current.schedule.zone, now)
            else:
                at = until
            # A duration counts from now; a time the caller named, from now's whole second.
            span = until if isinstance(until, timedelta) else span_to(at, now)
            # Rings are whole seconds: rounded up, never early (the range is the caller's).
            rings_at = round_up(at, "second")
            if rings_at != current.snooze_until:
                # Not a retry of the snooze that landed, which the step answers unchanged
                # however close its time has come.
                self._limits.check_snooze(span, field)
            return steps.snooze(current, rings_at, now)

        return await self._apply(user_id, reminder_id, None, step)

    async def pause(self, user_id: str, reminder_id: uuid.UUID, version: int | None) -> Changed:
        return await self._apply(user_id, reminder_id, version, steps.pause)

    async def resume(self, user_id: str, reminder_id: uuid.UUID, version: int | None) -> Changed:
        return await self._apply(user_id, reminder_id, version, steps.resume)

    async def delete(self, user_id: str, reminder_id: uuid.UUID, version: int | None) -> Deleted:
        deleted = await self._apply(user_id, reminder_id, version, steps.delete)
        return Deleted(deleted.reminder, deleted.ring_in_flight)

    async def _visible(
        self, user_id: str, reminder_id: uuid.UUID, *, newer_than: int = 0, serial: bool = False
    ) -> StoredReminder:
        """The row as the caller may see it. A plain read (LOCAL_QUORUM) can lag a change
        another data centre made (or an LWT still in flight): before answering NOT_FOUND,
        or with a version older than `newer_than` (one the caller has already seen), read
        through Paxos instead, which sees every change committed anywhere."""
        read = self._store.get_serial if serial else self._store.get
        stored = await read(user_id, reminder_id)
        if not serial and (stored is None or stored.reminder.version < newer_than):
            stored = await self._store.get_serial(user_id, reminder_id)
        if stored is None or stored.reminder.status is Status.DELETED:
            raise NotFound("reminder not found")
        return stored

    async def _apply(
        self,
        user_id: str,
        reminder_id: uuid.UUID,
        version: int | None,
        step: Callable[[Reminder, datetime], Reminder],
    ) -> Changed:
        async with self._users.hold(user_id):
            return await self._apply_serialized(user_id, reminder_id, version, step)

    async def _apply_serialized(
        self,
        user_id: str,
        reminder_id: uuid.UUID,
        version: int | None,
        step: Callable[[Reminder, datetime], Reminder],
    ) -> Changed:
        for attempt in range(_MAX_ATTEMPTS):
            await _backoff(attempt)
            # After a lost compare-and-set, read what it lost to through Paxos: a plain read
            # may still show the row it was compared with.
            stored = await self._visible(
                user_id, reminder_id, newer_than=version or 0, serial=attempt > 0
            )
            current = stored.reminder
            if version is not None and current.version != version:
                raise VersionConflict(version, current.version)
            now = self._clock()
            changed = step(current, now)
            # Of the row the change found: said of a change to nothing too (a pause of a
            # paused reminder), so that its retry answers as the change that landed did.
            ring_in_flight = current.handing_off(now, self._still_pushed_for)
            if changed is current:
                return Changed(current, ring_in_flight)
            if await self._store.replace(stored, changed, now):
                return Changed(changed, ring_in_flight)
        raise Unavailable.contention("this reminder")
