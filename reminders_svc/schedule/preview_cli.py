"""`reminders preview`: list a schedule's next rings, for people (text) and scripts (--json)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from reminders_svc.schedule.build import one_off_local, parse_local_datetime, parse_rrule
from reminders_svc.schedule.describe import describe
from reminders_svc.schedule.errors import ScheduleError
from reminders_svc.schedule.expand import occurrences, validate_new
from reminders_svc.schedule.grammar import parse_repeat
from reminders_svc.schedule.model import Schedule
from reminders_svc.schedule.zones import (
    check_year,
    load_place,
    load_zone,
    start_from,
    tzdata_version,
)

MAX_PREVIEW = 1000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "preview",
        help="list the next rings of a schedule",
        description=(
            "List a schedule's rings at or after --from (default: now). LOCAL_DATETIME is "
            "ISO 8601 without an offset (2026-11-01T01:30:00), read in --zone. Exit 2 on "
            "bad input."
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--repeat", metavar="EXPR", help='e.g. "every Monday 09:00"')
    source.add_argument("--rrule", metavar="RRULE", help="RFC 5545 RRULE text")
    source.add_argument("--at", metavar="LOCAL_DATETIME", help="a one-off local time")
    parser.add_argument(
        "--start", metavar="LOCAL_DATETIME", help="repeat start (default: --from's next minute)"
    )
    parser.add_argument("--zone", metavar="ZONE", help="IANA zone, e.g. America/New_York")
    parser.add_argument("--from", dest="from_", metavar="UTC_ISO", help="stands in for now")
    parser.add_argument(
        "--count",
        type=int,
        default=10,
        help=f"at most this many (default %(default)s, at most {MAX_PREVIEW})",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON array")
    parser.add_argument(
        "--version", action="store_true", help="print the tz database version and exit"
    )
    parser.set_defaults(handler=run)


def _from_instant(text: str | None) -> datetime:
    if text is None:
        return datetime.now(UTC).replace(microsecond=0)
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ScheduleError("from", f"{text!r} is not an ISO 8601 instant") from None
    # The year checked before the offset is applied (0001-01-01T00:00+05:00 has no UTC).
    check_year(value, "from")
    # A bare date-time is read as UTC, as the option's name says.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _schedule(args: argparse.Namespace, now: datetime) -> Schedule:
    if args.zone is None:
        raise ScheduleError("zone", "--zone is required")
    zone = load_place(args.zone)
    if args.at is not None:
        return one_off_local(parse_local_datetime(args.at, "at"), args.zone)
    start = (
        start_from(now, zone) if args.start is None else parse_local_datetime(args.start, "start")
    )
    given = args.start is not None
    if args.repeat is not None:
        return parse_repeat(args.repeat, args.zone, start, start_given=given)
    if args.rrule is not None:
        return parse_rrule(args.rrule, args.zone, start, start_given=given)
    raise ScheduleError("repeat", "give one of --repeat, --rrule or --at")


def _rows(schedule: Schedule, now: datetime, count: int) -> list[dict[str, str]]:
    if not 1 <= count <= MAX_PREVIEW:
        raise ScheduleError("count", f"--count {count} must be between 1 and {MAX_PREVIEW}")
    validate_new(schedule, now)
    zone = load_zone(schedule.zone)
    return [
        {
            "utc": ring.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "local": ring.astimezone(zone).isoformat(),
        }
        for ring in occurrences(schedule, now, count)
    ]


def run(args: argparse.Namespace) -> int:
    if args.version:
        print(f"tz database {tzdata_version()}")
        return 0
    try:
        now = _from_instant(args.from_)
        schedule = _schedule(args, now)
        rows = _rows(schedule, now, args.count)
    except ScheduleError as error:
        print(f"reminders preview: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows))
        return 0
    print(describe(schedule))
    for row in rows:
        print(f"{row['utc']}  {row['local']}")
    return 0
