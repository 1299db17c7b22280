"""The client side of the `reminders` command: one subcommand per RPC, JSON out.

    reminders create --user alice --text "call mom" --at 2026-10-26T18:00 --zone Europe/Paris
    reminders list --user alice --state pending

Where it connects: `--target`, else REMINDERS_API_TARGET, else where REMINDERS_API_HOST
and REMINDERS_API_PORT put the API `make run` starts (127.0.0.1:50051 by default). TLS
when REMINDERS_CLIENT_TLS_CA_FILE is set (plus REMINDERS_CLIENT_TLS_CERT_FILE and
_KEY_FILE for mTLS, _SERVER_NAME to check another name).

How it signs: with REMINDERS_CLIENT_TOKEN_FILE set, it sends the token in that file as it
is (one your identity provider issued, as an RS256 deployment needs; its `sub` must be
`--user`, and the file is read on every call, so a token refreshed beside it is picked up).
Otherwise a token for `--user`, minted with REMINDERS_JWT_SECRET when set. With
nothing configured the client assumes local development (REMINDERS_ENV=dev unless set
otherwise) and signs with the development secret. That is safe to assume on this side:
only a server started with REMINDERS_ENV=dev accepts such tokens. A real token (a token
file's, or one minted with REMINDERS_JWT_SECRET) never goes in plaintext off this host,
unless REMINDERS_PLAINTEXT_IN_MESH=true says a mesh encrypts the link.

Results print as JSON on stdout (proto field names, times RFC 3339 with seconds). A
failed call prints {"error": {"code", "message", "reason", "field_violations"}} on stderr
(each violation with the "option" that sets its field; a "hint" when no server answered;
a failed create's "request_id"; "retry" when a create or a change may have been made,
saying how to find out) and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import grpc
import jwt
from google.protobuf import duration_pb2, field_mask_pb2, json_format, timestamp_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2  # type: ignore[import-untyped, unused-ignore]
from grpc_status import rpc_status

from genproto.reminders.v1 import reminders_pb2 as pb
from genproto.reminders.v1 import reminders_pb2_grpc as pb_grpc
from reminders_svc.api.auth import mint_token, user_key_from_env
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import (
    ConfigError,
    Env,
    bare_host,
    listen_address,
    require_protected,
    target_problem,
)
from reminders_svc.tls import CLI_CLIENT_PREFIX, ClientTls

# Where an API server with no configuration listens: what `make run` started.
DEFAULT_TARGET = f"{ApiSettings.host}:{ApiSettings.port}"
TOKEN_TTL_S = 300.0
# Past the API's write deadline (as proto/reminders/v1/service_config.json's 15 s): a slow
# write is answered OUTCOME_UNKNOWN by the server, not cut short here with no answer.
CALL_TIMEOUT_S = ApiSettings.write_deadline.total_seconds() + 5
_DURATION_PART = re.compile(r"(\d+)([dhms])")
_SECONDS_PER_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# The longest google.protobuf.Duration: 10,000 years.
_MAX_DURATION_S = 315_576_000_000
STATES = {
    name.removeprefix("STATE_").lower(): number
    for name, number in pb.Reminder.State.items()
    if number != pb.Reminder.STATE_UNSPECIFIED
}
# A listing never shows deleted reminders, so it is no state to list by (INVALID_ARGUMENT).
LISTABLE_STATES = sorted(set(STATES) - {"deleted"})

# Calls one RPC by method name on the stub, with the caller's credentials.
Call = Callable[[str, Message], Message]
Command = Callable[[Call, argparse.Namespace], Message]
Parser = argparse.ArgumentParser


def _create(call: Call, args: argparse.Namespace) -> Message:
    schedule = _schedule_from_args(args, pb.Schedule())
    if schedule is None:
        raise UsageError("create needs --at, --repeat or --rrule")
    reminder = pb.Reminder(text=args.text, schedule=schedule)
    return call(
        "CreateReminder", pb.CreateReminderRequest(reminder=reminder, request_id=args.request_id)
    )


def _get(call: Call, args: argparse.Namespace) -> pb.Reminder:
    return cast(pb.Reminder, call("GetReminder", pb.GetReminderRequest(id=args.id)))


def _list(call: Call, args: argparse.Namespace) -> Message:
    request = pb.ListRemindersRequest(page_size=args.page_size, page_token=args.page_token)
    if args.state:
        request.state = STATES[args.state]
    return call("ListReminders", request)


def _edit(call: Call, args: argparse.Namespace) -> Message:
    reminder = pb.Reminder(id=args.id, version=args.version)
    paths = []
    if args.text is not None:
        reminder.text = args.text
        paths.append("text")
    if any(getattr(args, name) is not None for name in ("at", "repeat", "rrule", "start", "zone")):
        # A partial schedule (say, only --zone) keeps the rest of the stored one; so does a
        # new rule without --start: it keeps the series' start (the API would start it now).
        rule = args.repeat is not None or args.rrule is not None
        restarted = rule and args.start is not None
        complete = args.zone is not None and (args.at is not None or restarted)
        current = pb.Schedule() if complete else _get(call, args).schedule
        schedule = _schedule_from_args(args, current)
        assert schedule is not None
        reminder.schedule.CopyFrom(schedule)
        paths.append("schedule")
    if not paths:
        raise UsageError("edit needs --text or a schedule option")
    mask = field_mask_pb2.FieldMask(paths=paths)
    return call("UpdateReminder", pb.UpdateReminderRequest(reminder=reminder, update_mask=mask))


def _snooze(call: Call, args: argparse.Namespace) -> Message:
    request = pb.SnoozeReminderRequest(id=args.id)
    if args.snooze_for is not None:
        request.duration.CopyFrom(parse_duration(args.snooze_for))
    elif (instant := instant_option(args.until, "--until")) is not None:
        request.snooze_until_time.CopyFrom(instant)
    else:
        request.snooze_until_local_time = args.until
    return call("SnoozeReminder", request)


def _pause(call: Call, args: argparse.Namespace) -> Message:
    return call("PauseReminder", pb.PauseReminderRequest(id=args.id, version=args.version))


def _resume(call: Call, args: argparse.Namespace) -> Message:
    return call("ResumeReminder", pb.ResumeReminderRequest(id=args.id, version=args.version))


def _delete(call: Call, args: argparse.Namespace) -> Message:
    return call("DeleteReminder", pb.DeleteReminderRequest(id=args.id, version=args.version))


def _deliveries(call: Call, args: argparse.Namespace) -> Message:
    request = pb.ListDeliveriesRequest(
        reminder_id=args.id, page_size=args.page_size, page_token=args.page_token
    )
    return call("ListDeliveries", request)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--user", required=True, type=user_id, help="act as this user (the token's sub)"
    )
    common.add_argument(
        "--target",
        default=None,
        help="host:port (default $REMINDERS_API_TARGET, else where $REMINDERS_API_HOST and"
        f" $REMINDERS_API_PORT put the API, by default {DEFAULT_TARGET})",
    )
    common.add_argument(
        "--timeout",
        type=positive_seconds,
        default=CALL_TIMEOUT_S,
        help="seconds (default %(default)g: past the API's write deadline)",
    )

    def add(name: str, command: Command, help_text: str, *, takes_id: bool = True) -> Parser:
        parser = subparsers.add_parser(name, parents=[common], help=help_text)
        if takes_id:
            parser.add_argument("id", help="the reminder id")
        parser.set_defaults(handler=run, command_function=command)
        return parser

    create = add("create", _create, "create a reminder", takes_id=False)
    create.add_argument("--text", required=True)
    _add_schedule_options(create, editing=False)
    create.add_argument(
        "--request-id",
        type=request_id,
        default="",
        help="idempotency key (default: a new UUID, shown when the call fails): the same"
        " command repeated with it gets the reminder it made, never a second one",
    )

    add("get", _get, "show a reminder")

    listing = add("list", _list, "list reminders", takes_id=False)
    listing.add_argument("--state", choices=LISTABLE_STATES)
    _add_page_options(listing)

    edit = add("edit", _edit, "change text and/or schedule (needs --version)")
    edit.add_argument("--version", type=versions, required=True, help="the version last seen")
    edit.add_argument("--text")
    _add_schedule_options(edit, editing=True)

    snooze = add("snooze", _snooze, "ring once more later")
    until = snooze.add_mutually_exclusive_group(required=True)
    until.add_argument("--for", dest="snooze_for", metavar="DURATION", help="e.g. 10m, 1h30m")
    until.add_argument("--until", help="local time in the reminder's zone, or with an offset")

    for name, command, help_text in (
        ("pause", _pause, "stop ringing until resumed"),
        ("resume", _resume, "ring again from the next occurrence (and a snooze still ahead)"),
        ("delete", _delete, "delete a reminder"),
    ):
        add(name, command, help_text).add_argument(
            "--version", type=versions, default=0, help="only at this version (default: any)"
        )

    _add_page_options(add("deliveries", _deliveries, "a reminder's delivery history"))


def _add_schedule_options(parser: Parser, *, editing: bool) -> None:
    """An edit's schedule options keep what they leave out of the stored schedule: a new
    rule without --start keeps the series' start (a new start is asked for, not implied)."""
    start_default = "the series' stored start" if editing else "now"
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--at", metavar="LOCAL", help="once, at this local time (or with offset)")
    kind.add_argument("--repeat", metavar="EXPR", help='e.g. "every Monday 09:00"')
    kind.add_argument(
        "--rrule",
        metavar="RRULE",
        help="e.g. FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0 "
        f"(parts left out come from --start, default {start_default})",
    )
    parser.add_argument(
        "--start", metavar="LOCAL", help=f"local start of a repeat (default {start_default})"
    )
    parser.add_argument(
        "--zone",
        required=not editing,
        help="IANA zone, e.g. Europe/Paris" + (" (default the stored zone)" if editing else ""),
    )


