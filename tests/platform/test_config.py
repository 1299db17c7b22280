"""Connection settings come from the environment, typed, with secrets kept out of reprs."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest

from reminders_svc.api.auth import AuthSettings
from reminders_svc.config import CassandraSettings, ConfigError, Replication
from tests.pki import LOCALHOST, Pki, issue_pki


def test_defaults_suit_the_local_node() -> None:
    settings = CassandraSettings.from_env({})
    assert settings.contact_points == ("127.0.0.1",)
    assert settings.port == 9042
    assert settings.keyspace == "reminders"
    assert (settings.consistency, settings.serial_consistency) == ("LOCAL_QUORUM", "SERIAL")
    assert settings.replication.cql() == "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    assert settings.tls is None


def test_a_production_cluster_is_described_by_the_environment(tmp_path: Path) -> None:
    pki = issue_pki(tmp_path)
    settings = CassandraSettings.from_env(
        {
            "REMINDERS_CASSANDRA_CONTACT_POINTS": "cass-0.cass, cass-1.cass",
            "REMINDERS_CASSANDRA_PORT": "9142",
            "REMINDERS_CASSANDRA_LOCAL_DC": "dc1",
            "REMINDERS_CASSANDRA_SERIAL_CONSISTENCY": "LOCAL_SERIAL",
            "REMINDERS_CASSANDRA_USERNAME": "reminders",
            "REMINDERS_CASSANDRA_PASSWORD": "hunter2",
            "REMINDERS_CASSANDRA_TLS": "true",
            "REMINDERS_CASSANDRA_TLS_CA_FILE": str(pki.ca),
            "REMINDERS_CASSANDRA_TLS_CERT_FILE": str(pki.client.cert),
            "REMINDERS_CASSANDRA_TLS_KEY_FILE": str(pki.client.key),
            "REMINDERS_CASSANDRA_REPLICATION": "NetworkTopologyStrategy:dc1=3,dc2=3",
        }
    )
    assert settings.contact_points == ("cass-0.cass", "cass-1.cass")
    assert settings.port == 9142
    assert settings.local_dc == "dc1"
    assert settings.serial_consistency == "LOCAL_SERIAL"
    assert settings.tls is not None
    assert "('commonName', 'client')" in _handshake(settings.tls.ssl_context(), pki)
    assert "PRIVATE KEY" not in repr(settings)
    assert settings.replication == Replication("NetworkTopologyStrategy", (("dc1", 3), ("dc2", 3)))
    assert settings.password is not None
    assert settings.password.value == "hunter2"
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in str(settings.password)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PORT", "nine", "REMINDERS_CASSANDRA_PORT='nine': expected an integer"),
        ("KEYSPACE", "drop table;", "expected a CQL identifier"),
        # CQL would create "reminders", and the driver then look for "Reminders".
        ("KEYSPACE", "Reminders", "expected a CQL identifier"),
        ("KEYSPACE", "erinnerungen_ü", "expected a CQL identifier"),
        ("KEYSPACE", "k" * 49, "at most 48"),
        ("CONSISTENCY", "MOSTLY", "expected one of ONE, LOCAL_ONE"),
        ("SERIAL_CONSISTENCY", "QUORUM", "expected one of SERIAL, LOCAL_SERIAL"),
        ("TLS", "maybe", "REMINDERS_CASSANDRA_TLS='maybe': expected true or false"),
        ("REPLICATION", "EverywhereStrategy", "expected 'SimpleStrategy:<rf>'"),
        ("REPLICATION", "NetworkTopologyStrategy:dc1=three", "REMINDERS_CASSANDRA_REPLICATION"),
    ],
)
def test_malformed_settings_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        CassandraSettings.from_env({f"REMINDERS_CASSANDRA_{name}": value})


def _tls_env(**files: Path | str) -> dict[str, str]:
    return {f"REMINDERS_CASSANDRA_TLS_{name}": str(path) for name, path in files.items()}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"CONSISTENCY": "ONE", "REPLICATION": "NetworkTopologyStrategy:dc1=3"}, "may miss"),
        ({"CONSISTENCY": "LOCAL_ONE", "REPLICATION": "SimpleStrategy:3"}, "may miss"),
        # One replica in each of two DCs: a write at ONE in one, a read at ONE in the other.
        (
            {
                "CONSISTENCY": "ONE",
                "REPLICATION": "NetworkTopologyStrategy:dc1=1,dc2=1",
                "SERIAL_CONSISTENCY": "LOCAL_SERIAL",
            },
            "may miss",
        ),
        (
            {"REPLICATION": "NetworkTopologyStrategy:dc1=3,dc2=3", "SERIAL_CONSISTENCY": "SERIAL"},
            "use QUORUM",
        ),
    ],
)
def test_levels_at_which_a_read_may_miss_an_earlier_write_are_refused(
    settings: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        CassandraSettings.from_env({f"REMINDERS_CASSANDRA_{k}": v for k, v in settings.items()})


@pytest.mark.parametrize(
    "settings",
    [
        {"CONSISTENCY": "ONE"},  # one local node: every read sees every write
        {"REPLICATION": "NetworkTopologyStrategy:dc1=3"},  # SERIAL in one DC is LOCAL_SERIAL
        {"REPLICATION": "NetworkTopologyStrategy:dc1=3,dc2=3", "CONSISTENCY": "QUORUM"},
        {
            "REPLICATION": "NetworkTopologyStrategy:dc1=3,dc2=3",
            "SERIAL_CONSISTENCY": "LOCAL_SERIAL",
        },
    ],
)
def test_levels_that_see_every_earlier_write_are_accepted(settings: dict[str, str]) -> None:
    CassandraSettings.from_env({f"REMINDERS_CASSANDRA_{k}": v for k, v in settings.items()})


def test_cassandra_tls_files_without_tls_on_are_refused(tmp_path: Path) -> None:
    """Else the process would connect in plaintext, its credentials with it."""
    pki = issue_pki(tmp_path)
    with pytest.raises(ConfigError) as refused:
        CassandraSettings.from_env(_tls_env(CA_FILE=pki.ca))
    assert str(refused.value) == (
        "REMINDERS_CASSANDRA_TLS_CA_FILE needs REMINDERS_CASSANDRA_TLS=true (plaintext otherwise)"
    )


_NO_TLS_CLIENT = "REMINDERS_CASSANDRA_TLS_\\*_FILE: the files make no TLS client"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"CA_FILE": "/nonexistent/ca.crt"}, "TLS_CA_FILE='/nonexistent/ca.crt': cannot read it"),
        ({"KEY_FILE": "client.key"}, "TLS_KEY_FILE needs REMINDERS_CASSANDRA_TLS_CERT_FILE"),
        ({"CERT_FILE": "client.pem"}, _NO_TLS_CLIENT),
        ({"CA_FILE": "client.key"}, _NO_TLS_CLIENT),
        ({"CERT_FILE": "client.pem", "KEY_FILE": "server.key"}, _NO_TLS_CLIENT),
    ],
    ids=[
        "unreadable",
        "key-without-certificate",
        "certificate-without-its-key",
        "ca-not-a-certificate",
        "key-not-the-certificate-s",
    ],
)
def test_bad_cassandra_tls_files_stop_the_process_naming_the_variable(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    issue_pki(tmp_path)
    env = {"REMINDERS_CASSANDRA_TLS": "true"}
    env |= _tls_env(**{name: tmp_path / path for name, path in files.items()})
    with pytest.raises(ConfigError, match=message) as refused:
        CassandraSettings.from_env(env)
    assert "PRIVATE KEY" not in str(refused.value)


def _handshake(client: ssl.SSLContext, pki: Pki) -> str:
    """A TLS handshake of `client` with a server that requires a client certificate from
    the test CA; the subject of the certificate the client presented."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.server.cert, pki.server.key)
    server.load_verify_locations(pki.ca)
    server.verify_mode = ssl.CERT_REQUIRED
    presented: list[str] = []
    with socket.create_server((LOCALHOST, 0)) as listener:

        def accept() -> None:
            connection, _ = listener.accept()
            with server.wrap_socket(connection, server_side=True) as tls:
                peer = tls.getpeercert()
                assert peer is not None
                presented.append(str(peer["subject"]))

        accepting = threading.Thread(target=accept)
        accepting.start()
        with (
            socket.create_connection(listener.getsockname()) as raw,
            client.wrap_socket(raw, server_hostname=LOCALHOST) as tls,
        ):
            tls.do_handshake()
        accepting.join(timeout=10)
    return presented[0]


