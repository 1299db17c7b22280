"""TLS and mutual TLS on the API port, with certificates made for the test."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from contextlib import AbstractContextManager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from reminders_svc.config import CassandraSettings
from reminders_svc.tls import API_PREFIX, ServerTls, add_port
from tests.api.serving import NOT_SERVING, SERVING, ServedApi, serve_api
from tests.pki import LOCALHOST, Authority, Pair, Pki, install, issue_pki
from tests.platform.helpers import free_port, run_cli


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return issue_pki(tmp_path_factory.mktemp("pki"))


def _mutual(pki: Pki) -> grpc.ChannelCredentials:
    """A client's credentials: it checks the server's certificate, and presents its own."""
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=pki.client.key.read_bytes(),
        certificate_chain=pki.client.cert.read_bytes(),
    )


def _serving_mutual_tls(
    pki: Pki, cassandra: CassandraSettings
) -> AbstractContextManager[ServedApi]:
    return serve_api(
        cassandra,
        REMINDERS_API_TLS_CERT_FILE=str(pki.server.cert),
        REMINDERS_API_TLS_KEY_FILE=str(pki.server.key),
        REMINDERS_API_TLS_CLIENT_CA_FILE=str(pki.ca),
    )


def test_mutual_tls(pki: Pki, migrated_settings: CassandraSettings) -> None:
    # No Cassandra needed: the health service answers NOT_SERVING over TLS all the same.
    unreachable = dataclasses.replace(migrated_settings, port=free_port())
    with _serving_mutual_tls(pki, unreachable) as api:
        ca = pki.ca.read_bytes()
        api.wait_for_health(NOT_SERVING, credentials=_mutual(pki))
        with pytest.raises(grpc.RpcError) as refused:
            api.health(credentials=grpc.ssl_channel_credentials(root_certificates=ca))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError), grpc.insecure_channel(api.target) as plaintext:
            health_pb2_grpc.HealthStub(plaintext).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert api.terminate() == 0


def test_the_client_command_speaks_mutual_tls_and_refuses_half_a_configuration(
    pki: Pki, migrated_settings: CassandraSettings
) -> None:
    client_tls = {
        "REMINDERS_ENV": "dev",
        "REMINDERS_CLIENT_TLS_CA_FILE": str(pki.ca),
        "REMINDERS_CLIENT_TLS_CERT_FILE": str(pki.client.cert),
        "REMINDERS_CLIENT_TLS_KEY_FILE": str(pki.client.key),
    }
    with _serving_mutual_tls(pki, migrated_settings) as api:
        api.wait_for_health(SERVING, credentials=_mutual(pki))
        listed = run_cli("list", "--user", "tls-user", "--target", api.target, env=client_tls)
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout)["reminders"] == []

        # A certificate without its key: refused, naming what is missing (gRPC's core
        # would abort the process on it).
        half = {**client_tls, "REMINDERS_CLIENT_TLS_KEY_FILE": ""}
        refused = run_cli("list", "--user", "tls-user", "--target", api.target, env=half)
        assert refused.returncode == 2
        assert "set both REMINDERS_CLIENT_TLS_CERT_FILE and" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert api.terminate() == 0


def _serves_to(target: str, ca: Path) -> bool:
    """Whether a new connection trusting only `ca` completes its handshake with the server."""
    options = [("grpc.use_local_subchannel_pool", 1)]  # a new connection, not a pooled one
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    with grpc.secure_channel(target, credentials, options=options) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as error:
            refused = error
        else:
            return True
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused  # the handshake, not a call
    return False


def test_a_renewed_certificate_is_served_to_new_connections_without_a_restart(
    tmp_path: Path, migrated_settings: CassandraSettings
) -> None:
    """cert-manager renews the Secret in place: the API serves the new certificate from the
    next connection on. Files that changed but do not match (a key not the certificate's)
    leave the previous certificate in use."""
    old, new = Authority(tmp_path, "old-ca"), Authority(tmp_path, "new-ca")
    old_pair = old.issue("old-server", ips=(LOCALHOST,))
    new_pair = new.issue("new-server", ips=(LOCALHOST,))
    mounted = Pair(tmp_path / "tls.crt", tmp_path / "tls.key")
    install(old_pair, mounted)
    unreachable = dataclasses.replace(migrated_settings, port=free_port())
    with serve_api(
        unreachable,
        REMINDERS_API_TLS_CERT_FILE=str(mounted.cert),
        REMINDERS_API_TLS_KEY_FILE=str(mounted.key),
    ) as api:
        ca_bytes = old.cert.read_bytes()
        credentials = grpc.ssl_channel_credentials(root_certificates=ca_bytes)
        api.wait_for_health(NOT_SERVING, credentials=credentials)
        assert _serves_to(api.target, old.cert)
        assert not _serves_to(api.target, new.cert)

        # The new certificate beside the old key: unusable, the old one stays in use.
        install(Pair(new_pair.cert, old_pair.key), mounted)
        assert _serves_to(api.target, old.cert)

        install(new_pair, mounted)
        assert _serves_to(api.target, new.cert)
        assert not _serves_to(api.target, old.cert)
        assert api.terminate() == 0
        output = api.output()

    assert "TLS files changed but cannot be used" in output
    assert f"is not the key of REMINDERS_API_TLS_CERT_FILE={str(mounted.cert)!r}" in output
    assert f"TLS files renewed: {mounted.cert}, {mounted.key}" in output
    assert "BEGIN" not in output  # never a file's contents


def test_a_certificate_renewed_before_the_port_opens_is_the_one_served(tmp_path: Path) -> None:
    """The files are read with the settings; the port opens later (the notifier waits for
    its database first, minutes in an outage). A renewal in between is served from the
    first connection, not missed until the next renewal."""
    old, new = Authority(tmp_path, "old-ca"), Authority(tmp_path, "new-ca")
    mounted = Pair(tmp_path / "tls.crt", tmp_path / "tls.key")
    install(old.issue("old-server", ips=(LOCALHOST,)), mounted)
    files = {f"{API_PREFIX}CERT_FILE": str(mounted.cert), f"{API_PREFIX}KEY_FILE": str(mounted.key)}
    tls = ServerTls.from_env(files, API_PREFIX)
    assert tls is not None
    install(new.issue("new-server", ips=(LOCALHOST,)), mounted)  # renewed while it waited

    async def served() -> tuple[bool, bool]:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        target = f"{LOCALHOST}:{add_port(server, LOCALHOST, 0, tls)}"
        await server.start()
        try:
            return (
                await asyncio.to_thread(_serves_to, target, new.cert),
                await asyncio.to_thread(_serves_to, target, old.cert),
            )
        finally:
            await server.stop(0)

    assert asyncio.run(served()) == (True, False)
