"""One place that turns `CassandraSettings` into a connected driver session.

The default execution profile carries the read/write consistency and the serial
consistency for LWTs, so callers never pass consistency levels by hand.
"""

from __future__ import annotations

import functools
import logging
import re
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any

from cassandra import ConsistencyLevel, DriverException, UnresolvableContactPoints
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    Session,
)
from cassandra.connection import Connection, ConnectionException
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    HostFilterPolicy,
    LoadBalancingPolicy,
    TokenAwarePolicy,
)
from cassandra.pool import Host
from cassandra.query import PreparedStatement, ValueSequence, named_tuple_factory

from reminders_svc.config import CassandraSettings, TlsSettings, is_local
from reminders_svc.storage import aio
from reminders_svc.storage.errors import StorageUnavailable
from reminders_svc.storage.retry import NoConditionalResend
from reminders_svc.tls import TlsFiles

log = logging.getLogger(__name__)


@dataclass
class CassandraConnection:
    cluster: Cluster
    session: Session
    settings: CassandraSettings

    def close(self) -> None:
        self.cluster.shutdown()

    def __enter__(self) -> CassandraConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RenewingSslContext:
    """The driver's `ssl_context` (it asks only `check_hostname` and `wrap_socket`), made
    anew from the TLS files when they changed: a stat of each per new connection, so the
    pools' next connections present a renewed certificate and trust a renewed CA with no
    restart; open ones keep what they began with. Files that changed but cannot be used
    keep the previous context, and are logged (`TlsFiles`)."""

    def __init__(self, tls: TlsSettings) -> None:
        self._lock = threading.Lock()  # the driver connects from several threads
        self._files = TlsFiles(tls)

    @property
    def check_hostname(self) -> bool:
        return self._files.current.check_hostname

    def wrap_socket(self, sock: socket.socket, **options: Any) -> ssl.SSLSocket:
        with self._lock:
            self._files.renewed()
            context = self._files.current.ssl_context()  # made when its files were checked
        return context.wrap_socket(sock, **options)


def _ssl_context(settings: CassandraSettings) -> RenewingSslContext | None:
    return None if settings.tls is None else RenewingSslContext(settings.tls)


@functools.lru_cache(maxsize=512)
def _row_class(colnames: tuple[str, ...]) -> Any:
    return named_tuple_factory(colnames, [tuple(colnames)])[0].__class__


def cached_named_tuple_factory(colnames: list[str], rows: list[Any]) -> list[Any]:
    """The driver's namedtuple rows, without building a new namedtuple class per result
    (the driver's default does, and it costs more than decoding the row on a hot path)."""
    row_class = _row_class(tuple(colnames))
    return [row_class(*row) for row in rows]


# The driver's default waits up to 10 minutes between attempts to reach a node that was
# down, and gives up after 64: a process could stay cut off long after an outage ended.
RECONNECTION = ExponentialReconnectionPolicy(base_delay=0.5, max_delay=10.0, max_attempts=None)


class Profile(ExecutionProfile):  # type: ignore[misc]  # the driver is untyped
    """The driver's execution profile, plus the cluster's CAS bound (`aio.cas_bound_s`),
    set once connected (`read_cas_bound`)."""

    cas_bound_s: float = aio.DEFAULT_CAS_BOUND_S


def execution_profile(settings: CassandraSettings) -> ExecutionProfile:
    policy: LoadBalancingPolicy = TokenAwarePolicy(
        DCAwareRoundRobinPolicy(local_dc=settings.local_dc)
    )
    if settings.tls is None and not settings.plaintext_off_host:
        # The contact points were checked to be this host's (CassandraSettings.from_env);
        # the peers the driver discovers were not: texts and the role's password must not
        # reach one of them in plaintext. An ignored node gets no connection at all.
        policy = HostFilterPolicy(policy, _on_this_host)
    return Profile(
        row_factory=cached_named_tuple_factory,
        load_balancing_policy=policy,
        consistency_level=ConsistencyLevel.name_to_value[settings.consistency],
        serial_consistency_level=ConsistencyLevel.name_to_value[settings.serial_consistency],
        request_timeout=settings.request_timeout_s,
        retry_policy=NoConditionalResend(),
    )


def _on_this_host(host: Host) -> bool:
    # The filter asks for every host of every query plan: judged once per address.
    return _address_on_this_host(str(host.address))


@functools.cache
def _address_on_this_host(address: str) -> bool:
    if is_local(address):
        return True
    log.warning(
        "Cassandra node %s ignored: off this host, and the link has no TLS"
        " (REMINDERS_CASSANDRA_TLS_*, or REMINDERS_PLAINTEXT_IN_MESH=true under a mesh)",
        address,
    )
    return False


def serial_read_level(session: Session) -> int:
    """The consistency of a read that settles an LWT: the serial level the LWTs are written
    at (REMINDERS_CASSANDRA_SERIAL_CONSISTENCY). A SERIAL read after LOCAL_SERIAL writes
    can miss a proposal accepted in the local data centre only, and the reverse."""
    level: int = session.cluster.profile_manager.default.serial_consistency_level
    return level


