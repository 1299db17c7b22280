"""`reminders preview` through its own register(), on a fresh parser."""

from __future__ import annotations

import argparse
import json
import subprocess

import pytest

from reminders_svc.schedule import preview_cli
from tests.platform.helpers import REMINDERS


def preview(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="reminders")
    preview_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["preview", *argv])
    code: int = args.handler(args)
    return code


def test_json_rings_at_or_after_from(capsys: pytest.CaptureFixture[str]) -> None:
    code = preview(
        "--repeat", "every Monday 09:00", "--zone", "America/New_York",
        "--from", "2026-10-20T00:00:00Z", "--count", "2", "--json",
    )  # fmt: skip
    assert code == 0
    assert json.loads(capsys.readouterr().out) == [
        {"utc": "2026-10-26T13:00:00Z", "local": "2026-10-26T09:00:00-04:00"},
        {"utc": "2026-11-02T14:00:00Z", "local": "2026-11-02T09:00:00-05:00"},
    ]


def test_one_off_in_the_gap(capsys: pytest.CaptureFixture[str]) -> None:
    code = preview(
        "--at", "2027-03-14T02:30:00", "--zone", "America/New_York",
        "--from", "2026-10-20T00:00:00Z",
    )  # fmt: skip
    assert code == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "2027-03-14T07:30:00Z  2027-03-14T03:30:00-04:00"
    )


def test_bad_input_exits_2_with_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert preview("--rrule", "FREQ=MINUTELY", "--zone", "UTC") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "reminders preview: rrule: FREQ=MINUTELY is too frequent (HOURLY at most)\n"
    )


@pytest.mark.parametrize("start", ["9999-12-31T23:00", "0001-01-01T00:00+05:00"])
def test_a_from_out_of_range_exits_2_not_a_traceback(
    start: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert preview("--repeat", "every day 09:00", "--zone", "UTC", "--from", start) == 2
    assert capsys.readouterr().err == "reminders preview: from: the year must be 1900 to 8999\n"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        # int() refused its 4,301st digit with a ValueError: a traceback.
        (
            ("--repeat", "every " + "9" * 5000 + " days 08:00", "--zone", "UTC"),
            "repeat: at character 7 ('999999999999999...'): expected a number of at most 9 digits",
        ),
        (
            ("--repeat", "every day 09:00", "--zone", "Factory"),
            "zone: 'Factory' is no place's time zone (want an IANA name)",
        ),
    ],
    ids=["a number of 5,000 digits", "the placeholder zone"],
)
def test_bad_input_exits_2_naming_it(
    argv: tuple[str, ...], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert preview(*argv, "--from", "2026-10-20T00:00:00Z") == 2
    assert capsys.readouterr().err == f"reminders preview: {error}\n"


def test_past_one_off_is_refused_against_from(capsys: pytest.CaptureFixture[str]) -> None:
    code = preview("--at", "2026-01-01T09:00:00", "--zone", "UTC", "--from", "2026-06-01T00:00")
    assert code == 2
    assert "at: 2026-01-01T09:00:00 in UTC (2026-01-01T09:00:00Z) is in the past" in (
        capsys.readouterr().err
    )


def test_version_names_the_pinned_database(capsys: pytest.CaptureFixture[str]) -> None:
    assert preview("--version") == 0
    assert capsys.readouterr().out == "tz database 2026f (tzdata 2026.6)\n"


def test_a_reader_that_stops_early_ends_the_listing_without_a_traceback() -> None:
    """`reminders preview ... | head -1`: the pipe closes under the writer."""
    writer = subprocess.Popen(
        [REMINDERS, "preview", "--repeat", "every hour", "--zone", "UTC", "--count", "1000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert writer.stdout is not None
    assert writer.stderr is not None
    writer.stdout.close()  # as `head -1` exits: ~50 KB of lines meet a closed pipe
    complaint = writer.stderr.read()
    assert writer.wait(timeout=60) == 141
    assert complaint == b""
