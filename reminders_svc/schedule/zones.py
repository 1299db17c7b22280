"""Zones from the pinned ``tzdata`` package, and the local -> UTC rules.

zoneinfo looks at the system's /usr/share/zoneinfo before the tzdata package; we read
the package's files ourselves so every machine uses the same pinned database.

Override hook: when REMINDERS_TZ_OVERRIDE_DIR names a directory, a TZif file there under
a zone's name (``<dir>/America/New_York``) takes precedence over the pinned package for
that zone. It is read once per process, at first use of a zone, so every process that
must agree (API, dispatchers, `reminders admin replan`) needs the same directory from
its start. It serves an urgent rule change ahead of a tzdata release, and tests that
change a zone's rules; it cannot add zone names the pinned database does not know.
Processes that compute dues check the directory at their start
(`reminders_svc.config.check_tz_override`), and the version they report names the zones
it replaces: a mistyped path must not pass for rules in force.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo

from reminders_svc.schedule.errors import ScheduleError

OVERRIDE_DIR_ENV = "REMINDERS_TZ_OVERRIDE_DIR"


@functools.cache
def zone_names() -> frozenset[str]:
    """Every zone name the pinned tz database knows."""
    listing = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in listing.splitlines() if line.strip())


@functools.cache
def _override_dir() -> Path | None:
    configured = os.environ.get(OVERRIDE_DIR_ENV, "")
    return Path(configured) if configured else None


def _override_file(directory: Path, name: str) -> Path:
    return directory.joinpath(*name.split("/"))


def overridden_zones(directory: Path) -> list[str]:
    """The zones a TZif file in `directory` replaces (see the module's docstring)."""
    return sorted(name for name in zone_names() if _override_file(directory, name).is_file())


def override_problem(directory: Path, name: str) -> str | None:
    """Why zone `name`'s TZif file in `directory` cannot be loaded, or None."""
    try:
        with _override_file(directory, name).open("rb") as handle:
            ZoneInfo.from_file(handle, key=name)
    except (OSError, ValueError) as error:
        return str(error)
    return None


def _pinned_file(name: str) -> Traversable:
    return resources.files("tzdata.zoneinfo").joinpath(*name.split("/"))


def _zone_file(name: str) -> Traversable:
    override = _override_dir()
    if override is not None:
        candidate = _override_file(override, name)
        if candidate.is_file():
            return candidate
    return _pinned_file(name)


@functools.cache
def _read_zone(name: str) -> ZoneInfo:
    with _zone_file(name).open("rb") as handle:
        return ZoneInfo.from_file(handle, key=name)


@functools.cache
def same_rules(name: str) -> frozenset[str]:
    """`name` and its links (US/Eastern for America/New_York), which a reminder may be
    stored under: the names with the same TZif file in the pinned database, and the same
    one as loaded (an override applies to the names it has a file for: a link without one
    keeps the pinned rules while it runs)."""
    load_zone(name)

    def files(zone: str) -> tuple[bytes, bytes]:
        return _pinned_file(zone).read_bytes(), _zone_file(zone).read_bytes()

    wanted = files(name)
    return frozenset(other for other in zone_names() if files(other) == wanted)


def load_zone(name: str) -> ZoneInfo:
    """The zone ``name`` from the pinned database; ScheduleError(field="zone") if unknown."""
    # Checking against the package's list also keeps names like "../x" off the filesystem.
    if name not in zone_names():
        raise ScheduleError("zone", f"unknown time zone {name!r} (want an IANA name)")
    return _read_zone(name)


# In the tz database's list, but no place's zone: "Factory" is the placeholder of a
# machine whose zone is unset (its abbreviation is "-00").
NOT_PLACES = frozenset({"Factory"})


def load_place(name: str) -> ZoneInfo:
    """The zone of a schedule being made: `load_zone`'s, but not a placeholder
    (`NOT_PLACES`). A stored schedule's zone is loaded with `load_zone`: one made before
    this check keeps ringing."""
    if name in NOT_PLACES:
        raise ScheduleError("zone", f"{name!r} is no place's time zone (want an IANA name)")
    return load_zone(name)


# Overridden zones the version names; the rest it counts.
_NAMED_OVERRIDES = 5


@functools.cache
def tzdata_version(*, naming_the_directory: bool = True) -> str:
    """The tz database in use: its IANA release and the pinned package's version, and the
    zones overridden and from where (not where for the API's callers: a path on the
    server's disk is none of theirs)."""
    # tzdata.zi starts with "# version 2026f", the release the package was built from.
    header = resources.files("tzdata.zoneinfo").joinpath("tzdata.zi").open("r").readline()
    release = header.removeprefix("# version").strip()
    pinned = f"{release} (tzdata {importlib.metadata.version('tzdata')})"
    override = _override_dir()
    if override is None:
        return pinned
    # Operators must see which zones do not come from the pinned release (the first few:
    # the string goes into every PreviewSchedule answer).
    zones = overridden_zones(override)
    named = ", ".join(zones[:_NAMED_OVERRIDES]) or "no zone files"
    more = f" and {len(zones) - _NAMED_OVERRIDES} more" if len(zones) > _NAMED_OVERRIDES else ""
    where = f" from {override}" if naming_the_directory else ""
    return f"{pinned} + overrides{where} ({named}{more})"


# The years a schedule's dates and times (and the API's instants) may name: far wider
# than any reminder needs, and far enough inside datetime's own (1 to 9999) that zone
# offsets, the resume margin and the search horizon (HORIZON_YEARS) never step outside
# it, which raised OverflowError.
MIN_YEAR, MAX_YEAR = 1900, 8999


def check_year(value: date, field: str) -> None:
    """ScheduleError on ``field`` unless ``value`` (a date or date-time) falls within
    MIN_YEAR..MAX_YEAR."""
    if not MIN_YEAR <= value.year <= MAX_YEAR:
        raise ScheduleError(field, f"the year must be {MIN_YEAR} to {MAX_YEAR}")


def to_utc_in(local: datetime, zone: ZoneInfo, fold: int = 0) -> datetime:
    """Map a naive local wall time to a UTC instant with the engine's rules.

    fold=0 picks the first of a repeated time; for a time in a gap, fold=0 applies the
    offset in force before the gap (PEP 495), which is the same as shifting the wall time
    forward by the gap's length (02:30 -> 03:30). fold=1 picks the second of a repeated
    time (only `upcoming_utc` asks for it).
    """
    aware = local.replace(tzinfo=zone, fold=fold)
    return aware.astimezone(UTC).replace(microsecond=0)


def to_utc_marking_gaps(local: datetime, zone: ZoneInfo) -> tuple[datetime, bool]:
    """`to_utc_in(local, zone)` for a whole-second wall time of fold 0 (an expansion's), and
    whether a clock change skips that wall time (its instant names another). Every ring of
    every search maps one: this takes half the time of to_utc_in and to_local together."""
    aware = local.replace(tzinfo=zone)
    # Offsets are whole seconds, so the instant is; times of one tzinfo compare as wall times.
    instant = aware.astimezone(UTC)
    return instant, instant.astimezone(zone) != aware


def to_utc(local: datetime, zone: str) -> datetime:
    """Map a naive local wall time in ``zone`` to an aware UTC instant (see to_utc_in)."""
    if local.tzinfo is not None:
        raise ScheduleError("at", f"local time {local.isoformat()} must not carry an offset")
    return to_utc_in(local, load_zone(zone))


def upcoming_utc(local: datetime, zone: str, now: datetime) -> datetime:
    """A local time meant as one ahead (a snooze "until 01:40"): the engine's instant
    (to_utc), unless that is the first of a repeated time that has passed while the
    second is still to come. Named during the repeated hour, 01:40 means the one ahead,
    not the one an hour ago."""
    first = to_utc(local, zone)
    if first > now:
        return first
    second = to_utc_in(local, load_zone(zone), fold=1)
    return second if second > now else first


def to_local(instant: datetime, zone: ZoneInfo) -> datetime:
    """The naive wall time in ``zone`` at an aware instant."""
    return instant.astimezone(zone).replace(tzinfo=None)


def rings_at(local: datetime, zone: ZoneInfo) -> datetime:
    """The wall time a ring meant for ``local`` happens at: ``local`` itself, or later
    when a clock change skips it (to_utc_in's shift)."""
    return to_local(to_utc_in(local, zone), zone)


_UNITS = {"second": timedelta(seconds=1), "minute": timedelta(minutes=1)}
_AN_HOUR = timedelta(hours=1)

# Clocks never go back by more than a few hours; a day bounds the walk out of a fold.
_LONGEST_FOLD = timedelta(days=1)


def start_from(now: datetime, zone: ZoneInfo) -> datetime:
    """The naive wall time a series "starting now" begins at: the next whole local minute,
    unless its instant (to_utc_in) is before `now`. In the second pass of a repeated hour
    the wall times name the first pass's instants, already past (a COUNT's first ring would
    be an hour ago); there it is the same minute of the first hour after whose instant is
    not past: where a series at that minute rings next, since a repeat rings at the first
    pass of a repeated time. At 01:30:10 EST on the fall-back night, 02:31 EST (it was the
    hour's end, 02:00, and "every hour" rang at :00 for good)."""
    start = round_up(to_local(now, zone), "minute")
    end = start + _LONGEST_FOLD
    while to_utc_in(start, zone) < now and start < end:
        start += _AN_HOUR
    return start


def round_up(moment: datetime, unit: Literal["second", "minute"]) -> datetime:
    """The first whole `unit` at or after `moment` (aware, or a naive wall time): what is
    due at a fraction rounded this way is never early."""
    whole = (
        moment.replace(microsecond=0)
        if unit == "second"
        else moment.replace(second=0, microsecond=0)
    )
    return whole if whole == moment else whole + _UNITS[unit]
