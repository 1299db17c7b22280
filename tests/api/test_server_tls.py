"""TLS and mutual TLS on the API port, with certificates made for the test."""

from __future__ import annotations

import dataclasses
import ipaddress
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from reminders_svc.config import CassandraSettings
from tests.api.serving import NOT_SERVING, serve_api
from tests.platform.helpers import free_port


@dataclasses.dataclass(frozen=True)
class Issued:
    key_pem: bytes
    cert_pem: bytes


def _issue(
    name: str, issuer: tuple[ec.EllipticCurvePrivateKey, x509.Name] | None, *, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A certificate for `name`, self-signed when `issuer` is None (a CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signing_key, issuer_name = issuer or (key, subject)
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return key, builder.sign(signing_key, hashes.SHA256())


def _pem(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> Issued:
    return Issued(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        cert.public_bytes(serialization.Encoding.PEM),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = _issue("test-ca", None, server=False)
    ca = (ca_key, ca_cert.subject)
    files = {"ca": folder / "ca.pem"}
    files["ca"].write_bytes(_pem(ca_key, ca_cert).cert_pem)
    for name, server in (("server", True), ("client", False)):
        issued = _pem(*_issue(name, ca, server=server))
        files[f"{name}_key"] = folder / f"{name}.key"
        files[f"{name}_cert"] = folder / f"{name}.pem"
        files[f"{name}_key"].write_bytes(issued.key_pem)
        files[f"{name}_cert"].write_bytes(issued.cert_pem)
    return files


def _health(target: str, credentials: grpc.ChannelCredentials) -> int:
    with grpc.secure_channel(target, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        status: int = stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status
        return status


def test_mutual_tls(pki: dict[str, Path], migrated_settings: CassandraSettings) -> None:
    # No Cassandra needed: the health service answers NOT_SERVING over TLS all the same.
    unreachable = dataclasses.replace(migrated_settings, port=free_port())
    with serve_api(
        unreachable,
        REMINDERS_API_TLS_CERT_FILE=str(pki["server_cert"]),
        REMINDERS_API_TLS_KEY_FILE=str(pki["server_key"]),
        REMINDERS_API_TLS_CLIENT_CA_FILE=str(pki["ca"]),
    ) as api:
        ca = pki["ca"].read_bytes()
        with_client_cert = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=pki["client_key"].read_bytes(),
            certificate_chain=pki["client_cert"].read_bytes(),
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
