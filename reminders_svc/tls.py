"""TLS of the project's gRPC links, configured from the environment at startup.

One set of rules for every link, each under its own variable prefix:
- `ServerTls`: a port served with TLS (`<prefix>CERT_FILE` + `<prefix>KEY_FILE`), and
  mutual TLS with `<prefix>CLIENT_CA_FILE` (callers must present a certificate that CA
  signed). The API reads REMINDERS_API_TLS_*, the reference notifier
  REMINDERS_NOTIFIER_SERVER_TLS_*.
- `ClientTls`: a channel opened with TLS. `<prefix>CA_FILE` (the trust roots) turns it
  on; `<prefix>CERT_FILE` + `<prefix>KEY_FILE` present a client certificate (mTLS);
  `<prefix>SERVER_NAME` overrides the name checked in the server's certificate (default:
  the target's host). The dispatcher reads REMINDERS_NOTIFIER_TLS_* for its channel to the
  notifier.

Every file is read when the settings are read: a missing, unreadable or malformed file,
or a key that is not the certificate's, stops the process at startup with a ConfigError
naming the variable and the path, never the file's contents. A served port's files are
read again when they change (cert-manager renews a Secret in place, and the kubelet
swaps the mounted files): new connections get the renewed certificate, with no restart;
files that changed but cannot be used (half written, a key not the certificate's) leave
the previous certificate in use, and say so in the log. A channel's files (`ClientTls`)
are looked at again before its calls, at most once a second (`TlsFiles`): its owner opens
a new channel with them and lets the old one finish its calls.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Generic, Protocol, Self, TypeVar, cast

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from reminders_svc.config import ConfigError, Env, PemFile, listen_address, reject_unused

API_PREFIX = "REMINDERS_API_TLS_"
NOTIFIER_SERVER_PREFIX = "REMINDERS_NOTIFIER_SERVER_TLS_"
NOTIFIER_CLIENT_PREFIX = "REMINDERS_NOTIFIER_TLS_"
CLI_CLIENT_PREFIX = "REMINDERS_CLIENT_TLS_"  # the `reminders create|get|...` client

log = logging.getLogger(__name__)

# A DNS name (wildcards aside, as certificates hold them) or an IP address.
_SERVER_NAME = re.compile(r"[A-Za-z0-9._:-]{1,253}")


def _certificates(pem: PemFile) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem.data)
    except ValueError:
        raise ConfigError(f"{pem.variable}={pem.path!r}: holds no PEM certificate") from None


def _check_pair(cert: PemFile, key: PemFile) -> None:
    """The key is a PEM private key, and the first certificate of the chain is its."""
    leaf = _certificates(cert)[0]
    try:
        private = serialization.load_pem_private_key(key.data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # TypeError: an encrypted key, which gRPC cannot use either. The library's message
        # is not shown: it is about the key's contents.
        raise ConfigError(
            f"{key.variable}={key.path!r}: not an unencrypted PEM private key"
        ) from None
    if private.public_key() != leaf.public_key():
        raise ConfigError(
            f"{key.variable}={key.path!r} is not the key of {cert.variable}={cert.path!r}"
        )


def _reload_pair(cert: PemFile, key: PemFile) -> tuple[PemFile, PemFile]:
    """A pair's files read again and checked as at startup (ConfigError if unusable)."""
    cert = PemFile.load(cert.variable, cert.path)
    key = PemFile.load(key.variable, key.path)
    _check_pair(cert, key)
    return cert, key


def _reload_certificates(pem: PemFile) -> PemFile:
    pem = PemFile.load(pem.variable, pem.path)
    _certificates(pem)
    return pem


def _pair(env: Env) -> tuple[PemFile, PemFile] | None:
    """`CERT_FILE` and `KEY_FILE`: both, read and checked, or neither."""
    cert_path, key_path = env.raw("CERT_FILE"), env.raw("KEY_FILE")
    if cert_path is None and key_path is None:
        return None
    if cert_path is None or key_path is None:
        raise ConfigError(f"set both {env.prefix}CERT_FILE and {env.prefix}KEY_FILE, or neither")
    cert = PemFile.load(env.prefix + "CERT_FILE", cert_path)
    key = PemFile.load(env.prefix + "KEY_FILE", key_path)
    _check_pair(cert, key)
    return cert, key


@dataclasses.dataclass(frozen=True)
class ServerTls:
    """TLS of a gRPC port; with `client_ca`, mutual TLS (clients must present a
    certificate it signed). None in the settings: plaintext (local development, or TLS
    terminated by a mesh sidecar)."""

    cert: PemFile
    key: PemFile
    client_ca: PemFile | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str], prefix: str) -> ServerTls | None:
        env = Env(environ, prefix)
        pair = _pair(env)
        if pair is None:
            if env.raw("CLIENT_CA_FILE") is not None:
                raise ConfigError(f"{prefix}CLIENT_CA_FILE needs {prefix}CERT_FILE and _KEY_FILE")
            return None
        client_ca = PemFile.read(env, "CLIENT_CA_FILE")
        if client_ca is not None:
            _certificates(client_ca)
        return cls(cert=pair[0], key=pair[1], client_ca=client_ca)

    def files(self) -> tuple[PemFile, ...]:
        return (
            (self.cert, self.key)
            if self.client_ca is None
            else (self.cert, self.key, self.client_ca)
        )

    def reread(self) -> ServerTls:
        """The same files read again and checked as at startup (ConfigError if unusable)."""
        cert, key = _reload_pair(self.cert, self.key)
        client_ca = None if self.client_ca is None else _reload_certificates(self.client_ca)
        return ServerTls(cert=cert, key=key, client_ca=client_ca)

    def certificate_configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.key.data, self.cert.data)],
            root_certificates=self.client_ca.data if self.client_ca else None,
        )

    def credentials(self) -> grpc.ServerCredentials:
        """Credentials that follow the files: gRPC asks `_Renewals` before each handshake."""
        renewals = _Renewals(self)
        # The stubs leave out the None ("no change") that gRPC's own documentation gives.
        fetcher = cast(Callable[[], grpc.ServerCertificateConfiguration], renewals)
        return grpc.dynamic_ssl_server_credentials(
            renewals.initial(),
            fetcher,
            require_client_authentication=self.client_ca is not None,
        )


