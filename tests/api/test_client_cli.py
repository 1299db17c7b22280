"""The client subcommands: requests built from options (no server), then end to end."""

from __future__ import annotations

import argparse
import json
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import jwt
import pytest
from google.protobuf.message import Message

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.api import client_cli
from reminders_svc.config import CassandraSettings
from tests.api.serving import SERVING, serve_api
from tests.pki import issue_pki, rsa_token_keys
from tests.platform.helpers import free_port, run_cli

STORED = pb.Reminder(
    id="r1",
    version=3,
    schedule=pb.Schedule(
        time_zone="America/New_York",
        description="Every Monday at 09:00",
        repeat=pb.Repeat(expression="every Monday 09:00", canonical_rrule="FREQ=WEEKLY"),
    ),
)


def requests_of(*argv: str) -> list[tuple[str, Message]]:
    """The RPCs a command line makes, answered from STORED."""
    parser = argparse.ArgumentParser()
    client_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args([*argv, "--user", "alice"])
    made: list[tuple[str, Message]] = []

    def call(method: str, request: Message) -> Message:
        made.append((method, request))
        return STORED

    args.command_function(call, args)
    return made


def test_create_one_off_and_repeat() -> None:
    [(method, request)] = requests_of(
        "create", "--text", "hi", "--at", "2026-10-26T18:00:00", "--zone", "Europe/Paris"
    )
    assert method == "CreateReminder"
    assert isinstance(request, pb.CreateReminderRequest)
    assert request.reminder.schedule.once.local_time == "2026-10-26T18:00:00"
    assert request.request_id  # a fresh idempotency key when none is given
    [(_, rrule)] = requests_of(
        "create", "--text", "t", "--rrule", "FREQ=DAILY", "--start", "2026-10-26T08:00",
        "--zone", "UTC", "--request-id", "k1",
    )  # fmt: skip
    assert isinstance(rrule, pb.CreateReminderRequest)
    assert rrule.request_id == "k1"
    assert rrule.reminder.schedule.repeat.rrule == "FREQ=DAILY"
    assert rrule.reminder.schedule.repeat.start_local_time == "2026-10-26T08:00"


def test_edit_builds_the_mask_and_keeps_the_rest_of_the_schedule() -> None:
    [(_, text_only)] = requests_of("edit", "r1", "--version", "3", "--text", "new")
    assert isinstance(text_only, pb.UpdateReminderRequest)
    assert list(text_only.update_mask.paths) == ["text"]
    (get, _), (_, zone_only) = requests_of("edit", "r1", "--version", "3", "--zone", "Asia/Tokyo")
    assert get == "GetReminder"
    assert isinstance(zone_only, pb.UpdateReminderRequest)
    assert list(zone_only.update_mask.paths) == ["schedule"]
    schedule = zone_only.reminder.schedule
    assert schedule.time_zone == "Asia/Tokyo"
    assert schedule.repeat.expression == "every Monday 09:00"
    assert not schedule.description
    assert not schedule.repeat.canonical_rrule
    assert zone_only.reminder.version == 3


def test_edit_of_the_rule_keeps_the_series_start_unless_given() -> None:
    """A new rule with its zone, and no --start: the stored start stays (the API would
    start a repeat sent without one now); with --start or a one-off, nothing is fetched."""
    stored_start = "2027-01-10T09:00"
    STORED.schedule.repeat.start_local_time = stored_start
    try:
        (get, _), (_, new_rule) = requests_of(
            "edit", "r1", "--version", "3", "--repeat", "every day 11:00", "--zone", "UTC"
        )
    finally:
        STORED.schedule.repeat.start_local_time = ""
    assert get == "GetReminder"
    assert isinstance(new_rule, pb.UpdateReminderRequest)
    schedule = new_rule.reminder.schedule
    assert (schedule.repeat.expression, schedule.time_zone) == ("every day 11:00", "UTC")
    assert schedule.repeat.start_local_time == stored_start
    [(_, restarted)] = requests_of(
        "edit", "r1", "--version", "3", "--repeat", "every day 11:00", "--zone", "UTC",
        "--start", "2027-02-01T11:00",
    )  # fmt: skip
    assert isinstance(restarted, pb.UpdateReminderRequest)
    assert restarted.reminder.schedule.repeat.start_local_time == "2027-02-01T11:00"
    [(_, one_off)] = requests_of(
        "edit", "r1", "--version", "3", "--at", "2027-02-01T11:00", "--zone", "UTC"
    )
    assert isinstance(one_off, pb.UpdateReminderRequest)
    assert one_off.reminder.schedule.once.local_time == "2027-02-01T11:00"