def _add_page_options(parser: Parser) -> None:
    parser.add_argument(
        "--page-size", type=page_sizes, default=0, help="default 50; above 500 reads as 500"
    )
    parser.add_argument("--page-token", default="")


def bounded_integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high` (what the field holds)."""

    def integer(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"expected {low} to {high}")
        return number

    return integer


# What a request's int32 page_size and int64 version hold (0: the default, any version).
page_sizes = bounded_integer(0, 2**31 - 1)
versions = bounded_integer(0, 2**63 - 1)


def request_id(value: str) -> str:
    """An argparse type: the idempotency key given, else a new UUID (argparse passes the
    default, "", through it too, once per command line)."""
    return value or str(uuid.uuid4())


def user_id(value: str) -> str:
    """An argparse type: a user id, not blank (a token's subject)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("a user id is required")
    return value


# A day: gRPC's deadline overflows far above it (1e10 s ends a call at once).
MAX_SECONDS = 86_400


def positive_seconds(value: str) -> float:
    """An argparse type: a number of seconds above 0, at most a day (a call's deadline)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 < seconds <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds above 0, at most {MAX_SECONDS}"
        )
    return seconds


class UsageError(Exception):
    """A combination of options that cannot make a request."""


def parse_duration(text: str) -> duration_pb2.Duration:
    """`10m`, `1h30m`, `2d`, `90s` -> a Duration."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise UsageError(f"--for {text!r}: expected a duration like 10m, 1h30m, 2d or 90s")
    seconds = sum(int(number) * _SECONDS_PER_UNIT[unit] for number, unit in parts)
    if seconds > _MAX_DURATION_S:
        raise UsageError(f"--for {text!r}: out of range")
    return duration_pb2.Duration(seconds=seconds)


# A time that ends in an offset, as an instant option is written: what `fromisoformat`
# refusing it means is then a date or time that does not exist, not a local time.
_WITH_OFFSET = re.compile(r".*[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}(:?\d{2})?)", re.I)


def instant_option(text: str, option: str) -> timestamp_pb2.Timestamp | None:
    """The instant `option`'s `text` names when it carries an offset (`Z`, `+01:00`);
    None when it does not: a local time, sent as written for the server to read in the
    reminder's zone."""
    try:
        written = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", text))
    except ValueError:
        if _WITH_OFFSET.fullmatch(text):
            raise UsageError(f"{option} {text!r}: no such date and time") from None
        return None  # not ISO 8601 with an offset: the server names what is wrong
    if written.tzinfo is None:
        return None
    stamp = timestamp_pb2.Timestamp()
    try:
        stamp.FromDatetime(written)
    except (ValueError, OverflowError):  # past year 9999 or before year 1 in UTC
        raise UsageError(f"{option} {text!r}: out of range") from None
    return stamp


def _schedule_from_args(args: argparse.Namespace, base: pb.Schedule) -> pb.Schedule | None:
    """`base` with the schedule options given on the command line laid over it."""
    schedule = pb.Schedule()
    schedule.CopyFrom(base)
    # Output-only fields of a fetched schedule are not part of a request.
    schedule.description = ""
    if schedule.HasField("repeat"):
        schedule.repeat.canonical_rrule = ""
    if args.zone is not None:
        schedule.time_zone = args.zone
    if args.at is not None:
        if (instant := instant_option(args.at, "--at")) is not None:
            schedule.once.instant.CopyFrom(instant)
        else:
            schedule.once.local_time = args.at
    elif args.repeat is not None:
        schedule.repeat.expression = args.repeat
    elif args.rrule is not None:
        schedule.repeat.rrule = args.rrule
    if args.start is not None:
        if not schedule.HasField("repeat"):
            raise UsageError("--start applies to a repeating schedule (--repeat or --rrule)")
        schedule.repeat.start_local_time = args.start
    return schedule if schedule.WhichOneof("kind") else None


def client_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings a client reads: `environ`, in development unless it says otherwise.
    The client only signs; whether a development token is accepted is the server's call."""
    return {"REMINDERS_ENV": "dev", **environ}


def api_channel(target: str, env: Mapping[str, str]) -> grpc.Channel:
    """A channel to the API at `target`. When the client's tokens are real (not the
    development secret's), plaintext off this host is refused as the servers refuse it for
    their links: a token would be readable on the network, and valid for minutes."""
    # Read and checked like the servers' TLS settings: half a configuration or an unreadable
    # file is a ConfigError naming the variable (gRPC's core would abort the process).
    tls = ClientTls.from_env(env, CLI_CLIENT_PREFIX)
    if (problem := target_problem(target)) is not None:
        raise UsageError(f"the API target {target!r}: {problem}")
    if not signs_for_development(env):
        require_protected(
            env,
            f"The API target with a real token and no {CLI_CLIENT_PREFIX}CA_FILE",
            target,
            tls is not None,
            in_development_too=True,
        )
    if tls is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, tls.credentials(), options=tls.channel_options())


def unavailable_hint(target: str, message: str) -> str:
    """What to check when gRPC itself answers UNAVAILABLE (`message` is its details)."""
    if "handshake" in message.lower():
        return (
            f"the TLS handshake with {target} failed: a server without TLS, or a certificate"
            f" {CLI_CLIENT_PREFIX}CA_FILE does not trust (or not issued for that host)"
        )
    return f"no API answered at {target}; `make run` starts one"


def error_json(error: grpc.RpcError) -> dict[str, Any]:
    """The status of a failed call: its code, message, reason (google.rpc.ErrorInfo), the
    fields a google.rpc.BadRequest names, and, when the status carries them, what a
    PreconditionFailure or a QuotaFailure is about (their `subject`)."""
    code: grpc.StatusCode = error.code()
    body: dict[str, Any] = {"code": code.name, "message": error.details(), "reason": ""}
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # details that do not match the call's status (a proxy's rewrite)
        status = None
    violations: list[dict[str, str]] = []
    preconditions: list[dict[str, str]] = []
    quotas: list[dict[str, str]] = []
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            body["reason"] = info.reason
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            violations.extend(
                _violation(v.field, v.description) for v in bad_request.field_violations
            )
        elif detail.Is(error_details_pb2.PreconditionFailure.DESCRIPTOR):
            failure = error_details_pb2.PreconditionFailure()
            detail.Unpack(failure)
            preconditions.extend(
                {"type": v.type, "subject": v.subject, "description": v.description}
                for v in failure.violations
            )
        elif detail.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
            quota = error_details_pb2.QuotaFailure()
            detail.Unpack(quota)
            quotas.extend(
                {"subject": v.subject, "description": v.description} for v in quota.violations
            )
    body["field_violations"] = violations
    if preconditions:
        body["precondition_violations"] = preconditions
    if quotas:
        body["quota_violations"] = quotas
    return {"error": body}


# The option to change, by the request field a refusal names (the longest that starts its
# path): the field is the API's name for what the user typed.
_OPTIONS = {
    "id": "ID",
    "reminder.id": "ID",
    "reminder_id": "ID",
    "reminder.text": "--text",
    "reminder.version": "--version",
    "version": "--version",
    "request_id": "--request-id",
    "reminder.schedule.time_zone": "--zone",
    "reminder.schedule.once": "--at",
    "reminder.schedule.repeat.expression": "--repeat",
    "reminder.schedule.repeat.rrule": "--rrule",
    "reminder.schedule.repeat.start_local_time": "--start",
    "duration": "--for",
    "snooze_until_time": "--until",
    "snooze_until_local_time": "--until",
    "state": "--state",
    "page_size": "--page-size",
    "page_token": "--page-token",
}


def option_of(field: str) -> str | None:
    """The command-line option that sets request `field`, or None."""
    while field:
        if field in _OPTIONS:
            return _OPTIONS[field]
        field = field.rpartition(".")[0]
    return None


def _violation(field: str, description: str) -> dict[str, str]:
    violation = {"field": field, "description": description}
    if (option := option_of(field)) is not None:
        violation["option"] = option
    return violation


def default_target(env: Mapping[str, str]) -> str:
    """Where the API that `make run` started listens: REMINDERS_API_HOST and _PORT, as
    the server reads them."""
    return local_target(env, "REMINDERS_API_", ApiSettings.host, ApiSettings.port)


def local_target(env: Mapping[str, str], prefix: str, host: str, port: int) -> str:
    """Where a server of this host listens, as `env` sets its `<prefix>HOST` and
    `<prefix>PORT` (else `host` and `port`); one on every interface is reached on
    loopback."""
    bare = bare_host(Env(env).text(f"{prefix}HOST", host))
    loopback = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104 (dialled, not bound)
    return listen_address(loopback.get(bare, bare), Env(env).port(f"{prefix}PORT", port))


# Answers after which a create may or may not have been made: only its repeat, with the
# same request_id, tells (and never makes a second reminder).
_OUTCOME_UNKNOWN = frozenset(
    {
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
    }
)


# Commands that change a reminder without a request_id: after an unknown outcome, only a
# read tells whether the change landed (docs/clients.md, "Repeating a change").
_CHANGES = frozenset({"edit", "snooze", "pause", "resume", "delete"})


def _read_before_repeating(reminder_id: str) -> str:
    return f"the change may have been applied: `reminders get {reminder_id}` before repeating it"


def _repeat_create(request_id: str) -> str:
    return (
        "the reminder may have been created: repeat the command with"
        f" --request-id {request_id} to get it, never a second one"
    )


def signs_for_development(env: Mapping[str, str]) -> bool:
    """Whether the client's tokens are the development secret's (no token file, no key)."""
    return not env.get("REMINDERS_CLIENT_TOKEN_FILE") and user_key_from_env(env).is_development


def bearer_for(user: str, env: Mapping[str, str]) -> str:
    """The token to send as `user`: REMINDERS_CLIENT_TOKEN_FILE's, else one minted here."""
    path = env.get("REMINDERS_CLIENT_TOKEN_FILE")
    if not path:
        key = user_key_from_env(env)
        if not key.can_sign():
            raise UsageError(
                "REMINDERS_JWT_PUBLIC_KEY_FILE is set, and a public key cannot sign: set"
                " REMINDERS_CLIENT_TOKEN_FILE to a token from your issuer"
            )
        # As long as the server accepts (REMINDERS_JWT_MAX_LIFETIME_S may be shorter).
        return mint_token(key, user, min(TOKEN_TTL_S, key.max_lifetime_s))
    try:
        token = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not text"
        raise UsageError(
            f"REMINDERS_CLIENT_TOKEN_FILE={path!r}: cannot read it ({reason})"
        ) from None
    try:
        # Not verified (the server does that): read only to refuse acting as someone else.
        subject = jwt.decode(token, options={"verify_signature": False}).get("sub")
    except jwt.InvalidTokenError:
        raise UsageError(f"REMINDERS_CLIENT_TOKEN_FILE={path!r}: not a JWT") from None
    if subject != user:
        raise UsageError(f"REMINDERS_CLIENT_TOKEN_FILE={path!r}: its token is not for --user")
    return token


def run(args: argparse.Namespace) -> int:
    env = client_env(os.environ)
    command: Command = args.command_function
    creating = args.command == "create"
    try:
        target = args.target or env.get("REMINDERS_API_TARGET") or default_target(env)
        token = bearer_for(args.user, env)
        with api_channel(target, env) as channel:
            stub = pb_grpc.RemindersServiceStub(channel)
            metadata = (("authorization", f"Bearer {token}"),)

            def call(method: str, request: Message) -> Message:
                rpc = getattr(stub, method)
                response: Message = rpc(request, metadata=metadata, timeout=args.timeout)
                return response

            response = command(call, args)
    # ValueError and OverflowError: a number or time no request field can hold (a page
    # size past int32, a year past 9999 once in UTC), refused as the request is built.
    except (ConfigError, UsageError, OSError, ValueError, OverflowError) as error:
        print(f"reminders {args.command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if not creating:
            raise
        print(f"reminders create: interrupted; {_repeat_create(args.request_id)}", file=sys.stderr)
        return 130  # 128 + SIGINT
    except grpc.RpcError as error:
        failure = error_json(error)
        if error.code() == grpc.StatusCode.UNAVAILABLE and not failure["error"]["reason"]:
            # gRPC's own UNAVAILABLE (the API's carry a reason): nothing answered there, or
            # something did, but not in TLS we trust.
            failure["error"]["hint"] = unavailable_hint(target, failure["error"]["message"])
        if creating:
            failure["error"]["request_id"] = args.request_id
        # STORAGE_UNAVAILABLE: refused before anything was written.
        if error.code() in _OUTCOME_UNKNOWN and failure["error"]["reason"] != "STORAGE_UNAVAILABLE":
            if creating:
                failure["error"]["retry"] = _repeat_create(args.request_id)
            elif args.command in _CHANGES:
                failure["error"]["retry"] = _read_before_repeating(args.id)
        # One line, as every refusal here.
        print(json.dumps(failure, ensure_ascii=False), file=sys.stderr)
        return 1
    print(
        json.dumps(
            # Every field, defaults too: `deliveries` of none is {"deliveries": []}, not {}.
            json_format.MessageToDict(
                response,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            ),
            indent=2,
            ensure_ascii=False,  # a reminder in any language reads as written
        )
    )
    return 0
