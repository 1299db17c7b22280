"""Connection settings come from the environment, typed, with secrets kept out of reprs."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from reminders_svc.config import CassandraSettings, ConfigError, Replication
from tests.pki import issue_pki


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
    assert settings.tls.ca is not None
    assert settings.tls.ca.path == str(pki.ca)
    assert settings.tls.ssl_context().verify_mode == ssl.CERT_REQUIRED
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


def test_cassandra_tls_files_without_tls_on_are_refused(tmp_path: Path) -> None:
    """Else the process would connect in plaintext, its credentials with it."""
    pki = issue_pki(tmp_path)
    with pytest.raises(ConfigError, match="REMINDERS_CASSANDRA_TLS_CA_FILE needs REMINDERS_CASS"):
        CassandraSettings.from_env(_tls_env(CA_FILE=pki.ca))


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"CA_FILE": "/nonexistent/ca.crt"}, "TLS_CA_FILE='/nonexistent/ca.crt': cannot read it"),
        ({"CERT_FILE": "client.pem"}, "set both REMINDERS_CASSANDRA_TLS_CERT_FILE and"),
        ({"CA_FILE": "client.key"}, "REMINDERS_CASSANDRA_TLS_\\*: the files make no TLS client"),
        (
            {"CERT_FILE": "client.pem", "KEY_FILE": "server.key"},
            "REMINDERS_CASSANDRA_TLS_\\*: the files make no TLS client",
        ),
    ],
    ids=["unreadable", "half-pair", "ca-not-a-certificate", "key-not-the-certificate-s"],
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