_FileStamp = tuple[int, int, int]  # inode, size, modification time (ns)


def _stamps(files: tuple[PemFile, ...]) -> tuple[_FileStamp, ...]:
    # stat follows the kubelet's symlinks, so a swapped Secret volume shows a new inode.
    stats = [os.stat(pem.path) for pem in files]
    return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)


def _contents(tls: _Rereadable) -> list[bytes]:
    return [pem.data for pem in tls.files()]


class _Rereadable(Protocol):
    def files(self) -> tuple[PemFile, ...]: ...

    def reread(self) -> Self: ...


_Tls = TypeVar("_Tls", bound=_Rereadable)


class TlsFiles(Generic[_Tls]):
    """The files of a TLS setting, looked at again on demand. `renewed()` answers the
    setting read anew when its files changed since the last look and are usable, else
    None; files that changed but cannot be used are tried once per change, and logged.
    Not thread-safe: its owner serialises the looks."""

    def __init__(self, tls: _Tls) -> None:
        # Stamped, then read: files renewed since the settings were read (a process that
        # waited minutes for its database before listening) are used, not missed until the
        # next renewal.
        self._seen = _stamps(tls.files())
        self.current: _Tls = self._reread(tls) or tls

    def renewed(self) -> _Tls | None:
        try:
            stamps = _stamps(self.current.files())
        except OSError:
            return None  # a file being swapped: the next look sees it
        if stamps == self._seen:
            return None
        self._seen = stamps
        renewed = self._reread(self.current)
        if renewed is None or _contents(renewed) == _contents(self.current):
            return None  # unusable, or rewritten the same (a sidecar's touch)
        self.current = renewed
        log.info("TLS files renewed: %s", ", ".join(pem.path for pem in renewed.files()))
        return renewed

    @staticmethod
    def _reread(tls: _Tls) -> _Tls | None:
        try:
            return tls.reread()
        except ConfigError as error:
            log.warning(
                "TLS files changed but cannot be used: %s; keeping the previous ones until"
                " they change again",
                error,
            )
            return None


class _Renewals:
    """gRPC's certificate fetcher: called (on a gRPC thread) before every TLS handshake, it
    answers a new configuration when the files changed since the last look, else None (no
    change). A stat per handshake; the files are read only when they change."""

    def __init__(self, tls: ServerTls) -> None:
        self._lock = threading.Lock()
        self._files = TlsFiles(tls)

    def initial(self) -> grpc.ServerCertificateConfiguration:
        return self._files.current.certificate_configuration()

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:  # gRPC's threads: no stale stamp wins
            renewed = self._files.renewed()
        return None if renewed is None else renewed.certificate_configuration()


def add_port(server: grpc.aio.Server, host: str, port: int, tls: ServerTls | None) -> int:
    """Listen on `host` and `port`, with TLS when `tls` is set; the port bound (0: any free
    one).

    OSError when it cannot (gRPC raises a bare RuntimeError, which the commands would show
    as a traceback rather than one line naming the address)."""
    address = listen_address(host, port)
    try:
        if tls is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, tls.credentials())
    except RuntimeError:
        message = f"cannot listen on {address}: the port is taken, or the host is not this one"
        raise OSError(message) from None


@dataclasses.dataclass(frozen=True)
class ClientTls:
    """TLS of a channel this process opens: the server must present a certificate `ca`
    signed, for the target's host or `server_name`; with `cert` and `key`, this process
    presents its own (mutual TLS)."""

    ca: PemFile
    cert: PemFile | None = None
    key: PemFile | None = None
    server_name: str | None = None

    @property
    def mutual(self) -> bool:
        return self.cert is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str], prefix: str) -> ClientTls | None:
        env = Env(environ, prefix)
        ca = PemFile.read(env, "CA_FILE")
        if ca is None:
            # Half a configuration would silently run in plaintext: refuse it.
            reject_unused(
                env, ("CERT_FILE", "KEY_FILE", "SERVER_NAME"), "CA_FILE (it turns TLS on)"
            )
            return None
        _certificates(ca)
        pair = _pair(env)
        server_name = env.raw("SERVER_NAME")
        if server_name is not None and not _SERVER_NAME.fullmatch(server_name):
            raise ConfigError(f"{prefix}SERVER_NAME={server_name!r}: expected a host name")
        cert, key = pair if pair is not None else (None, None)
        return cls(ca=ca, cert=cert, key=key, server_name=server_name)

    def files(self) -> tuple[PemFile, ...]:
        if self.cert is None or self.key is None:
            return (self.ca,)
        return (self.ca, self.cert, self.key)

    def reread(self) -> ClientTls:
        """The same files read again and checked as at startup (ConfigError if unusable)."""
        ca = _reload_certificates(self.ca)
        if self.cert is None or self.key is None:
            return dataclasses.replace(self, ca=ca)
        cert, key = _reload_pair(self.cert, self.key)
        return dataclasses.replace(self, ca=ca, cert=cert, key=key)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.data,
            private_key=self.key.data if self.key else None,
            certificate_chain=self.cert.data if self.cert else None,
        )

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        """Added to the channel's own options (reminders_svc/connections.py)."""
        if self.server_name is None:
            return ()
        return (("grpc.ssl_target_name_override", self.server_name),)
