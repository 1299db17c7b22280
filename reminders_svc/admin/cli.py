"""`reminders admin ...`: parts, parts grow, replay, inspect, replan (docs/operations.md).

Each subcommand's handler opens one Cassandra session (REMINDERS_CASSANDRA_*), runs its
coroutine and prints a table, or JSON with `--json`. Exit codes: 0 done, 1 storage
trouble, 2 bad configuration or a request refused (the message says why).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from cassandra import DriverException

from dispatcher.ratelimit import RateLimiter
from dispatcher.settings import DispatcherSettings
from reminders_svc.admin import inspect, parts, replan, replay
from reminders_svc.admin.context import Admin, AdminError, open_admin
from reminders_svc.admin.output import iso, print_counts, print_json, print_table
from reminders_svc.config import CassandraSettings, ConfigError, Retention, check_tz_override
from reminders_svc.schedule import ScheduleError, load_zone, tzdata_version
from reminders_svc.storage.errors import STORAGE_ERRORS, StorageUnavailable
from reminders_svc.storage.migrations import MigrationError
from reminders_svc.storage.parts import MINUTE, floor_minute

Command = Callable[[argparse.Namespace, Admin], Awaitable[int]]
# A check of a command's input that needs no database: it runs before connecting, so a
# mistyped zone or setting is refused at once, even with the cluster unreachable.
Precheck = Callable[[argparse.Namespace], None]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "admin", help="operate a deployment: parts, grow parts, replay, inspect, replan"
    )
    commands = parser.add_subparsers(dest="admin_command", required=True, metavar="ADMIN")

    parts_parser = commands.add_parser(
        "parts", help="each part's owner, epoch, lease expiry, checkpoint and checkpoint lag"
    )
    _json_flag(parts_parser)
    _command(parts_parser, _list_parts)
    parts_actions = parts_parser.add_subparsers(dest="parts_action", metavar="ACTION")
    grow_parser = parts_actions.add_parser(
        "grow", help="raise P from a minute ahead (P only grows)"
    )
    grow_parser.add_argument(
        "--to", type=_part_count, required=True, help=f"the new P (at most {parts.MAX_PARTS})"
    )
    grow_parser.add_argument(
        "--effective-in",
        type=parts.lead_seconds,
        default=parts.DEFAULT_LEAD,
        metavar="SECONDS",
        help="the new P takes effect from the first whole minute at least this far ahead "
        f"(default {parts.DEFAULT_LEAD.total_seconds():g}, at least "
        f"{parts.MIN_LEAD.total_seconds():g}: every process caches part counts for 30 s;"
        f" at most {parts.MAX_LEAD.total_seconds():g})",
    )
    grow_parser.add_argument(
        "--force",
        action="store_true",
        help=f"allow a P over {parts.MAX_GROWTH} times the latest (P never shrinks)",
    )
    # `admin parts --json grow` as well as `admin parts grow --json`.
    _json_flag(grow_parser, inherited=True)
    _command(grow_parser, _grow, precheck=_grow_precheck)

    replay_parser = commands.add_parser(
        "replay", help="re-read a range of minutes; re-arm rows still due (the row decides)"
    )
    replay_parser.add_argument(
        "--from", dest="first", type=minute_arg, required=True, help=f"the first minute, {_MINUTE}"
    )
    replay_parser.add_argument(
        "--to", dest="last", type=minute_arg, required=True, help="the last minute (replayed too)"
    )
    replay_parser.add_argument(
        "--ops-per-s",
        type=_rate,
        default=500.0,
        help="reads and writes per second (default %(default)s)",
    )
    replay_parser.add_argument("--dry-run", action="store_true", help="count, write nothing")
    _json_flag(replay_parser)
    _command(replay_parser, _replay, precheck=_replay_precheck)

    inspect_parser = commands.add_parser(
        "inspect", help="a minute's bucket entries and each row's state (never texts)"
    )
    inspect_parser.add_argument("--minute", type=minute_arg, required=True, help=_MINUTE)
    inspect_parser.add_argument("--part", type=_part, default=None, help="only this part")
    inspect_parser.add_argument(
        "--limit",
        type=_counted(1, 1_000_000),
        default=1000,
        help="entries at most (default %(default)s)",
    )
    _json_flag(inspect_parser)
    _command(inspect_parser, _inspect)

    replan_parser = commands.add_parser(
        "replan", help="after a tz database update, recompute the future dues of a zone"
    )
    replan_parser.add_argument("--zone", required=True, help="IANA zone, e.g. America/Sao_Paulo")
    replan_parser.add_argument(
        "--rows-per-s",
        type=_rate,
        default=5000.0,
        help="rows scanned per second (default %(default)s)",
    )
    replan_parser.add_argument(
        "--writes-per-s",
        type=_rate,
        default=200.0,
        help="rows re-planned per second (default %(default)s)",
    )
    replan_parser.add_argument(
        "--splits",
        type=_counted(1, MAX_SPLITS),
        default=256,
        help="token ranges (default %(default)s)",
    )
    replan_parser.add_argument(
        "--parallel",
        type=_counted(1, MAX_PARALLEL),
        default=4,
        help="ranges scanned at once (default %(default)s)",
    )
    replan_parser.add_argument("--dry-run", action="store_true", help="count, write nothing")
    _json_flag(replan_parser)
    _command(replan_parser, _replan, precheck=_replan_precheck)


_MINUTE = "a whole minute with its offset, e.g. 2026-10-26T13:00Z"


def minute_arg(text: str) -> datetime:
    """A whole UTC minute: `2026-10-26T13:00Z` (an offset is converted to UTC)."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want e.g. 2026-10-26T13:00Z") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r}: give the offset, e.g. Z for UTC")
    if value.second or value.microsecond:
        raise argparse.ArgumentTypeError(f"{text!r}: want a whole minute")
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00
        raise argparse.ArgumentTypeError(f"{text!r}: out of range") from None


