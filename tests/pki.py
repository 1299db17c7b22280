"""Certificates made for a test: a CA, and server and client certificates it signs (EC
P-256, valid for an hour), written as PEM files for the processes' *_FILE variables; and
an RSA pair for RS256 tokens, as an identity provider would hold it."""

from __future__ import annotations

import ipaddress
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, as files."""

    cert: Path
    key: Path


def replace_file(origin: Path, target: Path) -> None:
    """As the kubelet updates a Secret volume: the file replaced whole, never half written."""
    staged = target.with_name(target.name + ".new")
    shutil.copyfile(origin, staged)
    os.replace(staged, target)


def install(source: Pair, mounted: Pair) -> None:
    """`source`'s certificate and key put in place of `mounted`'s, each file whole."""
    replace_file(source.cert, mounted.cert)
    replace_file(source.key, mounted.key)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


class Authority:
    """A self-signed CA whose certificate is written to `<folder>/<name>.pem`."""

    def __init__(self, folder: Path, name: str = "test-ca") -> None:
        self.folder = folder
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = folder / f"{name}.pem"
        ca = self._builder(self._name, self._key, ca=True).sign(self._key, hashes.SHA256())
        self.cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def _builder(
        self, subject: x509.Name, key: ec.EllipticCurvePrivateKey, *, ca: bool
    ) -> x509.CertificateBuilder:
        now = datetime.now(UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )

    def issue(self, name: str, *, ips: tuple[str, ...] = (), dns: tuple[str, ...] = ()) -> Pair:
        """A certificate for `name` (a server's names in `ips` and `dns`), and its key."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = self._builder(subject, key, ca=False)
        names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        names += [x509.DNSName(host) for host in dns]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = Pair(self.folder / f"{name}.pem", self.folder / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


class MountedClientFiles:
    """A client's TLS files as a Secret volume holds them (`ca`, `mounted`), first from
    the CA `old`, then moved to `new` the way cert-manager and the kubelet do."""

    def __init__(self, folder: Path) -> None:
        self.old, self.new = Authority(folder, "old-ca"), Authority(folder, "new-ca")
        self._old_pair, self._new_pair = self.old.issue("old-client"), self.new.issue("new-client")
        self.ca = folder / "ca.crt"
        self.mounted = Pair(folder / "tls.crt", folder / "tls.key")
        install(self._old_pair, self.mounted)
        replace_file(self.old.cert, self.ca)

    def break_pair(self) -> None:
        """An unusable change: the new certificate beside the old key."""
        install(Pair(self._new_pair.cert, self._old_pair.key), self.mounted)

    def renew(self) -> None:
        """The new CA and the client's certificate it signed."""
        install(self._new_pair, self.mounted)
        replace_file(self.new.cert, self.ca)

    def renewed_log_line(self) -> str:
        return f"TLS files renewed: {self.ca}, {self.mounted.cert}, {self.mounted.key}"


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all its."""

    ca: Path
    server: Pair
    client: Pair


def issue_pki(folder: Path) -> Pki:
    authority = Authority(folder)
    return Pki(
        authority.cert,
        authority.issue("server", ips=(LOCALHOST,)),
        authority.issue("client"),
    )


def rsa_token_keys(folder: Path, bits: int = 2048) -> tuple[str, str]:
    """A fresh RSA pair: (private PEM to sign tokens with, path of its public PEM file)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    folder.mkdir(parents=True, exist_ok=True)
    public_file = folder / "public.pem"
    public_file.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private_pem, str(public_file)