def test_edit_of_the_start_alone_keeps_the_rule() -> None:
    (get, _), (_, moved) = requests_of(
        "edit", "r1", "--version", "3", "--start", "2027-02-01T09:00", "--zone", "Asia/Tokyo"
    )
    assert get == "GetReminder"
    assert isinstance(moved, pb.UpdateReminderRequest)
    repeat = moved.reminder.schedule.repeat
    assert (repeat.expression, repeat.start_local_time) == (
        "every Monday 09:00",
        "2027-02-01T09:00",
    )
    assert moved.reminder.schedule.time_zone == "Asia/Tokyo"


def test_snooze_for_and_until() -> None:
    [(_, for_ten)] = requests_of("snooze", "r1", "--for", "1h30m")
    assert isinstance(for_ten, pb.SnoozeReminderRequest)
    assert for_ten.duration.seconds == 5400
    [(_, local)] = requests_of("snooze", "r1", "--until", "2026-10-26T18:00:00")
    assert isinstance(local, pb.SnoozeReminderRequest)
    assert local.snooze_until_local_time == "2026-10-26T18:00:00"
    [(_, instant)] = requests_of("snooze", "r1", "--until", "2026-10-26T18:00:00Z")
    assert isinstance(instant, pb.SnoozeReminderRequest)
    assert instant.snooze_until_time.seconds > 0


@pytest.mark.parametrize("text", ["", "10", "m", "10x", "1h 30m", "-5m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(client_cli.UsageError):
        client_cli.parse_duration(text)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (("list", "--page-size", "3000000000"), "--page-size"),
        (("pause", "r1", "--version", "99999999999999999999"), "--version"),
        (("snooze", "r1", "--for", "99999999999999999999s"), "--for"),
        (("snooze", "r1", "--for", "99999999999999999999d"), "--for"),
        (("snooze", "r1", "--until", "9999-12-31T23:30:00-05:00"), "--until"),
        (("create", "--text", "t", "--zone", "UTC", "--at", "9999-12-31T23:00-05:00"), "--at"),
        # An offset says it is an instant: the date is what is wrong, not the offset.
        (("create", "--text", "t", "--zone", "UTC", "--at", "2026-02-30T09:00+01:00"), "--at"),
        (("snooze", "r1", "--until", "2026-10-26T24:00Z"), "--until"),
    ],
    ids=[
        "page size past int32",
        "version past int64",
        "duration too long",
        "duration past protobuf's",
        "past year 9999",
        "an instant past year 9999",
        "February 30 with an offset",
        "hour 24 in UTC",
    ],
)
def test_a_value_no_request_can_hold_is_one_line_naming_its_option(
    argv: tuple[str, ...], option: str
) -> None:
    # Refused as the request is built: no server is reached (nothing listens there).
    done = run_cli(*argv, "--user", "alice", "--target", "127.0.0.1:1", timeout=60)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    # argparse prints its usage above the line; the line is the refusal.
    refusal = done.stderr.splitlines()[-1]
    assert refusal.startswith(f"reminders {argv[0]}: "), done.stderr
    assert option in refusal, done.stderr


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (("list", "--state", "deleted", "--user", "alice"), "argument --state: invalid choice"),
        (("get", "r1", "--user", " "), "argument --user: a user id is required"),
        (
            ("get", "r1", "--user", "alice", "--timeout", "0"),
            "argument --timeout: expected a number of seconds above 0",
        ),
        (("get", "r1", "--user", "alice", "--timeout", "soon"), "is not a number of seconds"),
        # gRPC's deadline overflows: the call would end at once, DEADLINE_EXCEEDED.
        (("get", "r1", "--user", "alice", "--timeout", "1e10"), "at most 86400"),
    ],
    ids=[
        "deleted is no state to list by",
        "blank user",
        "no time to call",
        "not a number",
        "no deadline gRPC can keep",
    ],
)
def test_options_no_server_takes_are_refused_naming_the_option(
    argv: tuple[str, ...], complaint: str
) -> None:
    done = run_cli(*argv, "--target", "127.0.0.1:1", timeout=60)

    assert done.returncode == 2, done.stderr
    assert complaint in done.stderr


