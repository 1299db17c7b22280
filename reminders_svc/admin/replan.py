"""`reminders admin replan --zone Z`: after a tz database update, move the stored future
dues of the reminders in zone Z to where the zone's rules now put them.

Order of work: deploy the new rules to the API and the dispatchers first (a finalize
computes the next occurrence with the rules of the dispatcher doing it), then replan.

There is no index by zone: the whole `reminders` table is scanned by token ranges, paged
and rate-limited, with only a few narrow columns read, and filtered by zone here: Z and
every name with the same rules (its links, e.g. US/Eastern for America/New_York), since a
reminder keeps the zone name it was created with. Each
match is read whole and rewritten by `ReminderStore.replace`, the LWT compare-and-set on
the row's whole state that every writer uses, the new due's bucket entry first; a row
changed in between is read again and recomputed. Only pending and paused rows are
replanned: a sending row's finalize computes its next occurrence with the new rules,
unless the ring in flight is a snooze's, which leaves the series' occurrence as stored.
Such a row is looked at again, beside the scan, for about half a minute, until its ring is
finalized (a sending row is its dispatcher's to write: a replan under the ring would make
its finalize lose and read the row again, as a user's change does); one still in flight
then is reported `in_flight`, for a later run. Every writer's compare covers the
occurrence, so a step computed from a read before the replan loses to it.

A scan page or a row's replan that fails on storage is done again after a pause
(`patience`): a run of hours does not end at a node's restart. `progress` is told each
token range done.

Which occurrence is "the same" under new rules: the stored occurrence was computed with
the old rules, which are gone. The schedule's ring nearest to the stored instant under
the new rules is the same local occurrence whenever the rules move it by less than half
the schedule's period, which holds for every real tz change and every daily or longer
schedule. At exactly half (an hourly repeat and a 30-minute change) both neighbours are
as near: the earlier is taken, as it is a ring of the schedule under the new rules too,
and the later one follows it, where taking the later would skip the earlier. If that ring
has already passed, the reminder rings now, late (the misfire policy), rather than
silently skipping an occurrence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from dispatcher.ratelimit import RateLimiter
from reminders_svc.admin.context import Admin
from reminders_svc.admin.patience import Tell, patiently
from reminders_svc.domain.reminder import Reminder, Status, earliest
from reminders_svc.schedule import occurrences
from reminders_svc.schedule.zones import same_rules

# Tz changes move local times by at most a day (Samoa skipped 2011-12-30); look that far.
_SEARCH = timedelta(hours=26)
# Rings in that window: hourly at most often (the engine's floor), so at most 53.
_MAX_CANDIDATES = 64
_MIN_TOKEN = -(2**63)
_MAX_TOKEN = 2**63 - 1
_REPLANNABLE = (Status.PENDING, Status.PAUSED)
_SCANNED = frozenset(status.value for status in (*_REPLANNABLE, Status.SENDING))
_ATTEMPTS = 3
# Rows whose snooze ring is in flight are looked at again after these waits (~30 s in
# all: a ring is finalized within seconds unless the notifier is down).
_IN_FLIGHT_WAITS_S = (1.0, 2.0, 4.0, 8.0, 15.0)
IN_FLIGHT = "in_flight"


def replanned(reminder: Reminder, now: datetime) -> Reminder | None:
    """The row with its regular occurrence (and due) under the rules now loaded, or None
    when nothing moves. Not a user change: version, update time and op_id stay (the op_id
    names the last user change, which settles its own unknown outcome by it)."""
    if reminder.status not in _REPLANNABLE or reminder.occurrence is None:
        return None
    if reminder.occurrence <= now:
        return None  # being rung (or about to be): its finalize uses the new rules
    occurrence = same_occurrence(reminder, reminder.occurrence, now)
    if occurrence == reminder.occurrence:
        return None
    paused = reminder.status is Status.PAUSED
    due = None if paused else earliest(occurrence, reminder.snooze_until)
    status = reminder.status if paused or due is not None else Status.DONE
    return dataclasses.replace(reminder, occurrence=occurrence, due=due, status=status)


def waits_for_its_ring(reminder: Reminder, now: datetime) -> bool:
    """A snooze's ring in flight (sending, the series' occurrence still ahead) whose
    occurrence the rules now loaded put elsewhere: its finalize keeps the stored one, so
    the row is replanned once that ring is finalized."""
    occurrence = reminder.occurrence
    return (
        reminder.status is Status.SENDING
        and occurrence is not None
        and occurrence > now
        and same_occurrence(reminder, occurrence, now) != occurrence
    )


def same_occurrence(reminder: Reminder, stored: datetime, now: datetime) -> datetime | None:
    candidates = [
        ring
        for ring in occurrences(reminder.schedule, stored - _SEARCH, _MAX_CANDIDATES)
        if ring <= stored + _SEARCH
    ]
    if candidates:
        return min(candidates, key=lambda ring: (abs(ring - stored), ring))
    # Nothing near (a rule change larger than any seen): the next ring from now on.
    following = occurrences(reminder.schedule, now, 1)
    return following[0] if following else None


@dataclass
class ReplanReport:
    zone: str
    rules: str  # the tz database the new dues were computed with
    names: list[str] = field(default_factory=list)  # the zone's names matched, links included
    scanned: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    ranges_done: int = 0
    ranges: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "zone": self.zone,
            "names": self.names,
            "rules": self.rules,
            "scanned": self.scanned,
            "outcomes": dict(self.outcomes),
            "ranges_done": self.ranges_done,
            "ranges": self.ranges,
        }


def token_ranges(splits: int) -> list[tuple[int, int]]:
    """(start, end] ranges covering Murmur3's whole ring (it never hands out the minimum)."""
    step = (_MAX_TOKEN - _MIN_TOKEN) // splits
    bounds = [_MIN_TOKEN + index * step for index in range(splits)] + [_MAX_TOKEN]
    return list(itertools.pairwise(bounds))