def prepare_serial(session: Session, query: str) -> PreparedStatement:
    """A read through Paxos (`serial_read_level`): it completes any LWT in flight first."""
    statement = session.prepare(query)
    statement.consistency_level = serial_read_level(session)
    return statement


def new_cluster(
    settings: CassandraSettings, *, connection_class: type[Connection] | None = None
) -> Cluster:
    """A cluster not yet connected (its only I/O: resolving the contact points' names).
    `connection_class` picks the driver's reactor (default: libev, on its own thread)."""
    options: dict[str, Any] = {}
    if connection_class is not None:
        options["connection_class"] = connection_class
    if settings.username is not None:
        password = settings.password.value if settings.password else ""
        options["auth_provider"] = PlainTextAuthProvider(settings.username, password)
    try:
        return Cluster(
            list(settings.contact_points),
            port=settings.port,
            protocol_version=5,
            execution_profiles={EXEC_PROFILE_DEFAULT: execution_profile(settings)},
            connect_timeout=settings.connect_timeout_s,
            reconnection_policy=RECONNECTION,
            control_connection_timeout=settings.connect_timeout_s,
            ssl_context=_ssl_context(settings),
            **options,
        )
    except UnresolvableContactPoints:
        # Storage trouble, waited out like any (a headless Service's name resolves only
        # while one of its nodes is ready), not a crash.
        names = ", ".join(settings.contact_points)
        raise StorageUnavailable(
            f"cannot resolve any Cassandra contact point ({names}): check the names and DNS"
        ) from None


def connect(settings: CassandraSettings, *, keyspace: str | None = None) -> CassandraConnection:
    """Connect with the driver's own reactor; `keyspace=None` uses the configured one,
    `keyspace=""` none (for migrations)."""
    return connect_cluster(new_cluster(settings), settings, keyspace=keyspace)


def connect_cluster(
    cluster: Cluster, settings: CassandraSettings, *, keyspace: str | None = None
) -> CassandraConnection:
    """`cluster` connected (blocking); shut down if it cannot be."""
    chosen = settings.keyspace if keyspace is None else keyspace
    try:
        session = cluster.connect(chosen or None)
    except NoHostAvailable as error:
        cluster.shutdown()
        where = ", ".join(f"{host}:{settings.port}" for host in settings.contact_points)
        if not isinstance(error.errors, dict):  # a list of hosts: they refused the keyspace
            raise StorageUnavailable(
                f"Cassandra at {where} has no keyspace {chosen!r} ({error.args[0]}); "
                "create it with `reminders migrate`"
            ) from error
        reasons = "; ".join(f"{host}: {reason}" for host, reason in error.errors.items())
        raise StorageUnavailable(
            f"cannot reach Cassandra at {where} ({reasons or error}). Is the node running? "
            "Locally: `reminders cassandra start`."
        ) from error
    profile = session.cluster.profile_manager.default
    if isinstance(profile, Profile):
        try:
            profile.cas_bound_s = read_cas_bound(session)
        except BaseException:  # the connected cluster's threads would outlive the caller
            cluster.shutdown()
            raise
    return CassandraConnection(cluster=cluster, session=session, settings=settings)


# Cassandra 4.1+ names first (values with a unit, "5000ms"), then the older ones (ms).
_CAS_TIMEOUTS = (
    ("cas_contention_timeout", "cas_contention_timeout_in_ms"),
    ("write_request_timeout", "write_request_timeout_in_ms"),
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|m|h|d)?")
_UNIT_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86_400.0,
}


def cassandra_duration_s(value: str) -> float:
    """A duration as Cassandra 4.1+ shows its settings ("5000ms", "10s"; no unit: ms)."""
    found = _DURATION.fullmatch(value.strip())
    if found is None:
        raise ValueError(f"not a duration: {value!r}")
    number, unit = found.groups()
    return float(number) * _UNIT_S[unit or "ms"]


def read_cas_bound(session: Session) -> float:
    """How long a coordinator may work on an LWT: `cas_contention_timeout` plus
    `write_request_timeout`, as the connected node reports them (`system_views.settings`;
    the nodes of a cluster are to share them). Cassandra's defaults when it cannot tell
    (no virtual tables before 4.0, a value not understood), logged."""
    names = [name for pair in _CAS_TIMEOUTS for name in pair]
    try:
        rows = session.execute(
            "SELECT name, value FROM system_views.settings WHERE name IN %s",
            (ValueSequence(names),),
        )
        values = {row.name: row.value for row in rows}
        return sum(_seconds(values, *pair) for pair in _CAS_TIMEOUTS)
    except (DriverException, NoHostAvailable, ConnectionException, ValueError) as error:
        log.warning(
            "the cluster's CAS timeouts could not be read (%s); settling as though they were"
            " Cassandra's defaults (%.0f s)",
            error,
            aio.DEFAULT_CAS_BOUND_S,
        )
        return aio.DEFAULT_CAS_BOUND_S


def _seconds(values: dict[str, str], name: str, name_in_ms: str) -> float:
    # The older name's value is a bare number of milliseconds: the same reading.
    value = values.get(name, values.get(name_in_ms))
    if value is None:
        raise ValueError(f"{name} is not among the node's settings")
    return cassandra_duration_s(value)
