"""Every process reads its environment the same way: a malformed or out-of-range number
stops it at startup, naming the variable; what two processes share they read alike."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path

import pytest
from cassandra.connection import DefaultEndPoint
from cassandra.policies import HostDistance, HostFilterPolicy, SimpleConvictionPolicy
from cassandra.pool import Host

from dispatcher.settings import DispatcherSettings
from notifier.settings import NotifierSettings
from reminders_svc.api.settings import ApiSettings
from reminders_svc.config import (
    CassandraSettings,
    ConfigError,
    Retention,
    is_local,
    target_problem,
)
from reminders_svc.storage.session import execution_profile
from tests.platform.helpers import run_cli

Reader = Callable[[Mapping[str, str]], object]

READERS: dict[str, Reader] = {
    "api": ApiSettings.from_env,
    "dispatcher": DispatcherSettings.from_env,
    "notifier": NotifierSettings.from_env,
    "cassandra": CassandraSettings.from_env,
}


@pytest.mark.parametrize(
    ("process", "name", "value", "message"),
    [
        ("dispatcher", "REMINDERS_DISPATCH_LEASE_S", "inf", "expected a number"),
        ("dispatcher", "REMINDERS_DISPATCH_LEASE_S", "-5", "expected 1 to 3600 s"),
        ("dispatcher", "REMINDERS_DISPATCH_CLAIM_LEASE_S", "nan", "expected a number"),
        ("dispatcher", "REMINDERS_DISPATCH_POLL_S", "0", "expected 0.05 to 60 s"),
        ("dispatcher", "REMINDERS_DISPATCH_MAX_IN_FLIGHT", "0", "expected 1 to 100000"),
        ("dispatcher", "REMINDERS_DISPATCH_BATCH_SIZE", "ten", "expected an integer"),
        # The notifier refuses a SendBatch of more than 500 items.
        ("dispatcher", "REMINDERS_DISPATCH_BATCH_SIZE", "501", "expected 1 to 500"),
        ("dispatcher", "REMINDERS_DISPATCH_CATCH_UP_RINGS_PER_S", "0", "expected 0.01 to"),
        ("dispatcher", "REMINDERS_DISPATCH_CATCH_UP_MINUTES_PER_S", "-1", "expected 0.01 to"),
        ("dispatcher", "REMINDERS_DISPATCH_RING_EXPIRY_S", "0.5", "expected 1 to"),
        ("dispatcher", "REMINDERS_DISPATCH_PORT", "70000", "expected 0 to 65535"),
        ("dispatcher", "REMINDERS_DISPATCH_MISFIRE_POLICY", "later", "ring_late, skip_missed"),
        ("dispatcher", "REMINDERS_DISPATCH_GRACE_S", "0", "expected 1 to 3600 s"),
        (
            "dispatcher",
            "REMINDERS_DISPATCH_SKEW_S",
            "25",
            "shorter than REMINDERS_DISPATCH_GRACE_S",
        ),
        # A misspelt test hook would quietly test nothing.
        ("dispatcher", "REMINDERS_DISPATCH_FAULTS", "crash_after_clam", "unknown fault"),
        # A lease's owner and a heartbeat row's key: Cassandra refuses keys over 64 KiB.
        ("dispatcher", "REMINDERS_DISPATCH_ID", "d" * 70_000, "1 to 200 printable"),
        ("dispatcher", "REMINDERS_DISPATCH_ID", "d-1\nforged", "1 to 200 printable"),
        ("notifier", "REMINDERS_NOTIFIER_PUSH_WORKERS", "0", "expected 1 to 100000"),
        ("notifier", "REMINDERS_NOTIFIER_MAX_PENDING", "0", "expected 1 to 100000"),
        ("notifier", "REMINDERS_NOTIFIER_KEY_TTL_DAYS", "0", "expected 1 to 365 days"),
        ("notifier", "REMINDERS_NOTIFIER_KEY_TAKEOVER_AFTER_S", "inf", "expected a number"),
        ("notifier", "REMINDERS_NOTIFIER_ADAPTER", "apns", "expected one of recording, logging"),
        ("notifier", "REMINDERS_NOTIFIER_AUTO_DEVICE", "maybe", "expected true or false"),
        ("api", "REMINDERS_API_PORT", "-1", "expected 0 to 65535"),
        ("api", "REMINDERS_API_REFLECTION", "sometimes", "expected true or false"),
        ("api", "REMINDERS_MAX_ACTIVE_PER_USER", "0", "expected 1 to"),
        ("api", "REMINDERS_HISTORY_RETENTION_DAYS", "0", "expected 1 to 3650 days"),
        ("api", "REMINDERS_BUCKET_RETENTION_DAYS", "inf", "expected a number"),
        ("api", "REMINDERS_API_HEALTH_PROBE_INTERVAL_S", "0", "expected 0.1 to 600 s"),
        ("api", "REMINDERS_API_FAULTS", "wall_clock_behind", "unknown fault"),
        ("cassandra", "REMINDERS_CASSANDRA_REQUEST_TIMEOUT", "nan", "expected a number"),
        ("cassandra", "REMINDERS_CASSANDRA_PORT", "0", "expected 1 to 65535"),
    ],
)
def test_a_malformed_or_out_of_range_setting_is_refused_naming_its_variable(
    process: str, name: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{name}.*{message}"):
        READERS[process]({name: value})


def test_the_defaults_of_every_process_are_accepted() -> None:
    for read in READERS.values():
        read({"REMINDERS_NOTIFIER_ADAPTER": "logging"})  # the one setting with no default
        read({"REMINDERS_ENV": "dev"})


def test_a_notifier_whose_push_could_outlast_its_refreshed_hold_is_refused() -> None:
    """A hold is refreshed before a push once half the takeover bound has passed: a push
    allowed longer than the other half could be taken over by another replica midway and
    pushed twice."""
    short = {"REMINDERS_ENV": "dev", "REMINDERS_NOTIFIER_KEY_TAKEOVER_AFTER_S": "20"}
    with pytest.raises(ConfigError, match=r"^REMINDERS_NOTIFIER_KEY_TAKEOVER_AFTER_S \(20\)"):
        NotifierSettings.from_env(short)
    NotifierSettings.from_env({**short, "REMINDERS_NOTIFIER_PUSH_TIMEOUT_S": "9"})


def test_the_reference_notifier_outside_dev_needs_its_adapter_named() -> None:
    """Neither adapter reaches a device, yet rings handed to it are finalized as rung: a
    deployment must say so, not fall into a default that pushes nowhere unnoticed."""
    with pytest.raises(ConfigError, match=r"^REMINDERS_NOTIFIER_ADAPTER is not set: "):
        NotifierSettings.from_env({})
    assert NotifierSettings.from_env({"REMINDERS_ENV": "dev"}).adapter == "recording"
    named = {"REMINDERS_NOTIFIER_ADAPTER": "logging"}
    assert NotifierSettings.from_env(named).adapter == "logging"


def test_the_api_and_the_dispatcher_keep_bucket_entries_and_history_alike() -> None:
    """Both write bucket entries (creates and edits; a repeat's next ring) and the
    dispatcher writes the history the API lists: one setting must reach both."""
    env = {"REMINDERS_BUCKET_RETENTION_DAYS": "3", "REMINDERS_HISTORY_RETENTION_DAYS": "30"}
    api, dispatcher = ApiSettings.from_env(env), DispatcherSettings.from_env(env)
    assert api.retention == dispatcher.retention == Retention.from_env(env)
    assert dispatcher.retention.bucket == timedelta(days=3)
    assert dispatcher.retention.history == timedelta(days=30)


@pytest.mark.parametrize("command", ["serve-api", "dispatch", "notifier"])
def test_an_unknown_log_level_is_a_usage_error_of_every_service_command(command: str) -> None:
    done = run_cli(command, "--log-level", "LOUD", timeout=60)
    assert done.returncode == 2
    assert "invalid choice: 'LOUD'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "argv",
    [("serve-api",), ("dispatch",), ("notifier",), ("migrate",), ("admin", "parts")],
)
def test_a_malformed_setting_stops_every_command_with_exit_2_naming_it(
    argv: tuple[str, ...],
) -> None:
    """Exit 2 is bad configuration for every command; migrate and admin said 1, as for a
    database that did not answer, which sends an operator to the cluster for a typo."""
    env = {"REMINDERS_ENV": "dev", "REMINDERS_CASSANDRA_PORT": "nine"}
    done = run_cli(*argv, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "REMINDERS_CASSANDRA_PORT='nine': expected an integer" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_migrate_from_a_directory_without_schema_files_is_bad_configuration(
    tmp_path: Path, where: str
) -> None:
    """Exit 2, which fails the migrate Job at once (its podFailurePolicy): a wrong
    REMINDERS_CQL_DIR said 1 and was retried for an hour."""
    directory = tmp_path / "cql"
    if where == "empty":
        directory.mkdir()
    done = run_cli("migrate", env={"REMINDERS_CQL_DIR": str(directory)}, timeout=60)
    assert done.returncode == 2, done.stderr
    assert str(directory) in done.stderr
    assert "Traceback" not in done.stderr


ALL_INTERFACES = "0.0.0.0"  # noqa: S104 (what a pod binds: the case under test)
PLAINTEXT_OFF_HOST = {
    "cassandra": {"REMINDERS_CASSANDRA_CONTACT_POINTS": "127.0.0.1,cassandra.example.internal"},
    "api": {"REMINDERS_API_HOST": ALL_INTERFACES},
    "dispatcher": {"REMINDERS_NOTIFIER_TARGET": "notification.example.internal:443"},
    "notifier": {
        "REMINDERS_NOTIFIER_ADAPTER": "logging",
        "REMINDERS_NOTIFIER_HOST": ALL_INTERFACES,
    },
}
PLAINTEXT_ON_LOOPBACK = {
    "cassandra": {"REMINDERS_CASSANDRA_CONTACT_POINTS": "localhost,::1"},
    "api": {"REMINDERS_API_HOST": "127.0.0.1"},
    "dispatcher": {"REMINDERS_NOTIFIER_TARGET": "localhost:50061"},
    "notifier": {"REMINDERS_NOTIFIER_ADAPTER": "logging", "REMINDERS_NOTIFIER_HOST": "::1"},
}


@pytest.mark.parametrize(
    ("process", "variable"),
    [
        ("cassandra", "REMINDERS_CASSANDRA_CONTACT_POINTS"),
        ("api", "REMINDERS_API_HOST"),
        ("dispatcher", "REMINDERS_NOTIFIER_TARGET"),
        ("notifier", "REMINDERS_NOTIFIER_HOST"),
    ],
)
def test_plaintext_off_the_host_needs_development_or_a_mesh(
    process: str, variable: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Texts and tokens in plaintext across the network: refused outside development unless
    a mesh protects the link (said in the log at every start, in case the mesh is not
    there); on the loopback interface, as `make run` serves, accepted."""
    exposed = PLAINTEXT_OFF_HOST[process]
    with pytest.raises(ConfigError, match=f"^{variable} .* is plaintext to"):
        READERS[process](exposed)
    with caplog.at_level(logging.WARNING, logger="reminders_svc.config"):
        READERS[process]({**exposed, "REMINDERS_PLAINTEXT_IN_MESH": "true"})
    assert any(
        r.getMessage().startswith(f"{variable} is plaintext to")
        and "service mesh" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    READERS[process]({**exposed, "REMINDERS_ENV": "dev"})
    READERS[process](PLAINTEXT_ON_LOOPBACK[process])


@pytest.mark.parametrize(
    ("address", "local"),
    [
        ("127.0.0.1:50061", True),
        ("localhost:50061", True),
        ("LOCALHOST", True),
        ("dns:///localhost:50061", True),
        ("ipv4:127.0.0.1:50061", True),
        ("ipv6:[::1]:50061", True),
        ("[::1]:50061", True),
        ("[0:0:0:0:0:0:0:1]:50061", True),
        ("::1", True),
        ("unix:/run/notifier.sock", True),
        ("notification.example.internal:443", False),
        ("dns:///notification.example.internal:443", False),
        ("10.0.0.7:50061", False),
        ("[2001:db8::1]:443", False),
        ("0.0.0.0", False),  # noqa: S104 (every interface: off the host)
        ("localhost.example.com:50061", False),
        # gRPC falls through to every address of a list: each must be this host.
        ("ipv4:127.0.0.1:50061,127.0.0.2:50061", True),
        ("ipv4:127.0.0.1:50061,192.0.2.2:50061", False),
        ("ipv6:[::1]:50061,[2001:db8::1]:50061", False),
        ("xds:///notifier", False),
    ],
)
def test_what_counts_as_this_host(address: str, local: bool) -> None:
    assert is_local(address) is local


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("localhost:50051", None),
        ("[::1]:50051", None),
        ("localhost", "no port: expected host:port"),
        ("10.0.0.7", "no port: expected host:port"),
        ("localhost:0", "port 0 is not 1 to 65535"),
        (":50051", "no host: expected host:port"),
        ("dns:///api.example:99999", "port 99999 is not 1 to 65535"),
        ("ipv4:10.0.0.1:50051,10.0.0.2:70000", "port 70000 is not 1 to 65535"),
        # A scheme written out: gRPC's own default port (443), asked for knowingly.
        ("dns:///api.example", None),
        ("ipv4:10.0.0.1,10.0.0.2:50051", None),
        ("ipv6:[::1]", None),
        # Resolved by a control plane, or not TCP at all.
        ("xds:///reminders-api", None),
        ("unix:///run/reminders.sock", None),
        ("vsock:3:50051", None),
    ],
)
def test_a_target_is_refused_for_a_port_no_connection_can_have_or_a_forgotten_part(
    target: str, problem: str | None
) -> None:
    assert target_problem(target) == problem


