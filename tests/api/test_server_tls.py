"""TLS and mutual TLS on the API port, with certificates made for the test."""

from __future__ import annotations

import dataclasses
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from reminders_svc.config import CassandraSettings
from tests.api.serving import NOT_SERVING, serve_api
from tests.pki import Pki, issue_pki
from tests.platform.helpers import free_port


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return issue_pki(tmp_path_factory.mktemp("pki"))


def _health(target: str, credentials: grpc.ChannelCredentials) -> int:
    with grpc.secure_channel(target, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        status: int = stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status
        return status


def test_mutual_tls(pki: Pki, migrated_settings: CassandraSettings) -> None:
    # No Cassandra needed: the health service answers NOT_SERVING over TLS all the same.
    unreachable = dataclasses.replace(migrated_settings, port=free_port())
    with serve_api(
        unreachable,
        REMINDERS_API_TLS_CERT_FILE=str(pki.server.cert),
        REMINDERS_API_TLS_KEY_FILE=str(pki.server.key),
        REMINDERS_API_TLS_CLIENT_CA_FILE=str(pki.ca),
    ) as api:
        ca = pki.ca.read_bytes()
        with_client_cert = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=pki.client.key.read_bytes(),
            certificate_chain=pki.client.cert.read_bytes(),
        )
        last_error: grpc.RpcError | None = None
        for _ in range(150):  # until the process listens
            try:
                assert _health(api.target, with_client_cert) == NOT_SERVING
                break
            except grpc.RpcError as error:
                last_error = error
                assert api.process.poll() is None, api.output()
                time.sleep(0.2)
        else:
            pytest.fail(f"no answer over mTLS: {last_error}")
        with pytest.raises(grpc.RpcError) as refused:
            _health(api.target, grpc.ssl_channel_credentials(root_certificates=ca))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError), grpc.insecure_channel(api.target) as plaintext:
            health_pb2_grpc.HealthStub(plaintext).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert api.terminate() == 0