@dataclass(frozen=True)
class ScanSettings:
    rows_per_s: float
    writes_per_s: float
    page_size: int = 500
    splits: int = 256
    parallel: int = 4


class ZoneScan:
    """Rows of one zone in a replannable status, found by a paged, rate-limited scan."""

    def __init__(
        self, session: Session, names: frozenset[str], settings: ScanSettings, tell: Tell
    ) -> None:
        self._session = session
        self._tell = tell
        self._names = names
        self._settings = settings
        self._rows = RateLimiter(settings.rows_per_s)
        self._statement: PreparedStatement = session.prepare(
            "SELECT user_id, reminder_id, zone, status FROM reminders"
            " WHERE token(user_id) > ? AND token(user_id) <= ?"
        )
        self._statement.fetch_size = settings.page_size
        self.scanned = 0

    async def matches(self, token_range: tuple[int, int]) -> AsyncIterator[tuple[str, uuid.UUID]]:
        paging_state: bytes | None = None
        while True:
            fetch = functools.partial(asyncio.to_thread, self._page, token_range, paging_state)
            rows, paging_state = await patiently(fetch, f"token range {token_range}", self._tell)
            self.scanned += len(rows)
            for _ in rows:  # paced by rows read, so a full page costs what its rows cost
                await self._rows.take()
            for row in rows:
                if row.zone in self._names and row.status in _SCANNED:
                    yield row.user_id, row.reminder_id
            if paging_state is None:
                return

    def _page(
        self, token_range: tuple[int, int], paging_state: bytes | None
    ) -> tuple[Sequence[Any], bytes | None]:
        # Paging runs in a worker thread: the driver fetches pages synchronously.
        result = self._session.execute(self._statement, token_range, paging_state=paging_state)
        return list(result.current_rows), result.paging_state


async def replan_zone(
    admin: Admin,
    zone: str,
    rules: str,
    settings: ScanSettings,
    *,
    dry_run: bool,
    waiting: Callable[[float], None] = lambda seconds: None,
    progress: Callable[[ReplanReport], None] = lambda report: None,
    tell: Tell = lambda message: None,
) -> ReplanReport:
    """`waiting(seconds)` is told each time a row waits for its snooze's ring."""
    names = same_rules(zone)
    all_ranges = token_ranges(settings.splits)
    report = ReplanReport(zone=zone, rules=rules, names=sorted(names), ranges=len(all_ranges))
    scan = ZoneScan(admin.session, names, settings, tell)
    writes = RateLimiter(settings.writes_per_s)
    ranges = iter(all_ranges)
    # A row waiting for its ring waits beside the scan, not for its end (hours away in a
    # big table, by when the ring it waited for has rung at the old rules' time).
    waits: list[asyncio.Task[None]] = []

    async def replan_row(key: tuple[str, uuid.UUID]) -> str:
        await writes.take()
        step = functools.partial(_replan_row, admin, *key, aimed=[], dry_run=dry_run)
        return await patiently(step, f"reminder {key[1]}", tell)

    async def wait_for_its_ring(key: tuple[str, uuid.UUID]) -> None:
        outcome = IN_FLIGHT
        for seconds in _IN_FLIGHT_WAITS_S:
            waiting(seconds)
            await asyncio.sleep(seconds)
            outcome = await replan_row(key)
            if outcome != IN_FLIGHT:
                break
        report.outcomes[outcome] += 1

    async def work() -> None:
        for token_range in ranges:  # shared iterator: each range is taken once
            async for key in scan.matches(token_range):
                outcome = await replan_row(key)
                if outcome == IN_FLIGHT and not dry_run:
                    waits.append(asyncio.create_task(wait_for_its_ring(key)))
                else:
                    report.outcomes[outcome] += 1
            report.ranges_done += 1
            report.scanned = scan.scanned
            progress(report)

    await asyncio.gather(*(work() for _ in range(settings.parallel)))
    await asyncio.gather(*waits)
    report.scanned = scan.scanned
    return report


async def _replan_row(
    admin: Admin,
    user_id: str,
    reminder_id: uuid.UUID,
    *,
    aimed: list[datetime | None],
    dry_run: bool,
) -> str:
    """`aimed` holds the occurrences written by earlier tries of this row (kept across
    `patiently`'s retries): a write that landed before storage trouble ended its try
    is found in place by the next one, and counted as moved, not unchanged."""
    for _ in range(_ATTEMPTS):
        stored = await admin.store.get(user_id, reminder_id)
        if stored is None:
            return "gone"
        now = admin.now()
        if waits_for_its_ring(stored.reminder, now):
            return IN_FLIGHT
        after = replanned(stored.reminder, now)
        if after is None:
            return "moved" if stored.reminder.occurrence in aimed else "unchanged"
        aimed.append(after.occurrence)
        if dry_run or await admin.store.replace(stored, after, now):
            return "moved"
    # Changed under us every time (a user or a dispatcher at work): the next run sees it.
    return "conflict"