# Pacing a run may ask for: slower than one a minute is a stall, faster than a million a
# second is no pacing (and `inf` would turn it off).
RATES = (0.01, 1_000_000.0)
# Token ranges and ranges at once of a replan: each range is a list entry and a scan.
MAX_SPLITS = 65_536
MAX_PARALLEL = 256


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low, high = RATES
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: want a number from {low:g} to {high:g}")
    return value


def _counted(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`."""

    def count(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: want a whole number from {low} to {high}")
        return value

    return count


_part = _counted(0, parts.MAX_PARTS - 1)
_part_count = _counted(1, parts.MAX_PARTS)


def _json_flag(parser: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    # A subcommand's default would overwrite its parent's flag: an inherited one has none.
    default = argparse.SUPPRESS if inherited else False
    parser.add_argument("--json", action="store_true", default=default, help="print JSON")


def _command(
    parser: argparse.ArgumentParser, command: Command, precheck: Precheck | None = None
) -> None:
    name = parser.prog

    def handler(args: argparse.Namespace) -> int:
        try:
            if precheck is not None:
                precheck(args)
            return asyncio.run(_with_admin(args, command))
        except (AdminError, ScheduleError, ConfigError) as error:
            print(f"{name}: {error}", file=sys.stderr)
            return 2
        except (StorageUnavailable, MigrationError) as error:
            print(f"{name}: {error}", file=sys.stderr)
            return 1
        except (*STORAGE_ERRORS, DriverException) as error:
            # Storage trouble after connecting too (a timeout, a missing table): one line,
            # not a traceback; the operator retries, or fixes the keyspace setting.
            print(f"{name}: storage: {type(error).__name__}: {error}", file=sys.stderr)
            return 1

    parser.set_defaults(handler=handler)


async def _with_admin(args: argparse.Namespace, command: Command) -> int:
    async with open_admin(CassandraSettings.from_env()) as admin:
        return await command(args, admin)


async def _list_parts(args: argparse.Namespace, admin: Admin) -> int:
    grace = DispatcherSettings.from_env().grace
    reports = [report.__dict__ for report in await parts.part_reports(admin, grace)]
    counts = parts.history(await admin.parts.load())
    if args.json:
        print_json({"now": iso(admin.now()), "part_counts": counts, "parts": reports})
        return 0
    for count in counts:
        print(f"P = {count['parts']} from {count['from_minute']}")
    columns = ("part", "owner", "epoch", "lease_until", "checkpoint", "checkpoint_lag_s")
    print_table([_marked(report) for report in reports], columns)
    return 0


def _marked(report: dict[str, object]) -> dict[str, object]:
    if report["in_force"]:
        return report
    return {**report, "part": f"{report['part']} (later)"}


async def _grow(args: argparse.Namespace, admin: Admin) -> int:
    result = await parts.grow(admin, args.to, args.effective_in, force=args.force)
    if args.json:
        print_json(result.as_dict())
        return 0
    if result.finished:
        print(
            f"P {result.parts} from {iso(result.effective_minute)} was stored already;"
            f" parts left unseeded by an earlier run, seeded now: {len(result.seeded_parts)}"
        )
        return 0
    print(
        f"P {result.previous_parts} -> {result.parts} from {iso(result.effective_minute)}; "
        f"new parts seeded: {len(result.seeded_parts)}"
    )
    return 0


def _grow_precheck(args: argparse.Namespace) -> None:
    parts.check_lead(args.effective_in)


def _replay_precheck(args: argparse.Namespace) -> None:
    if args.last < args.first:
        raise AdminError(f"--to {iso(args.last)} is before --from {iso(args.first)}")


async def _replay(args: argparse.Namespace, admin: Admin) -> int:
    # Refused, not read: a mistyped year would read P parts of millions of empty minutes.
    now = floor_minute(admin.now())
    retention = Retention.from_env().bucket
    if args.first < now - retention:
        raise AdminError(
            f"--from {iso(args.first)}: minutes before {iso(now - retention)} hold no entries"
            f" (they live {retention.days} days past their minute,"
            " REMINDERS_BUCKET_RETENTION_DAYS)"
        )
    if args.last > now:
        raise AdminError(f"--to {iso(args.last)}: minutes after {iso(now)} are not due yet")
    done = replay.ReplayReport()

    def progress(report: replay.ReplayReport) -> None:
        nonlocal done
        done = report
        every.tell(
            f"replayed through {iso(report.through)}: {report.minutes} minutes,"
            f" {report.entries} entries, {report.outcomes[replay.RE_ARMED]} re-armed"
        )

    every = _Progress()
    try:
        report = await replay.replay(
            admin,
            args.first,
            args.last,
            RateLimiter(args.ops_per_s),
            dry_run=args.dry_run,
            progress=progress,
            tell=_tell,
        )
    except BaseException:
        # Storage gone for good, or a stop: what is done stays done (re-armed entries
        # ring); the minutes from the next one on are left.
        if done.through is not None:
            _tell(
                f"stopped after minute {iso(done.through)} ({done.minutes} minutes done):"
                f" to go on, run it again with --from {iso(done.through + MINUTE)}"
            )
        raise
    if args.json:
        print_json({**report.as_dict(), "dry_run": args.dry_run})
        return 0
    print(f"{report.minutes} minutes, {report.entries} entries{' (dry run)' * args.dry_run}")
    print_counts("by outcome:", report.outcomes)
    return 0


class _Progress:
    """Progress lines on stderr, at most one every PROGRESS_EVERY_S (a run of hours is
    watched with `kubectl logs -f`)."""

    def __init__(self) -> None:
        self._last = -math.inf

    def tell(self, line: str) -> None:
        if time.monotonic() - self._last >= PROGRESS_EVERY_S:
            self._last = time.monotonic()
            _tell(line)


PROGRESS_EVERY_S = 10.0


def _tell(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _inspect(args: argparse.Namespace, admin: Admin) -> int:
    count, states = await inspect.inspect_minute(admin, args.minute, args.part, args.limit)
    rows = [state.as_dict() for state in states]
    if args.json:
        print_json({"minute": iso(args.minute), "parts": count, "entries": rows})
        return 0
    print(
        f"minute {iso(args.minute)}: P = {count}, {len(rows)} entries shown (--limit {args.limit})"
    )
    columns = (
        "part",
        "reminder_id",
        "user_id",
        "entry_due",
        "status",
        "due",
        "version",
        "claim_due",
        "claim_expires",
    )
    print_table(rows, columns)
    return 0


def _replan_precheck(args: argparse.Namespace) -> None:
    check_tz_override(os.environ)
    load_zone(args.zone)


def _waiting(seconds: float) -> None:
    print(
        f"a row waits for its snooze's ring in flight: looking again in {seconds:g} s",
        file=sys.stderr,
        flush=True,
    )


async def _replan(args: argparse.Namespace, admin: Admin) -> int:
    settings = replan.ScanSettings(
        rows_per_s=args.rows_per_s,
        writes_per_s=args.writes_per_s,
        splits=args.splits,
        parallel=args.parallel,
    )
    every = _Progress()

    def progress(report: replan.ReplanReport) -> None:
        every.tell(
            f"token ranges done: {report.ranges_done} of {report.ranges};"
            f" {report.scanned} rows scanned; moved {report.outcomes['moved']}"
        )

    report = await replan.replan_zone(
        admin,
        args.zone,
        tzdata_version(),
        settings,
        dry_run=args.dry_run,
        waiting=_waiting,
        progress=progress,
        tell=_tell,
    )
    if args.json:
        print_json({**report.as_dict(), "dry_run": args.dry_run})
        return 0
    print(f"zone {report.zone}, rules {report.rules}{' (dry run)' * args.dry_run}")
    if len(report.names) > 1:
        print(f"with its links: {', '.join(n for n in report.names if n != report.zone)}")
    print(f"{report.scanned} rows scanned")
    print_counts("in the zone, by outcome:", report.outcomes)
    return 0