def test_cassandra_mutual_tls_from_a_bundle_and_a_combined_certificate_and_key(
    tmp_path: Path,
) -> None:
    """A CA bundle with non-ASCII comments (certifi's has them), and the client's
    certificate and key in one file: both as Cassandra's TLS files; the handshake checks
    the server and presents the client's certificate."""
    pki = issue_pki(tmp_path)
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes("# Issuer: Főtanúsítvány\n".encode() + pki.ca.read_bytes())
    combined = tmp_path / "client-and-key.pem"
    combined.write_bytes(pki.client.cert.read_bytes() + pki.client.key.read_bytes())
    settings = CassandraSettings.from_env(
        {"REMINDERS_CASSANDRA_TLS": "true"} | _tls_env(CA_FILE=bundle, CERT_FILE=combined)
    )
    assert settings.tls is not None
    assert "('commonName', 'client')" in _handshake(settings.tls.ssl_context(), pki)


SECRET_VALUE = "s3cret-of-the-operator-0123456789-abcdef"


@pytest.mark.parametrize(
    ("variable", "read"),
    [
        (
            "REMINDERS_CASSANDRA_PASSWORD",
            lambda env: CassandraSettings.from_env(env).password,
        ),
        ("REMINDERS_JWT_SECRET", lambda env: AuthSettings.from_env(env).user.key),
        ("REMINDERS_ADMIN_JWT_SECRET", lambda env: AuthSettings.from_env(env).admin.key),
    ],
)
def test_a_secret_may_come_from_a_mounted_file_and_is_never_echoed(
    tmp_path: Path, variable: str, read: Any
) -> None:
    """As a file (a mounted Secret) the value stays out of the environment that `env` in
    a `kubectl exec` and /proc show; read, it is the same as set inline."""
    # The other token key, so the settings are complete either way.
    base = {
        "REMINDERS_JWT_SECRET": "u" * 40,
        "REMINDERS_ADMIN_JWT_SECRET": "a" * 40,
    }
    base.pop(variable, None)
    stored = tmp_path / "secret"
    stored.write_text(SECRET_VALUE)
    inline = read({**base, variable: SECRET_VALUE})
    from_file = read({**base, f"{variable}_FILE": str(stored)})
    assert from_file.value == inline.value == SECRET_VALUE

    stored.write_text(SECRET_VALUE + "\n")  # echo > file
    missing = tmp_path / "absent"
    for env, problem in (
        ({variable: SECRET_VALUE, f"{variable}_FILE": str(stored)}, "not both"),
        ({f"{variable}_FILE": str(stored)}, "newline"),
        ({f"{variable}_FILE": str(missing)}, "cannot be read"),
    ):
        with pytest.raises(ConfigError) as refused:
            read({**base, **env})
        assert problem in str(refused.value)
        assert SECRET_VALUE not in str(refused.value)