@pytest.mark.parametrize(
    ("field", "option"),
    [
        ("reminder.schedule.time_zone", "--zone"),
        ("reminder.schedule.once.local_time", "--at"),
        ("reminder.schedule.once.instant", "--at"),
        ("reminder.schedule.repeat.rrule", "--rrule"),
        ("reminder.schedule.repeat.start_local_time", "--start"),
        ("snooze_until_local_time", "--until"),
        ("reminder.text", "--text"),
        ("page_token", "--page-token"),
        ("id", "ID"),
        ("reminder.schedule", None),
        ("update_mask", None),
    ],
)
def test_a_refused_field_is_told_by_the_option_that_sets_it(field: str, option: str | None) -> None:
    assert client_cli.option_of(field) == option


def test_the_default_target_is_where_the_api_was_told_to_listen() -> None:
    assert client_cli.default_target({}) == "127.0.0.1:50051"
    assert client_cli.default_target({"REMINDERS_API_PORT": "6051"}) == "127.0.0.1:6051"
    # Listening on every interface: reached on loopback.
    every = {"REMINDERS_API_HOST": "0.0.0.0", "REMINDERS_API_PORT": "6051"}  # noqa: S104
    assert client_cli.default_target(every) == "127.0.0.1:6051"
    assert client_cli.default_target({"REMINDERS_API_HOST": "::"}) == "[::1]:50051"
    assert client_cli.default_target({"REMINDERS_API_HOST": "::1"}) == "[::1]:50051"


def test_a_create_that_may_have_been_made_says_how_to_repeat_it() -> None:
    """Nothing answered: the create may not have been sent, or sent and made. Its
    request_id (a new one, never shown before) is the only way to repeat it safely."""
    target = f"127.0.0.1:{free_port()}"
    done = run_cli(
        "create", "--user", "alice", "--text", "t", "--at", "2027-01-01T09:00",
        "--zone", "UTC", "--target", target, timeout=60,
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    error = json.loads(done.stderr)["error"]
    uuid.UUID(error["request_id"])
    assert error["retry"] == (
        "the reminder may have been created: repeat the command with"
        f" --request-id {error['request_id']} to get it, never a second one"
    )


@pytest.mark.parametrize("command", ["edit", "snooze", "pause", "resume", "delete"])
def test_a_change_that_may_have_been_made_says_to_read_before_repeating(command: str) -> None:
    """None of these carries a request_id: only a read tells whether it landed."""
    target = f"127.0.0.1:{free_port()}"
    options = {"edit": ("--version", "1", "--text", "t"), "snooze": ("--for", "10m")}
    done = run_cli(
        command, "r1", *options.get(command, ()), "--user", "alice", "--target", target,
        timeout=60,
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    error = json.loads(done.stderr)["error"]
    assert error["retry"] == (
        "the change may have been applied: `reminders get r1` before repeating it"
    )


def test_a_read_that_failed_says_nothing_about_repeating() -> None:
    done = run_cli("get", "r1", "--user", "alice", "--target", f"127.0.0.1:{free_port()}")

    assert done.returncode == 1, done.stderr
    assert "retry" not in json.loads(done.stderr)["error"]


def test_the_api_port_make_run_was_given_is_where_the_client_goes() -> None:
    port = str(free_port())
    done = run_cli("get", "r1", "--user", "alice", env={"REMINDERS_API_PORT": port}, timeout=60)

    assert done.returncode == 1, done.stderr
    assert json.loads(done.stderr)["error"]["hint"].startswith(
        f"no API answered at 127.0.0.1:{port};"
    )


def test_no_server_at_the_target_says_so() -> None:
    target = f"127.0.0.1:{free_port()}"
    done = run_cli("get", "r1", "--user", "alice", "--target", target, timeout=60)

    assert done.returncode == 1, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr  # one JSON line
    error = json.loads(done.stderr)["error"]
    assert (error["code"], error["hint"]) == (
        "UNAVAILABLE",
        f"no API answered at {target}; `make run` starts one",
    )


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("127.0.0.1:99999", "port 99999 is not 1 to 65535"),
        ("ipv4:127.0.0.1:50051,127.0.0.1:70000", "port 70000 is not 1 to 65535"),
        ("[::1]:0", "port 0 is not 1 to 65535"),
        # gRPC dials 443 then, where no API listens.
        ("localhost", "no port: expected host:port"),
    ],
)
def test_a_target_port_no_connection_can_have_is_refused_naming_it(
    target: str, problem: str
) -> None:
    """gRPC wraps it round (99999 to 34463) and connects there: an answer from whatever
    listens on that port, or a hint naming the port asked for."""
    done = run_cli("get", "r1", "--user", "alice", "--target", target, timeout=60)

    assert done.returncode == 2, done.stderr
    assert done.stderr == f"reminders get: the API target {target!r}: {problem}\n"


