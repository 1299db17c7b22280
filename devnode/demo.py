"""`reminders demo`: one reminder through the running stack, end to end.

Creates a one-off reminder due about `--in` seconds from now for a demo user (through the
API, signed and connected as the client commands are: the development key unless a
REMINDERS_JWT_* key or REMINDERS_CLIENT_TOKEN_FILE is set), waits for it to ring, and
prints the delivery (due, handed off, lateness) as JSON on stdout, its progress and
verdict on stderr. Exits 0 only if it rang exactly once and not early; 1 if not, or a
call failed; 2 on bad settings; 130 on Ctrl-C. The notifier is asked first, and a
reminder that did not ring (a failed call, Ctrl-C, the wait over) is deleted: left
behind, it would ring later with nobody watching.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from devnode.stack import notifier_target
from genproto.notification.v1 import notification_pb2 as npb
from genproto.notification.v1 import notification_pb2_grpc as npb_grpc
from genproto.reminders.v1 import reminders_pb2 as pb
from genproto.reminders.v1 import reminders_pb2_grpc as pb_grpc
from notifier.rpc.client import list_delivered
from reminders_svc.api.client_cli import (
    DEFAULT_TARGET,
    UsageError,
    api_channel,
    bearer_for,
    client_env,
    default_target,
    positive_seconds,
    user_id,
)
from reminders_svc.config import ConfigError

# How long pushes are watched after the first: a second one would be a duplicate.
DUPLICATE_WATCH_S = 5.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("demo", help="ring one reminder through the running stack")
    parser.add_argument(
        "--user", type=user_id, default="demo", help="the demo user (default: %(default)s)"
    )
    parser.add_argument(
        "--in",
        dest="seconds",
        type=positive_seconds,
        default=20.0,
        help="ring this many seconds from now (default %(default)g)",
    )
    parser.add_argument(
        "--api",
        help="the API (default: $REMINDERS_API_TARGET, else where `make run` serves it:"
        f" $REMINDERS_API_HOST and $REMINDERS_API_PORT, by default {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--notifier",
        help="the reference notifier (default: $REMINDERS_NOTIFIER_TARGET, as the dispatcher"
        " finds it, else where `make run` serves it: $REMINDERS_NOTIFIER_HOST and"
        f" $REMINDERS_NOTIFIER_PORT, by default {notifier_target({})})",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=120.0,
        help="how long to wait for the ring once it is due (seconds; default 120)",
    )
    parser.set_defaults(handler=run)


# Per call: a stack that is up answers in milliseconds; an address that swallows packets
# must not hang the demo.
CALL_TIMEOUT_S = 10.0


class DemoError(Exception):
    """A call failed; the message names the service and its address."""


@contextmanager
def _calling(service: str, address: str) -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as error:
        code = error.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise DemoError(
                f"the {service} at {address} did not answer ({code.name}); "
                "start the stack with `make run`"
            ) from None
        raise DemoError(
            f"the {service} at {address} answered {code.name}: {error.details()}"
        ) from None


def targets(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str]:
    """The API and the notifier to reach: the options, else the variables the client
    commands and the dispatcher read, else where `make run` serves them."""
    api = args.api or environ.get("REMINDERS_API_TARGET") or default_target(environ)
    notifier = args.notifier or notifier_target(environ)
    return api, notifier


def run(args: argparse.Namespace) -> int:
    env = client_env(os.environ)

    def signed() -> tuple[tuple[str, str]]:
        # Per call: a minted token lives minutes, and the demo may wait longer than that.
        return (("authorization", f"Bearer {bearer_for(args.user, env)}"),)

    try:
        args.api, args.notifier = targets(args, os.environ)
        signed()  # bad signing settings: exit 2 before anything is created
        channel = api_channel(args.api, env)
    except (ConfigError, UsageError) as error:
        print(f"reminders demo: {error}", file=sys.stderr)
        return 2
    try:
        return _demo(args, channel, signed)
    except (DemoError, UsageError) as error:
        print(f"reminders demo: {error}", file=sys.stderr)
        return 1


def due_in(seconds: float, now: datetime) -> datetime:
    """`seconds` from `now`, rounded up to a whole second (an instant is whole seconds;
    rounded down, a due less than a second ahead could be in the past)."""
    due = now + timedelta(seconds=seconds)
    return due if due.microsecond == 0 else due.replace(microsecond=0) + timedelta(seconds=1)


def _demo(
    args: argparse.Namespace, api_to: grpc.Channel, signed: Callable[[], tuple[tuple[str, str]]]
) -> int:
    due = due_in(args.seconds, datetime.now(UTC))
    instant = Timestamp()
    instant.FromDatetime(due)
    with api_to as api, grpc.insecure_channel(args.notifier) as push:
        # The notifier first: a wrong address, or one that records nothing (the logging
        # adapter), fails here, before a reminder is left to ring with nobody watching.
        _pushed(args, push)
        with _calling("API", args.api):
            created = pb_grpc.RemindersServiceStub(api).CreateReminder(
                pb.CreateReminderRequest(
                    reminder=pb.Reminder(
                        text="demo reminder",
                        schedule=pb.Schedule(time_zone="UTC", once=pb.OneOff(instant=instant)),
                    ),
                    request_id=uuid.uuid4().hex,
                ),
                metadata=signed(),
                timeout=CALL_TIMEOUT_S,
            )
        say(f"created {created.id}, due {instant.ToJsonString()}; waiting for it to ring ...")
        deadline = time.monotonic() + args.seconds + args.timeout
        try:
            pushes = _pushes_of(args, push, created.id, deadline)
            # Once a push is seen: the dispatcher writes the ring's record once the notifier
            # answers, which a lost reply and its retry delay; read before that, it was
            # printed with no hand-off while the demo said OK.
            delivery = None
            if pushes:
                with _calling("API", args.api):
                    delivery = _handed_off(api, created.id, signed, deadline)
            else:
                _delete(api, created.id, signed)
        except KeyboardInterrupt:
            _delete(api, created.id, signed)
            say(f"reminders demo: interrupted; its reminder {created.id} deleted")
            return 130
        except DemoError:
            _delete(api, created.id, signed)
            say(f"reminders demo: its reminder {created.id} deleted")
            raise
    report = {
        "reminder": created.id,
        # As the client commands print times and durations: protobuf's JSON forms.
        "due": instant.ToJsonString(),
        "pushes": len(pushes),
        "handed_off": delivery.hand_off_time.ToJsonString() if delivery else None,
        "lateness": delivery.lateness.ToJsonString() if delivery else None,
    }
    print(json.dumps(report, indent=2))
    early = any(p.push_time.ToDatetime(tzinfo=UTC) < due for p in pushes)
    if len(pushes) != 1 or early:
        say("demo FAILED: expected exactly one push, not early")
        return 1
    if delivery is None:
        say(f"demo FAILED: it rang, but no hand-off was recorded within {args.timeout:g} s")
        return 1
    say(f"demo OK: rang once, not early, handed off {report['lateness']} after its due")
    return 0


def _delete(
    api: grpc.Channel, reminder_id: str, signed: Callable[[], tuple[tuple[str, str]]]
) -> None:
    """Delete the demo's reminder, which left behind would ring later with nobody watching."""
    with contextlib.suppress(grpc.RpcError):
        pb_grpc.RemindersServiceStub(api).DeleteReminder(
            pb.DeleteReminderRequest(id=reminder_id), metadata=signed(), timeout=CALL_TIMEOUT_S
        )


