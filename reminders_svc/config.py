"""Typed settings read from the environment once, at startup (never at import time).

Secrets are held as `Secret` so that neither repr() nor logging prints them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal, TypeVar

from reminders_svc.schedule.zones import OVERRIDE_DIR_ENV, overridden_zones, override_problem

log = logging.getLogger(__name__)

ConsistencyName = Literal["ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"]
SerialConsistencyName = Literal["SERIAL", "LOCAL_SERIAL"]
_Choice = TypeVar("_Choice", bound=str)


class ConfigError(ValueError):
    """An environment variable is missing or malformed; the message names it."""


@dataclass(frozen=True)
class Retention:
    # Bucket entries live until due + this: longer than any outage we recover from.
    bucket: timedelta = timedelta(days=7)
    idempotency: timedelta = timedelta(days=7)
    history: timedelta = timedelta(days=90)
    # Deleted rows stay as tombstones past the dispatcher's retry horizon.
    tombstone: timedelta = timedelta(days=30)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Retention:
        """Read by every writer of these rows (API, dispatcher, admin), so they agree."""
        env = Env(os.environ if environ is None else environ, "REMINDERS_")
        longest_record = cls.tombstone / timedelta(days=1)
        return cls(
            bucket=env.days("BUCKET_RETENTION_DAYS", cls.bucket, low=1, high=365),
            # TTL 0 would keep the records for ever, and a record outliving the deleted
            # row would let a late replay of the create re-create it under the same id.
            idempotency=env.days(
                "IDEMPOTENCY_RETENTION_DAYS",
                cls.idempotency,
                low=1,
                high=longest_record,
                why="no longer than a deleted reminder's row, or a replayed create re-creates it",
            ),
            history=env.days("HISTORY_RETENTION_DAYS", cls.history, low=1, high=3650),
        )


@dataclass(frozen=True)
class Secret:
    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret('****')"

    __str__ = __repr__


def secret_setting(values: Mapping[str, str], name: str) -> str | None:
    """The secret `name`, set as that variable or as `<name>_FILE`, the path of a file
    holding it (a mounted Kubernetes Secret: kept out of the environment, which `env` in
    a `kubectl exec` and /proc/<pid>/environ show). Messages never hold the value."""
    value = values.get(name) or None
    path = values.get(name + "_FILE") or None
    if path is None:
        return value
    if value is not None:
        raise ConfigError(f"set one of {name} and {name}_FILE, not both")
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as error:
        raise ConfigError(f"{name}_FILE={path!r}: cannot be read ({error.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name}_FILE={path!r}: not UTF-8 text") from None
    if not text:
        raise ConfigError(f"{name}_FILE={path!r}: empty")
    if text != text.strip():
        # `echo secret > file` adds a newline: a different secret from the one meant.
        raise ConfigError(
            f"{name}_FILE={path!r}: starts or ends with whitespace (a newline? write it"
            " with `printf %s` or `kubectl create secret --from-literal`)"
        )
    return text


@dataclass(frozen=True)
class Replication:
    """SimpleStrategy with one factor (a local node) or NetworkTopologyStrategy per DC."""

    strategy: Literal["SimpleStrategy", "NetworkTopologyStrategy"]
    factors: tuple[tuple[str, int], ...]

    @classmethod
    def parse(cls, text: str) -> Replication:
        """`SimpleStrategy:1` or `NetworkTopologyStrategy:dc1=3,dc2=3`."""
        strategy, _, spec = text.partition(":")
        try:
            if strategy == "SimpleStrategy":
                return cls("SimpleStrategy", (("replication_factor", int(spec or "1")),))
            if strategy == "NetworkTopologyStrategy" and spec:
                pairs = tuple(
                    (dc.strip(), int(rf))
                    for dc, rf in (item.split("=") for item in spec.split(","))
                )
                return cls("NetworkTopologyStrategy", pairs)
        except ValueError as error:
            raise ConfigError(f"REMINDERS_CASSANDRA_REPLICATION={text!r}: {error}") from error
        raise ConfigError(
            f"REMINDERS_CASSANDRA_REPLICATION={text!r}: expected 'SimpleStrategy:<rf>' or "
            "'NetworkTopologyStrategy:<dc>=<rf>[,<dc>=<rf>...]'"
        )

    def cql(self) -> str:
        items = [f"'class': '{self.strategy}'"] + [f"'{k}': {v}" for k, v in self.factors]
        return "{" + ", ".join(items) + "}"

    @staticmethod
    def strategy_of(found: Mapping[str, str]) -> str:
        """The strategy's short name in a keyspace's replication as system_schema.keyspaces
        holds it (the class in full: org.apache.cassandra.locator.SimpleStrategy)."""
        return found.get("class", "").rsplit(".", 1)[-1]

    def matches(self, found: Mapping[str, str]) -> bool:
        """Whether a keyspace's replication as system_schema.keyspaces holds it (the
        factors as text) is this one."""
        factors = {key: value for key, value in found.items() if key != "class"}
        return self.strategy_of(found) == self.strategy and factors == {
            k: str(v) for k, v in self.factors
        }


@dataclass(frozen=True)
class PemFile:
    """A PEM file as read at startup. Its repr names the variable and the path, never the
    contents (a private key)."""

    variable: str
    path: str
    data: bytes = field(repr=False)

    @classmethod
    def read(cls, env: Env, name: str) -> PemFile | None:
        """The file `<prefix><name>` names, or None when the variable is unset."""
        path = env.raw(name)
        return None if path is None else cls.load(env.prefix + name, path)

    @classmethod
    def load(cls, variable: str, path: str) -> PemFile:
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            reason = error.strerror or type(error).__name__
            raise ConfigError(f"{variable}={path!r}: cannot read it ({reason})") from None
        if b"-----BEGIN " not in data:
            raise ConfigError(f"{variable}={path!r}: not a PEM file")
        return cls(variable, path, data)


def reject_unused(env: Env, names: tuple[str, ...], needs: str) -> None:
    """Half a TLS configuration would silently run in plaintext: refuse it."""
    given = [env.prefix + name for name in names if env.raw(name) is not None]
    if given:
        verb = "needs" if len(given) == 1 else "need"
        raise ConfigError(f"{', '.join(given)} {verb} {env.prefix}{needs}")


CASSANDRA_PREFIX = "REMINDERS_CASSANDRA_"


@dataclass(frozen=True)
class TlsSettings:
    """TLS to Cassandra (REMINDERS_CASSANDRA_TLS=true): the nodes' certificates checked
    against `ca` (else the system's roots); with `cert`, this client presents its
    certificate, its key in `key` or, without one, in the same file. Files are read and
    checked at startup; the storage layer reads them again when they change
    (`reminders_svc.storage.session.RenewingSslContext`)."""

    ca: PemFile | None
    cert: PemFile | None
    key: PemFile | None
    check_hostname: bool
    # The client these files made when checked: built once, used as is (a second build
    # from the paths could meet files swapped since, and fail).
    context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS client, made when checked (settings made by hand: made now)."""
        return self.context if self.context is not None else self.checked().ssl_context()

    @classmethod
    def from_env(cls, env: Env) -> TlsSettings | None:
        """`env` reads REMINDERS_CASSANDRA_*."""
        files = ("TLS_CA_FILE", "TLS_CERT_FILE", "TLS_KEY_FILE")
        if not env.flag("TLS", False):
            reject_unused(env, files, "TLS=true (plaintext otherwise)")
            return None
        ca, cert, key = (PemFile.read(env, name) for name in files)
        if key is not None and cert is None:
            raise ConfigError(f"{key.variable} needs {env.prefix}TLS_CERT_FILE")
        return cls(ca, cert, key, env.flag("TLS_CHECK_HOSTNAME", True)).checked()

    def checked(self) -> TlsSettings:
        """These settings with the TLS client they make (ConfigError if they cannot)."""
        try:
            context = ssl.create_default_context(cafile=self.ca.path if self.ca else None)
            context.check_hostname = self.check_hostname
            if self.cert is not None:
                context.load_cert_chain(self.cert.path, self.key.path if self.key else None)
        except (OSError, ValueError, TypeError) as error:  # ssl.SSLError is an OSError
            # A CA file of no certificate, a certificate without its key, or a key not the
            # certificate's; or a file gone since it was read (a Secret being swapped). The
            # reason is OpenSSL's or the system's, about the files, never their contents.
            reason = getattr(error, "reason", None) or type(error).__name__
            raise ConfigError(
                f"{CASSANDRA_PREFIX}TLS_*_FILE: the files make no TLS client ({reason})"
            ) from None
        return dataclasses.replace(self, context=context)

    def files(self) -> tuple[PemFile, ...]:
        return tuple(pem for pem in (self.ca, self.cert, self.key) if pem is not None)

    def reread(self) -> TlsSettings:
        """The same files read again and checked as at startup (ConfigError if unusable)."""

        def again(pem: PemFile | None) -> PemFile | None:
            return None if pem is None else PemFile.load(pem.variable, pem.path)

        return dataclasses.replace(
            self, ca=again(self.ca), cert=again(self.cert), key=again(self.key)
        ).checked()


@dataclass(frozen=True)
class CassandraSettings:
    contact_points: tuple[str, ...] = ("127.0.0.1",)
    port: int = 9042
    keyspace: str = "reminders"
    local_dc: str | None = None
    consistency: ConsistencyName = "LOCAL_QUORUM"
    serial_consistency: SerialConsistencyName = "SERIAL"
    username: str | None = None
    password: Secret | None = None
    tls: TlsSettings | None = None
    replication: Replication = Replication("SimpleStrategy", (("replication_factor", 1),))
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 12.0
    # Without TLS, whether the driver may reach nodes off this host (in development, or
    # under a mesh): else it keeps to the loopback ones, the peers it discovers included.
    plaintext_off_host: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CassandraSettings:
        env = Env(os.environ if environ is None else environ, CASSANDRA_PREFIX)
        tls = TlsSettings.from_env(env)
        password = env.secret("PASSWORD")
        settings = cls(
            contact_points=tuple(
                p.strip() for p in env.text("CONTACT_POINTS", "127.0.0.1").split(",") if p.strip()
            ),
            port=env.integer("PORT", 9042, low=1, high=65535),
            keyspace=env.identifier("KEYSPACE", "reminders"),
            local_dc=env.raw("LOCAL_DC"),
            consistency=env.choice(
                "CONSISTENCY",
                "LOCAL_QUORUM",
                ("ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "ALL"),
            ),
            serial_consistency=env.choice(
                "SERIAL_CONSISTENCY", "SERIAL", ("SERIAL", "LOCAL_SERIAL")
            ),
            username=env.raw("USERNAME"),
            password=Secret(password) if password is not None else None,
            tls=tls,
            replication=Replication.parse(env.text("REPLICATION", "SimpleStrategy:1")),
            connect_timeout_s=env.number("CONNECT_TIMEOUT", 10, low=0.1, high=600),
            request_timeout_s=env.number("REQUEST_TIMEOUT", 12, low=0.1, high=600),
            plaintext_off_host=plaintext_off_host_allowed(env.values),
        )
        _check_consistency(settings)
        for point in settings.contact_points:
            require_protected(
                env.values,
                "REMINDERS_CASSANDRA_CONTACT_POINTS (reminder texts and the role's password)",
                point,
                settings.tls is not None,
            )
        return settings


# Set to say that a service mesh encrypts and authenticates pod-to-pod traffic, so a link
# of this project may run in plaintext outside development (see `require_protected`).
MESH_VARIABLE = "REMINDERS_PLAINTEXT_IN_MESH"
# gRPC's target forms (https://github.com/grpc/grpc/blob/master/doc/naming.md).
_TARGET_SCHEME = re.compile(r"^(dns:(//[^/]*/)?|ipv4:|ipv6:)")
_SOCKET_SCHEMES = ("unix:", "unix-abstract:")  # a socket on this host
# Targets whose addresses gRPC learns elsewhere or that are not TCP: no port to check.
_PORTLESS_SCHEMES = (*_SOCKET_SCHEMES, "vsock:", "xds:", "google-c2p:")


def hosts_of(address: str) -> tuple[str, ...]:
    """The hosts of a `host:port` address or gRPC target: every address of an ipv4: or
    ipv6: list (gRPC falls through to each), an IPv6 host with or without brackets, a unix:
    socket as it is. A target of another scheme (xds:, say) is returned whole: not known
    to stay on this host."""
    if address.startswith(_SOCKET_SCHEMES):
        return (address,)
    return tuple(_split(part)[0] for part in _addresses(address))


def target_problem(address: str) -> str | None:
    """Why a `host:port` address or gRPC target names a port no TCP connection can have
    (gRPC wraps one past 65535 round, 99999 to 34463, and connects there), or, written
    without a scheme, names no port (gRPC dials 443 then, which no service here listens
    on: a forgotten port) or no host; None if none of these. A dns:, ipv4: or ipv6: target
    may leave its port to gRPC's default, as its naming document says; an xds: or unix:
    one names no TCP port."""
    if address.startswith(_PORTLESS_SCHEMES):
        return None
    named_scheme = _TARGET_SCHEME.match(address) is not None
    for part in _addresses(address):
        host, port = _split(part)
        if port is None:
            if named_scheme:
                continue
            return "no port: expected host:port"
        if not host and not named_scheme:
            return "no host: expected host:port"
        if not 1 <= int(port) <= 65535:
            return f"port {port} is not 1 to 65535"
    return None


def bare_host(host: str) -> str:
    """`host` without the brackets an IPv6 address may be written in (`[::1]`)."""
    return _split(host)[0]


def listen_address(host: str, port: int) -> str:
    """`host:port` as gRPC reads it: an IPv6 host in brackets (unbracketed, `::1:0` is
    read as the address ::0.1.0.0 on the default port)."""
    bare = bare_host(host)
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def _addresses(address: str) -> list[str]:
    """The addresses of a target, its scheme dropped: every one of an ipv4: or ipv6: list."""
    listed = address.startswith(("ipv4:", "ipv6:"))
    rest = _TARGET_SCHEME.sub("", address)
    return rest.split(",") if listed else [rest]


def _split(address: str) -> tuple[str, str | None]:
    """Host and port (None when there is none, or a bare IPv6 address)."""
    if address.startswith("["):
        host, _, after = address[1:].partition("]")
        return host, after[1:] if after.startswith(":") and after[1:].isdigit() else None
    host, colon, port = address.rpartition(":")
    if colon and port.isdigit() and ":" not in host:
        return host, port
    return address, None


def is_local(address: str) -> bool:
    """Whether `address` (as `hosts_of` reads it) never leaves this machine: a loopback
    address, localhost, a unix socket, or a list of those."""
    return all(_is_local_host(host) for host in hosts_of(address))


def _is_local_host(host: str) -> bool:
    if host.startswith(_SOCKET_SCHEMES):
        return True
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def in_development(environ: Mapping[str, str]) -> bool:
    """REMINDERS_ENV=dev: development defaults and exemptions apply."""
    return environ.get("REMINDERS_ENV", "") == "dev"


def plaintext_off_host_allowed(environ: Mapping[str, str]) -> bool:
    """Development, or a mesh said to encrypt pod-to-pod traffic."""
    return in_development(environ) or Env(environ).flag(MESH_VARIABLE, False)


def require_protected(
    environ: Mapping[str, str],
    link: str,
    address: str,
    protected: bool,
    *,
    in_development_too: bool = False,
) -> None:
    """Outside development (or `in_development_too`), refuse a `link` that reminder texts,
    tokens or passwords cross in plaintext off this host, unless a mesh protects it
    (`REMINDERS_PLAINTEXT_IN_MESH=true`): a deployment that forgot its TLS variables must
    not start and carry them readable."""
    exempt = in_development(environ) and not in_development_too
    if protected or exempt or is_local(address):
        return
    if Env(environ).flag(MESH_VARIABLE, False):
        # Said at every start: if the mesh is gone (or was never there), this is how an
        # operator learns that the link is plaintext on the network.
        log.warning(
            "%s is plaintext to %r, relying on a service mesh to encrypt it (%s=true)",
            link.split(" ", 1)[0],
            address,
            MESH_VARIABLE,
        )
        return
    where = "" if in_development_too else " outside REMINDERS_ENV=dev"
    raise ConfigError(
        f"{link} is plaintext to {address!r}{where}: set its TLS variables"
        f" (docs/operations.md, Encryption in transit), or {MESH_VARIABLE}=true if a service"
        " mesh encrypts and authenticates pod-to-pod traffic"
    )


def _check_consistency(settings: CassandraSettings) -> None:
    """Refuse levels at which a read may miss a write made before it (DESIGN.md invariant
    3: the dispatcher's re-read after the grace must see every bucket entry and row change
    written by then)."""
    level, factors = settings.consistency, settings.replication.factors
    # ONE may be served by any replica anywhere; LOCAL_ONE by any in the local DC.
    replicas = sum if level == "ONE" else max
    if level in ("ONE", "LOCAL_ONE") and replicas(factor for _, factor in factors) > 1:
        raise ConfigError(
            f"REMINDERS_CASSANDRA_CONSISTENCY={level}: with more than one replica a read at "
            "it may miss a write at it; use LOCAL_QUORUM or QUORUM"
        )
    several_dcs = settings.replication.strategy == "NetworkTopologyStrategy" and len(factors) > 1
    if several_dcs and settings.serial_consistency == "SERIAL" and level.startswith("LOCAL_"):
        # SERIAL says writers sit in several data centres; a LOCAL_ level then acknowledges
        # their writes in one, and another's dispatcher may read past them.
        raise ConfigError(
            f"REMINDERS_CASSANDRA_CONSISTENCY={level} with SERIAL across several data "
            "centres: use QUORUM (writers in several data centres), or LOCAL_SERIAL "
            "(every writer in one)"
        )


@dataclass(frozen=True)
class MinuteTiming:
    """How the dispatcher closes a minute, which every writer of bucket entries must respect
    (DESIGN.md invariant 3): it re-reads the minute `grace` (G) after its end, reading
    entries `skew` earlier than its last look for writers' clocks. A write that may land
    later than G minus the skew could miss that re-read, so the API's write deadline must
    be shorter. The dispatcher and the API both read it here, from the same variables
    (one ConfigMap, k8s/base/reminders.env)."""

    grace: timedelta = timedelta(seconds=20)
    skew: timedelta = timedelta(seconds=5)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MinuteTiming:
        read = Env(env, "REMINDERS_DISPATCH_")
        timing = cls(
            grace=read.seconds("GRACE_S", cls.grace, low=1, high=3600),
            skew=read.seconds("SKEW_S", cls.skew, low=0, high=600),
        )
        if timing.skew >= timing.grace:
            raise ConfigError(
                "REMINDERS_DISPATCH_SKEW_S must be shorter than REMINDERS_DISPATCH_GRACE_S"
            )
        return timing

    @property
    def longest_write(self) -> timedelta:
        """A write deadline must be shorter than this."""
        return self.grace - self.skew


# How long the notifier may still deliver a ring after a hand-off attempt: the expiry
# each attempt carries. Read by the dispatchers, which set it, and by the API, whose
# deletes say a ring may be in flight while one can still go out (architecture.md, 27).
RING_EXPIRY = timedelta(hours=1)


def ring_expiry_from_env(env: Mapping[str, str]) -> timedelta:
    read = Env(env, "REMINDERS_DISPATCH_")
    # Under a second is less than one push takes: every hand-off would expire in the queue.
    return read.seconds("RING_EXPIRY_S", RING_EXPIRY, low=1, high=7 * 86_400)


# How long after a hand-off attempt its ring may still be pushed, by default: the ring
# expiry, and the clock-skew allowance of a notifier's clock.
HANDOFF_WINDOW = RING_EXPIRY + MinuteTiming.skew


@dataclass(frozen=True)
class Env:
    """Typed, bounded reads of one process's environment. An unset or empty variable takes
    its default; a malformed or out-of-range one is a ConfigError naming the variable, so
    a typo stops the process at startup instead of running it on nonsense (a lease of
    `inf`, no push workers). Bounds are what the setting can mean, not tuning advice."""

    values: Mapping[str, str]
    prefix: str = ""

    def raw(self, name: str) -> str | None:
        value = self.values.get(self.prefix + name)
        return value if value not in (None, "") else None

    def secret(self, name: str) -> str | None:
        """The variable, or the contents of the file `<name>_FILE` names."""
        return secret_setting(self.values, self.prefix + name)

    def text(self, name: str, default: str) -> str:
        return self.raw(name) or default

    def number(
        self, name: str, default: float, *, low: float, high: float, unit: str = "", why: str = ""
    ) -> float:
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ConfigError(f"{self.prefix}{name}={raw!r}: expected a number")
        if not low <= value <= high:
            reason = f" ({why})" if why else ""
            raise ConfigError(
                f"{self.prefix}{name}={raw!r}: expected {low:g} to {high:g}{unit}{reason}"
            )
        return value

    def integer(self, name: str, default: int, *, low: int, high: int) -> int:
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{self.prefix}{name}={raw!r}: expected an integer") from None
        if not low <= value <= high:
            raise ConfigError(f"{self.prefix}{name}={raw!r}: expected {low} to {high}")
        return value

    def port(self, name: str, default: int) -> int:
        """A TCP port; 0 asks for any free one (tests)."""
        return self.integer(name, default, low=0, high=65535)

    def seconds(
        self, name: str, default: timedelta, *, low: float, high: float, why: str = ""
    ) -> timedelta:
        """`low` and `high` in seconds, as the variable is."""
        value = self.number(name, default.total_seconds(), low=low, high=high, unit=" s", why=why)
        return timedelta(seconds=value)

    def days(
        self, name: str, default: timedelta, *, low: float, high: float, why: str = ""
    ) -> timedelta:
        in_days = default / timedelta(days=1)
        value = self.number(name, in_days, low=low, high=high, unit=" days", why=why)
        return timedelta(days=value)

    def flag(self, name: str, default: bool) -> bool:
        raw = self.raw(name)
        return default if raw is None else _truthy(raw, self.prefix + name)

    def choice(self, name: str, default: _Choice, choices: tuple[_Choice, ...]) -> _Choice:
        return _choice(self.raw(name) or default, self.prefix + name, choices)

    def identifier(self, name: str, default: str) -> str:
        return _identifier(self.raw(name) or default, self.prefix + name)

    def hooks(self, name: str, known: frozenset[str]) -> frozenset[str]:
        """A comma-separated set of test hooks, each one of `known`: a misspelt hook would
        quietly test nothing."""
        named = frozenset(filter(None, (self.raw(name) or "").split(",")))
        unknown = sorted(named - known)
        if unknown:
            raise ConfigError(f"{self.prefix}{name}: unknown fault {unknown[0]!r}")
        return named


def _truthy(value: str | None, name: str) -> bool:
    lowered = (value or "").lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={value!r}: expected true or false")


# A keyspace name as CQL keeps it unquoted: CQL lowercases unquoted names, while the
# driver quotes the one it is given, so "Reminders" would be created as "reminders" and
# then not be found; Cassandra refuses names over 48 characters.
_KEYSPACE_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}", re.ASCII)


def _identifier(value: str | None, name: str) -> str:
    if value is None or not _KEYSPACE_NAME.fullmatch(value):
        raise ConfigError(
            f"{name}={value!r}: expected a CQL identifier (a-z first, then a-z, 0-9 or _;"
            " at most 48)"
        )
    return value


def _choice(value: str | None, name: str, choices: tuple[_Choice, ...]) -> _Choice:
    for choice in choices:
        if value == choice:
            return choice
    raise ConfigError(f"{name}={value!r}: expected one of {', '.join(choices)}")


def check_tz_override(environ: Mapping[str, str]) -> None:
    """ConfigError when REMINDERS_TZ_OVERRIDE_DIR is set to anything but a directory holding
    at least one zone's file, every one of them loadable: without the check, every zone
    would quietly keep the pinned rules, or a create in a zone with a broken file would
    fail. Read where dues are computed (API, dispatchers, replan), at their start."""
    configured = environ.get(OVERRIDE_DIR_ENV, "")
    if not configured:
        return
    directory = Path(configured)
    try:
        if not directory.is_dir():
            raise ConfigError(f"{OVERRIDE_DIR_ENV}={configured!r}: not a directory")
        zones = overridden_zones(directory)
    except OSError as error:  # a name too long, a directory not readable
        raise ConfigError(
            f"{OVERRIDE_DIR_ENV}={configured!r}: cannot be read ({error.strerror or error})"
        ) from None
    if not zones:
        raise ConfigError(
            f"{OVERRIDE_DIR_ENV}={configured!r}: holds no zone file (want e.g. "
            "<dir>/America/Sao_Paulo, a TZif file named as the zone)"
        )
    for zone in zones:
        problem = override_problem(directory, zone)
        if problem is not None:
            raise ConfigError(f"{OVERRIDE_DIR_ENV}={configured!r}: {zone} unusable: {problem}")