def test_a_failed_tls_handshake_is_told_from_no_server(tmp_path: Path) -> None:
    """A CA file set against a server without TLS: it answered, and the hint said nothing
    had."""
    plaintext = grpc.server(ThreadPoolExecutor(1))
    port = plaintext.add_insecure_port("127.0.0.1:0")
    plaintext.start()
    try:
        target = f"127.0.0.1:{port}"
        env = {"REMINDERS_ENV": "dev", "REMINDERS_CLIENT_TLS_CA_FILE": str(issue_pki(tmp_path).ca)}
        done = run_cli("get", "r1", "--user", "alice", "--target", target, env=env, timeout=60)
    finally:
        plaintext.stop(0)

    assert done.returncode == 1, done.stderr
    # gRPC's core logs the handshake's failure on stderr too.
    line = next(line for line in done.stderr.splitlines() if line.startswith('{"error"'))
    error = json.loads(line)["error"]
    assert error["code"] == "UNAVAILABLE"
    assert error["hint"].startswith(f"the TLS handshake with {target} failed"), error


def cli_json(target: str, *argv: str) -> dict[str, object]:
    done = run_cli(*argv, "--target", target, env={"REMINDERS_ENV": "dev"}, timeout=60)
    assert done.returncode == 0, done.stderr
    parsed: dict[str, object] = json.loads(done.stdout)
    return parsed


