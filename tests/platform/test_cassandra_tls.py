"""TLS to Cassandra on the wire: the local node (plaintext) behind a TLS front that
demands a client certificate, reached with the settings `REMINDERS_CASSANDRA_TLS_*` make."""

from __future__ import annotations

import logging
import ssl
import time
from pathlib import Path

import pytest
from cassandra.cluster import NoHostAvailable, Session

from reminders_svc.config import CassandraSettings
from reminders_svc.storage.session import connect
from tests.pki import LOCALHOST, Authority, MountedClientFiles
from tests.tcp_proxy import TcpProxy

QUERY = "SELECT release_version FROM system.local"


def node_side(authority: Authority) -> ssl.SSLContext:
    """The nodes' TLS: a certificate `authority` signed, and clients must present one too."""
    served = authority.issue(f"node-of-{authority.cert.stem}", ips=(LOCALHOST,))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(served.cert, served.key)
    context.load_verify_locations(authority.cert)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def answers_again(session: Session, timeout_s: float = 60) -> bool:
    """Whether a query succeeds before `timeout_s`, as the driver reconnects."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            session.execute(QUERY)
        except NoHostAvailable:
            time.sleep(0.2)
            continue
        return True
    return False


def test_renewed_cassandra_tls_files_are_used_by_the_next_connections(
    cassandra_settings: CassandraSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """cert-manager moves the nodes and the clients to a new CA: once the nodes restart
    on it (here: the TLS front swaps its context and drops every connection), a running
    process reconnects with its renewed files, trusting the new CA and presenting its new
    certificate, with no restart. Files that changed but cannot be used (a key not the
    certificate's) keep the previous ones in use, and the log says so."""
    caplog.set_level(logging.INFO, logger="reminders_svc.tls")
    files = MountedClientFiles(tmp_path)
    front = TcpProxy(cassandra_settings.contact_points[0], cassandra_settings.port)
    front.terminate_tls(node_side(files.old))
    settings = CassandraSettings.from_env(
        {
            "REMINDERS_CASSANDRA_CONTACT_POINTS": LOCALHOST,
            "REMINDERS_CASSANDRA_PORT": str(front.port),
            "REMINDERS_CASSANDRA_TLS": "true",
            "REMINDERS_CASSANDRA_TLS_CA_FILE": str(files.ca),
            "REMINDERS_CASSANDRA_TLS_CERT_FILE": str(files.mounted.cert),
            "REMINDERS_CASSANDRA_TLS_KEY_FILE": str(files.mounted.key),
        }
    )
    try:
        with connect(settings, keyspace="") as connection:
            session = connection.session
            assert session.execute(QUERY).one() is not None

            files.break_pair()
            front.cut()
            front.restore()
            assert answers_again(session), "the previous files were not kept in use"
            assert "TLS_*_FILE: the files make no TLS client" in caplog.text

            files.renew()
            front.terminate_tls(node_side(files.new))
            front.cut()
            front.restore()
            assert answers_again(session), "the renewed files were not used"
    finally:
        front.close()
    assert files.renewed_log_line() in caplog.text
    assert "BEGIN" not in caplog.text  # never a file's contents
