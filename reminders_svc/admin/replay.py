"""`reminders admin replay --from M --to M`: look at a range of minutes again.

For each minute, under the P in force for it, every part's entries are read and each row
is read fresh; the row decides (`domain.dispatch.decide`, as the dispatcher does): a row
still pending with its due passed, or sending under an expired claim, gets a fresh bucket
entry in the current minute, which the dispatchers owning that part read and ring. The
row itself is never written here, so a replay can neither ring twice (the claim LWT and
the notifier's key dedupe) nor undo a user's change. Reads and writes are rate-limited.

A part's work that fails on storage is done again after a pause (`patience`): its
entries re-armed already are remembered. `progress` is told each minute done, so a run
that ends anyway says where to go on from.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from dispatcher.ratelimit import RateLimiter
from reminders_svc.admin.context import Admin
from reminders_svc.admin.output import iso
from reminders_svc.admin.patience import Tell, patiently
from reminders_svc.domain.dispatch import Claimable, Reclaimable, Skip, WaitUntil, decide
from reminders_svc.domain.reminder import Reminder
from reminders_svc.storage.parts import MINUTE

RE_ARMED = "re_armed"  # a fresh entry was written (or would be, with --dry-run)
IN_FLIGHT = "in_flight"  # sending under a live claim: its dispatcher is on it
ALREADY_RE_ARMED = "already_re_armed"  # another entry of it was re-armed in this replay


@dataclass
class ReplayReport:
    minutes: int = 0
    entries: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    through: datetime | None = None  # the last minute done

    def as_dict(self) -> dict[str, object]:
        return {
            "minutes": self.minutes,
            "entries": self.entries,
            "outcomes": dict(self.outcomes),
            "through": iso(self.through),
        }


def minutes_between(first: datetime, last: datetime) -> Iterator[datetime]:
    minute = first
    while minute <= last:
        yield minute
        minute += MINUTE


async def replay(
    admin: Admin,
    first: datetime,
    last: datetime,
    limiter: RateLimiter,
    *,
    dry_run: bool,
    progress: Callable[[ReplayReport], None] = lambda report: None,
    tell: Tell = lambda message: None,
) -> ReplayReport:
    report = ReplayReport()
    re_armed: set[tuple[str, object]] = set()

    async def replay_part(minute: datetime, part: int, armed_here: set[tuple[str, object]]) -> None:
        # Counted once the whole part is done: a part done again after storage trouble
        # counts its entries once, those it re-armed before the trouble as re-armed.
        entries = 0
        outcomes: Counter[str] = Counter()
        # A reminder with two entries in this part (an edit moved it within the minute)
        # is re-armed, and counted, once.
        counted_here: set[tuple[str, object]] = set()
        await limiter.take()
        for entry in await admin.reader.read(minute, part):
            entries += 1
            key = (entry.user_id, entry.reminder_id)
            if key in armed_here and key not in counted_here:
                outcomes[RE_ARMED] += 1
                counted_here.add(key)
                continue
            if key in re_armed:
                outcomes[ALREADY_RE_ARMED] += 1
                continue
            await limiter.take()
            stored = await admin.store.get(entry.user_id, entry.reminder_id)
            row = stored.reminder if stored is not None else None
            outcome = await _replay_row(admin, row, entry.written, limiter, dry_run=dry_run)
            if outcome == RE_ARMED:
                re_armed.add(key)
                armed_here.add(key)
                counted_here.add(key)
            outcomes[outcome] += 1
        report.entries += entries
        report.outcomes.update(outcomes)

    for minute in minutes_between(first, last):
        for part in range(await admin.parts.parts_at(minute)):
            step = functools.partial(replay_part, minute, part, set())
            await patiently(step, f"minute {iso(minute)}, part {part}", tell)
        report.minutes += 1
        report.through = minute
        progress(report)
    return report


async def _replay_row(
    admin: Admin,
    row: Reminder | None,
    entry_written: datetime,
    limiter: RateLimiter,
    *,
    dry_run: bool,
) -> str:
    now = admin.now()
    # Horizon = now: a due still ahead is covered by the entry written with that due.
    decision = decide(row, now, horizon=now, entry_written=entry_written)
    if isinstance(decision, Skip):
        return decision.reason.value
    if isinstance(decision, WaitUntil):
        return IN_FLIGHT
    assert row is not None
    if isinstance(decision, Reclaimable):
        # The entry's due only says when to look; the re-claim keeps the claimed due.
        row = dataclasses.replace(row, due=row.due or decision.claim.due)
    assert isinstance(decision, Claimable | Reclaimable)
    if not dry_run:
        await limiter.take()
        # The clock read again after the wait: a past due's entry goes into the minute of
        # now, which must not be one whose final read the wait has outlasted (invariant 3).
        await admin.store.write_bucket_entry(row, admin.now())
    return RE_ARMED