def test_end_to_end_against_serve_api(migrated_settings: CassandraSettings) -> None:
    with serve_api(migrated_settings) as api:
        api.wait_for_health(SERVING)
        user = ("--user", "cli-alice")
        created = cli_json(
            api.target, "create", *user, "--text", "standup",
            "--repeat", "every Monday 09:00", "--zone", "America/New_York",
        )  # fmt: skip
        reminder_id = str(created["id"])
        # RFC 3339 with seconds.
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", str(created["next_ring_time"]))
        assert cli_json(api.target, "get", reminder_id, *user)["id"] == reminder_id
        listed = cli_json(api.target, "list", *user, "--state", "pending")
        assert [r["id"] for r in listed["reminders"]] == [reminder_id]  # type: ignore[attr-defined]
        edited = cli_json(
            api.target, "edit", reminder_id, *user, "--version", "1", "--text", "café ☕"
        )
        assert edited["text"] == "café ☕"
        # Printed as written, not as \u escapes: a person reads it.
        got = run_cli("get", reminder_id, *user, "--target", api.target, timeout=60)
        assert '"text": "café ☕"' in got.stdout
        snoozed = cli_json(api.target, "snooze", reminder_id, *user, "--for", "10m")
        assert "snooze_until_time" in snoozed
        paused = cli_json(api.target, "pause", reminder_id, *user)
        assert paused["state"] == "STATE_PAUSED"
        assert paused["ring_in_flight"] is False  # printed whatever its value, as every field
        assert cli_json(api.target, "resume", reminder_id, *user)["state"] == "STATE_PENDING"
        # Every field printed, defaults too: none is an empty list, not a missing key.
        assert cli_json(api.target, "deliveries", reminder_id, *user) == {
            "deliveries": [],
            "next_page_token": "",
        }
        deleted = cli_json(api.target, "delete", reminder_id, *user)
        assert deleted["was_sending"] is False
        assert deleted["reminder"]["state"] == "STATE_DELETED"  # type: ignore[index]

        missing = run_cli("get", reminder_id, *user, "--target", api.target, timeout=60)
        assert missing.returncode == 1
        assert json.loads(missing.stderr)["error"]["code"] == "NOT_FOUND"
        assert json.loads(missing.stderr)["error"]["reason"] == "REMINDER_NOT_FOUND"
        bad_zone = run_cli(
            "create", *user, "--text", "t", "--at", "2027-01-01T09:00", "--zone", "Mars/Base",
            "--target", api.target, timeout=60,
        )  # fmt: skip
        assert bad_zone.returncode == 1
        error = json.loads(bad_zone.stderr)["error"]
        assert (error["code"], error["reason"]) == ("INVALID_ARGUMENT", "INVALID_FIELD")
        # The field as the API names it, and the option that sets it here.
        assert [(v["field"], v["option"]) for v in error["field_violations"]] == [
            ("reminder.schedule.time_zone", "--zone")
        ]
        # A refused create is not made: its request_id, but no advice to repeat it.
        assert error["request_id"]
        assert "retry" not in error
        once = ("--at", "2027-01-01T09:00", "--zone", "UTC", "--request-id", "cli-req-1")
        cli_json(api.target, "create", *user, "--text", "first", *once)
        reused = run_cli(
            "create", *user, "--text", "other", *once, "--target", api.target, timeout=60
        )
        assert reused.returncode == 1
        error = json.loads(reused.stderr)["error"]
        assert (error["code"], error["reason"]) == ("FAILED_PRECONDITION", "REQUEST_ID_REUSED")
        # What the precondition is about, as the status's PreconditionFailure names it.
        assert [v["subject"] for v in error["precondition_violations"]] == ["request_id"]
        assert api.terminate() == 0


def test_the_token_command_refuses_a_blank_user() -> None:
    done = run_cli("token", "--user", "", env={"REMINDERS_ENV": "dev"}, timeout=60)

    assert done.returncode == 2, done.stderr
    assert "argument --user: a user id is required" in done.stderr


def test_the_token_command_refuses_a_token_that_would_expire_as_it_is_issued() -> None:
    # A token's times are whole seconds: --ttl 0.5 minted one whose exp was its iat.
    done = run_cli("token", "--user", "alice", "--ttl", "0.5", env={"REMINDERS_ENV": "dev"})

    assert done.returncode == 2, done.stderr  # an option no token can carry
    assert done.stdout == ""
    assert "lifetime must be at least 1 s" in done.stderr


