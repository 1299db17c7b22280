"""TLS and mutual TLS on the API port, with certificates made for the test."""

from __future__ import annotations

import dataclasses
import json
from contextlib import AbstractContextManager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from reminders_svc.config import CassandraSettings
from tests.api.serving import NOT_SERVING, SERVING, ServedApi, serve_api
from tests.pki import Pki, issue_pki
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
