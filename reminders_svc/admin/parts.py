"""`reminders admin parts` (each part's lease and checkpoint) and `parts grow --to P`.

Growing P: the new P is stored in `part_counts` with the minute it takes effect, so a
minute is always written and read with one P. That minute is at least `MIN_LEAD` ahead:
every API and dispatcher caches part counts for 30 s (`PartCounts`), and by the
effective minute each must have reloaded them, so writers put that minute's entries
under the new P and dispatchers take the new parts as soon as it starts.

Nothing is lost even with a cache that lags: P only grows, so an entry written under an
older P lands in a part below it, and the dispatchers keep reading every part of every
minute. The new parts' rows in `dispatch_parts` are seeded with the checkpoint "the
minute before the effective one" (`IF NOT EXISTS`): no entry can sit in a new part
before that minute (writers use the P in force for the entry's minute), so the first
owner starts at the effective minute instead of catching up over `initial_lookback` of
empty minutes while the first rings of the new parts wait.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from dispatcher.leases import PartState
from reminders_svc.admin.context import Admin, AdminError
from reminders_svc.admin.output import iso
from reminders_svc.config import Env
from reminders_svc.storage import aio
from reminders_svc.storage.parts import DEFAULT_PARTS, MINUTE, PartCount, floor_minute

# Part counts are cached 30 s by every process; two minutes leaves each several reloads.
MIN_LEAD = timedelta(minutes=2)
DEFAULT_LEAD = timedelta(minutes=3)
# A grow is planned at most a day ahead: every later grow must take effect after it, so a
# typo of a year would hold P where it is for that year.
MAX_LEAD = timedelta(days=1)
# Test-only: lets an end-to-end test grow P within seconds instead of minutes.
MIN_LEAD_ENV = "REMINDERS_ADMIN_GROW_MIN_LEAD_S"
_SCOPE = "dispatch"
# The history starts here when it only held the code's default until now.
_BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)
# One grow raises P at most this many times over, unless forced (64 -> 1,024 is the
# production step of the runbook).
MAX_GROWTH = 16
# P at most, forced or not: every dispatcher reads and checkpoints each part every minute,
# and a grow seeds each new part by one LWT.
MAX_PARTS = 65_536
# A seed's compare-and-set loses only to another grow or a dispatcher's checkpoint.
_SEED_ATTEMPTS = 5


@dataclass(frozen=True)
class PartReport:
    part: int
    owner: str | None
    epoch: int
    lease_until: str | None
    checkpoint: str | None
    # As the dispatcher's checkpoint-lag metric: how far the part is behind a healthy one
    # (the minute after the checkpoint should be done by its end plus the grace).
    checkpoint_lag_s: float | None
    in_force: bool  # False for parts of a P that takes effect later


def min_lead() -> timedelta:
    # A test hook (the suite cannot wait minutes); never below 0.
    return timedelta(
        seconds=Env(os.environ).number(MIN_LEAD_ENV, MIN_LEAD.total_seconds(), low=0, high=86_400)
    )


def ceil_minute(instant: datetime) -> datetime:
    floored = floor_minute(instant)
    return floored if floored == instant else floored + MINUTE


def checkpoint_lag_s(checkpoint: datetime | None, now: datetime, grace: timedelta) -> float | None:
    if checkpoint is None:
        return None
    first_unfinished = checkpoint + MINUTE
    behind = now - first_unfinished - MINUTE - grace
    return round(max(0.0, behind.total_seconds()), 1)


async def part_reports(admin: Admin, grace: timedelta) -> list[PartReport]:
    """Every part in force now or scheduled, and any row beyond them, in part order."""
    now = admin.now()
    in_force = await admin.parts.parts_at(floor_minute(now))
    scheduled = max([in_force, *(count.parts for count in await admin.parts.load())])
    states = {state.part: state for state in await admin.leases.states()}
    numbers = sorted(set(range(scheduled)) | set(states))
    return [
        _report(states.get(part) or PartState(part, None, 0, None, None), now, grace, in_force)
        for part in numbers
    ]


def _report(state: PartState, now: datetime, grace: timedelta, in_force: int) -> PartReport:
    return PartReport(
        part=state.part,
        owner=state.owner,
        epoch=state.epoch,
        lease_until=iso(state.lease_until),
        checkpoint=iso(state.checkpoint),
        checkpoint_lag_s=checkpoint_lag_s(state.checkpoint, now, grace),
        in_force=state.part < in_force,
    )


def history(counts: tuple[PartCount, ...]) -> list[dict[str, object]]:
    return [
        {"from_minute": iso(count.from_minute), "parts": count.parts}
        for count in sorted(counts, key=lambda count: count.from_minute)
    ]


@dataclass(frozen=True)
class GrowResult:
    previous_parts: int
    parts: int
    effective_minute: datetime
    seeded_parts: tuple[int, ...]
    # True for a run again of a grow stored before: it seeded what that one left.
    finished: bool = False

    def as_dict(self) -> dict[str, object]:
        document = asdict(self)
        document["effective_minute"] = iso(self.effective_minute)
        document["seeded_parts"] = list(self.seeded_parts)
        return document


async def grow(admin: Admin, to: int, lead: timedelta, *, force: bool = False) -> GrowResult:
    """Store P = `to` from the first whole minute at least `lead` from now.

    Refuses a P not above the latest stored (or scheduled) one, and a lead under the
    floor. Run one at a time: of two concurrent grows, one taking effect later with a
    smaller P is caught after the fact and raised to the larger (`_raise_shrinking`);
    with a larger P both stand (`_seed`).
    """
    check_lead(lead)
    counts = await admin.parts.load()
    latest = counts[0] if counts else PartCount(_BEGINNING, DEFAULT_PARTS)
    if to == latest.parts and len(counts) > 1:
        # The same grow run again: one cut short while seeding (stopped, a timeout) left
        # parts unseeded, which would start an hour back. Only missing rows are written:
        # a part seeded or worked since keeps its checkpoint.
        previous = counts[1].parts
        seeded = [
            part
            for part in range(previous, to)
            if await _seed(admin, part, latest.from_minute, move_back=False)
        ]
        return GrowResult(previous, to, latest.from_minute, tuple(seeded), finished=True)
    if to <= latest.parts:
        raise AdminError(
            f"P only grows: the latest P is {latest.parts} (from {iso(latest.from_minute)}); "
            f"--to {to} must be greater"
        )
    if to > latest.parts * MAX_GROWTH and not force:
        # A typo (10240 for 1024) would be for good: every dispatcher would read and
        # checkpoint that many parts every minute from then on.
        raise AdminError(
            f"--to {to} is over {MAX_GROWTH} times the latest P ({latest.parts}); "
            "P never shrinks: check the number, and add --force if it is meant"
        )
    # After any change already scheduled, so the stored sequence never shrinks.
    effective = max(ceil_minute(admin.now() + lead), latest.from_minute + MINUTE)
    if not counts:
        # Make the default explicit, so the history no longer depends on the code's default.
        await _insert_count(admin, PartCount(_BEGINNING, DEFAULT_PARTS))
    if not await _insert_count(admin, PartCount(effective, to)):
        raise AdminError(f"a part count is already stored from {iso(effective)}; nothing changed")
    stored = await admin.parts.load()
    if _shrinks(stored):
        healed = await _raise_shrinking(admin, stored)
        raise AdminError(
            "part counts no longer only grew (a concurrent grow?): raised to "
            f"{history(healed)}; check them with `reminders admin parts`"
        )
    seeded = [part for part in range(latest.parts, to) if await _seed(admin, part, effective)]
    return GrowResult(latest.parts, to, effective, tuple(seeded))


def _shrinks(counts: tuple[PartCount, ...]) -> bool:
    ordered = sorted(counts, key=lambda count: count.from_minute)
    return any(later.parts < earlier.parts for earlier, later in itertools.pairwise(ordered))


async def _raise_shrinking(admin: Admin, counts: tuple[PartCount, ...]) -> tuple[PartCount, ...]:
    """Raise each count below an earlier one to that one's P, by LWT. Never a delete nor a
    lowering: a process may have cached any stored count and written entries into parts
    under it, which only a P at least as large still reads. The parts up to the raised P
    were seeded by the earlier grow, from its earlier minute."""
    highest = 0
    for count in sorted(counts, key=lambda count: count.from_minute):
        if count.parts < highest:
            await aio.execute(
                admin.session,
                "UPDATE part_counts SET parts = %s WHERE scope = %s AND from_minute = %s"
                " IF parts = %s",
                (highest, _SCOPE, count.from_minute, count.parts),
            )
        highest = max(highest, count.parts)
    return await admin.parts.load()


async def _insert_count(admin: Admin, count: PartCount) -> bool:
    row = await aio.execute(
        admin.session,
        "INSERT INTO part_counts (scope, from_minute, parts) VALUES (%s, %s, %s) IF NOT EXISTS",
        (_SCOPE, count.from_minute, count.parts),
    )
    return bool(row.one().applied)


async def _seed(admin: Admin, part: int, effective: datetime, *, move_back: bool = True) -> bool:
    """A new part's row: never leased, finished up to the minute before it takes effect.

    By LWT, as every write of `dispatch_parts`. Where a row exists with a later checkpoint
    (a concurrent grow taking effect later seeded it first), it is moved back to ours
    unless `move_back` is False: the part's entries from our minute on must be read.
    Moving a checkpoint back only makes minutes read again (the rows decide, the keys
    dedupe), never skipped.
    """
    checkpoint = effective - MINUTE
    result = await aio.execute(
        admin.session,
        "INSERT INTO dispatch_parts (part, checkpoint) VALUES (%s, %s) IF NOT EXISTS",
        (part, checkpoint),
    )
    for _ in range(_SEED_ATTEMPTS):
        row = result.one()
        if row.applied:
            return True
        found = row.checkpoint.replace(tzinfo=UTC) if row.checkpoint is not None else None
        if found is None or found <= checkpoint or not move_back:
            return False  # already read from our minute on, or earlier
        result = await aio.execute(
            admin.session,
            "UPDATE dispatch_parts SET checkpoint = %s WHERE part = %s IF checkpoint = %s",
            (checkpoint, part, row.checkpoint),
        )
    raise AdminError(f"part {part}: its checkpoint kept changing while it was seeded; run again")


def lead_seconds(text: str) -> timedelta:
    """An argparse type: a grow's lead in seconds, 0 to MAX_LEAD (`check_lead` then
    holds it to the floor)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_LEAD.total_seconds():  # nan and inf too
        raise argparse.ArgumentTypeError(
            f"{text!r}: want seconds from 0 to {MAX_LEAD.total_seconds():g}"
        )
    return timedelta(seconds=seconds)


def check_lead(lead: timedelta) -> None:
    """A grow's lead, at least `min_lead()`, else AdminError."""
    floor = min_lead()
    if lead < floor:
        raise AdminError(
            f"--effective-in {lead.total_seconds():g}s is under the minimum "
            f"{floor.total_seconds():g}s: every API and dispatcher caches part counts for 30 s"
        )