def test_a_token_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    binary = tmp_path / "token.der"
    binary.write_bytes(b"\xff\xfe\x00")
    for path, reason in ((tmp_path, "Is a directory"), (binary, "not text")):
        done = run_cli(
            "get",
            "r1",
            "--user",
            "alice",
            "--target",
            "127.0.0.1:1",
            env={"REMINDERS_CLIENT_TOKEN_FILE": str(path)},
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert f"REMINDERS_CLIENT_TOKEN_FILE={str(path)!r}: cannot read it ({reason})" in (
            done.stderr
        )
        assert "Traceback" not in done.stderr


def test_the_client_signs_for_no_longer_than_the_server_accepts() -> None:
    """A shared ConfigMap may cap tokens below the client's 300 s: it signs for the cap,
    and reaches the call (no server here), rather than refusing to sign at all."""
    target = f"127.0.0.1:{free_port()}"
    capped = {"REMINDERS_JWT_MAX_LIFETIME_S": "100"}
    done = run_cli("get", "r1", "--user", "alice", "--target", target, env=capped, timeout=60)

    assert done.returncode == 1, done.stderr
    assert json.loads(done.stderr)["error"]["code"] == "UNAVAILABLE"


def test_a_token_from_the_identity_provider_reaches_an_rs256_server(
    migrated_settings: CassandraSettings, tmp_path: Path
) -> None:
    """Where the server only verifies (RS256), the client cannot mint: it sends the token
    in REMINDERS_CLIENT_TOKEN_FILE, and refuses one issued for another user."""
    private_pem, public_file = rsa_token_keys(tmp_path)
    issuer = "https://idp.example.com"

    def token_file(name: str, **claims: object) -> dict[str, str]:
        now = int(time.time())
        claims = {"sub": "rs-alice", "aud": "reminders", "iat": now, "exp": now + 300, **claims}
        path = tmp_path / name
        path.write_text(jwt.encode(claims, private_pem, algorithm="RS256") + "\n")
        return {"REMINDERS_CLIENT_TOKEN_FILE": str(path)}

    with serve_api(
        migrated_settings,
        REMINDERS_ENV="prod",
        REMINDERS_JWT_PUBLIC_KEY_FILE=public_file,
        REMINDERS_JWT_ISSUER=issuer,
        REMINDERS_ADMIN_JWT_SECRET="a" * 40,
    ) as api:
        api.wait_for_health(SERVING)
        get = ("get", str(uuid.uuid4()), "--user", "rs-alice", "--target", api.target)

        accepted = run_cli(*get, env=token_file("good", iss=issuer), timeout=60)
        assert accepted.returncode == 1, accepted.stderr
        # Authenticated: the id is simply not this user's.
        assert json.loads(accepted.stderr)["error"]["code"] == "NOT_FOUND"

        other_issuer = run_cli(*get, env=token_file("other", iss="https://x.example"), timeout=60)
        assert json.loads(other_issuer.stderr)["error"]["code"] == "UNAUTHENTICATED"

        someone_else = run_cli(*get, env=token_file("bob", iss=issuer, sub="bob"), timeout=60)
        assert someone_else.returncode == 2
        assert "its token is not for --user" in someone_else.stderr

        # With neither a token file nor a secret, an RS256 client has nothing to sign with.
        unsigned = run_cli(*get, env={"REMINDERS_ENV": "prod"}, timeout=60)
        assert unsigned.returncode == 2
        assert "no token key" in unsigned.stderr
        # The server's own settings (its public key) in the client's environment: told
        # where a token comes from, not only that this key cannot sign.
        server_env = {"REMINDERS_ENV": "prod", "REMINDERS_JWT_PUBLIC_KEY_FILE": public_file}
        verify_only = run_cli(*get, env=server_env, timeout=60)
        assert verify_only.returncode == 2
        assert "set REMINDERS_CLIENT_TOKEN_FILE to a token from your issuer" in (verify_only.stderr)


def test_a_real_token_is_not_sent_in_plaintext_off_this_host(tmp_path: Path) -> None:
    """A token signed with a configured secret, or one from a token file, went to any
    --target in plaintext, readable on the network and valid for minutes. The development
    secret's tokens (which no server outside development accepts) still may."""
    off_host = "192.0.2.2:50051"  # TEST-NET-1: documentation only, never reached
    token_file = tmp_path / "token"
    token_file.write_text(jwt.encode({"sub": "alice"}, "k" * 40, algorithm="HS256"))
    call = ("get", "r1", "--user", "alice", "--target", off_host, "--timeout", "1")
    for real in (
        {"REMINDERS_JWT_SECRET": "s" * 40},
        {"REMINDERS_CLIENT_TOKEN_FILE": str(token_file)},
    ):
        refused = run_cli(*call, env=real, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert f"is plaintext to {off_host!r}" in refused.stderr
        # Said to be protected by a mesh: sent (and nothing answers there).
        in_mesh = run_cli(*call, env={**real, "REMINDERS_PLAINTEXT_IN_MESH": "true"}, timeout=60)
        assert in_mesh.returncode == 1, in_mesh.stderr
    development = run_cli(*call, env={"REMINDERS_ENV": "dev"}, timeout=60)
    assert development.returncode == 1, development.stderr