def _pushed(args: argparse.Namespace, push: grpc.Channel) -> list[npb.Delivered]:
    """What the notifier pushed to the demo user."""
    with _calling("notifier", args.notifier):
        return list_delivered(
            npb_grpc.NotificationServiceStub(push), args.user, timeout_s=CALL_TIMEOUT_S
        )


def _pushes_of(
    args: argparse.Namespace, push: grpc.Channel, reminder_id: str, deadline: float
) -> list[npb.Delivered]:
    """The notifier's pushes of the reminder, watched for DUPLICATE_WATCH_S from the first
    (a second would be a duplicate), or until `deadline` (time.monotonic())."""
    pushes: list[npb.Delivered] = []
    watched_until: float | None = None
    while time.monotonic() < (deadline if watched_until is None else watched_until):
        pushes = [d for d in _pushed(args, push) if d.idempotency_key.startswith(reminder_id)]
        if pushes and watched_until is None:
            watched_until = time.monotonic() + DUPLICATE_WATCH_S
        time.sleep(0.5)
    return pushes


def _handed_off(
    api: grpc.Channel,
    reminder_id: str,
    signed: Callable[[], tuple[tuple[str, str]]],
    deadline: float,
) -> pb.Delivery | None:
    """The reminder's recorded hand-off, read until `deadline` (time.monotonic())."""
    history = pb_grpc.RemindersServiceStub(api)
    while True:
        answer = history.ListDeliveries(
            pb.ListDeliveriesRequest(reminder_id=reminder_id),
            metadata=signed(),
            timeout=CALL_TIMEOUT_S,
        )
        handed = [d for d in answer.deliveries if d.HasField("hand_off_time")]
        if handed or time.monotonic() >= deadline:
            return handed[0] if handed else None
        time.sleep(0.5)


def say(line: str) -> None:
    """Progress and verdict, on stderr: stdout is the JSON report alone."""
    print(line, file=sys.stderr, flush=True)