def test_the_api_reads_how_long_a_handed_off_ring_may_still_go_out_as_the_dispatcher_sets_it() -> (
    None
):
    """A delete's "may be in flight" lasts the dispatchers' ring expiry (plus the skew
    allowance) past a cleared claim: one setting must reach both."""
    env = {"REMINDERS_DISPATCH_RING_EXPIRY_S": "600", "REMINDERS_DISPATCH_SKEW_S": "2"}
    api, dispatcher = ApiSettings.from_env(env), DispatcherSettings.from_env(env)
    assert dispatcher.ring_expiry == timedelta(minutes=10)
    assert api.still_pushed_for == timedelta(minutes=10, seconds=2)


def test_a_notifier_target_listing_an_address_off_the_host_is_plaintext_off_the_host() -> None:
    """Only the list's first address was checked: gRPC fell through to the second, and
    reminder texts went to it in plaintext."""
    listed = {"REMINDERS_NOTIFIER_TARGET": "ipv4:127.0.0.1:50061,192.0.2.2:50061"}
    with pytest.raises(ConfigError, match=r"REMINDERS_NOTIFIER_TARGET .* is plaintext to"):
        READERS["dispatcher"](listed)


def test_without_tls_the_driver_reaches_no_node_off_this_host_that_it_discovers() -> None:
    """The contact points are checked (above); the peers the driver finds through them were
    not: a loopback contact point of a larger cluster let texts and the role's password
    reach the others in plaintext. Outside development and a mesh, those are ignored."""
    local = Host(DefaultEndPoint("127.0.0.1"), SimpleConvictionPolicy)
    peer = Host(DefaultEndPoint("10.0.0.5"), SimpleConvictionPolicy)
    plaintext = {"REMINDERS_CASSANDRA_CONTACT_POINTS": "127.0.0.1"}

    policy = execution_profile(CassandraSettings.from_env(plaintext)).load_balancing_policy
    assert policy.distance(peer) == HostDistance.IGNORED
    assert policy.predicate(local)

    for allowed in ({"REMINDERS_ENV": "dev"}, {"REMINDERS_PLAINTEXT_IN_MESH": "true"}):
        settings = CassandraSettings.from_env({**plaintext, **allowed})
        assert not isinstance(execution_profile(settings).load_balancing_policy, HostFilterPolicy)


def test_notifier_keys_must_outlive_the_bucket_entries_whose_rings_they_dedupe() -> None:
    """A ring can be re-sent as long as its bucket entry lives: a key kept for less would
    let a catch-up push it twice."""
    dev = {"REMINDERS_ENV": "dev"}
    with pytest.raises(ConfigError, match="KEY_TTL_DAYS \\(7\\) must be longer than"):
        READERS["notifier"]({**dev, "REMINDERS_NOTIFIER_KEY_TTL_DAYS": "7"})
    with pytest.raises(ConfigError, match="REMINDERS_BUCKET_RETENTION_DAYS \\(30\\)"):
        READERS["notifier"]({**dev, "REMINDERS_BUCKET_RETENTION_DAYS": "30"})
    READERS["notifier"]({**dev, "REMINDERS_NOTIFIER_KEY_TTL_DAYS": "8"})
