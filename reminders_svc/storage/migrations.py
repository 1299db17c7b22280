"""Versioned CQL schema files applied once each, safely from many pods at once.

Rules:
- Files are ``cql/NNNN_name.cql``; NNNN orders them. A file is immutable once applied:
  its checksum is recorded and a changed file is an error, never silently re-applied.
- Every statement in a file is idempotent (``IF NOT EXISTS``), so a file interrupted
  half way is safely re-run whole.
- One migrator at a time holds a lock row taken by LWT with a TTL (so a crashed pod
  cannot hold it forever); the others wait, then find nothing left to do.
- The two bookkeeping tables are created with fixed table ids, so concurrent
  ``CREATE TABLE IF NOT EXISTS`` from several pods converge on one schema.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from cassandra import DriverException, InvalidRequest
from cassandra.cluster import Session
from cassandra.protocol import ErrorMessage
from cassandra.query import SimpleStatement

from reminders_svc.config import CassandraSettings, ConfigError, Replication
from reminders_svc.storage.errors import STORAGE_ERRORS, StorageUnavailable
from reminders_svc.storage.session import serial_read_level

_FILE_PATTERN = re.compile(r"^(\d{4})_([a-z0-9_]+)\.cql$")
log = logging.getLogger(__name__)

_LOCK_NAME = "migrate"
_LOCK_TTL_S = 300
# Namespace for deterministic table ids (uuid5 of keyspace.table).
_TABLE_ID_NAMESPACE = uuid.UUID("6f1e4c1a-8a55-4f43-9a53-1f8c1b6e2d10")


class MigrationError(RuntimeError):
    """The schema files or the recorded history are inconsistent, or the lock was lost."""


class MigrationStopped(MigrationError):
    """Asked to stop (`migrate(stopping=...)`): given up where that is safe, the schema lock
    released."""


class SchemaBehind(StorageUnavailable):
    """The database lacks schema files this release ships: `reminders migrate` has not run
    (or not finished) since the release. A storage error, so processes wait not ready."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    checksum: str
    statements: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True)
class MigrationReport:
    applied: tuple[str, ...] = ()
    already_applied: tuple[str, ...] = ()


def default_cql_dir() -> Path:
    """REMINDERS_CQL_DIR, else the files packaged in the wheel, else the repo's cql/."""
    override = os.environ.get("REMINDERS_CQL_DIR")
    if override:
        return Path(override)
    packaged = resources.files("reminders_svc").joinpath("_cql")
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "cql"


def split_statements(text: str) -> tuple[str, ...]:
    """Split CQL text on ';' outside quotes, dropping `--` and `//` line comments."""
    statements: list[str] = []
    current: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        char = text[i]
        if quote is None and text.startswith(("--", "//"), i):
            newline = text.find("\n", i)
            i = len(text) if newline == -1 else newline
            continue
        if char in "'\"":
            quote = None if quote == char else (char if quote is None else quote)
        if char == ";" and quote is None:
            statements.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    statements.append("".join(current))
    return tuple(" ".join(s.split()) for s in statements if s.strip())


def load_migrations(directory: Path) -> tuple[Migration, ...]:
    """The schema files in `directory`, in order. A directory missing or empty is bad
    configuration (`--cql-dir`, REMINDERS_CQL_DIR), which no retry mends."""
    if not directory.is_dir():
        raise ConfigError(f"{directory}: no such directory of schema files")
    migrations: list[Migration] = []
    for path in sorted(directory.glob("*.cql")):
        match = _FILE_PATTERN.match(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: schema files are named NNNN_lowercase_name.cql")
        raw = path.read_bytes()
        migrations.append(
            Migration(
                version=int(match.group(1)),
                name=match.group(2),
                checksum=hashlib.sha256(raw).hexdigest(),
                statements=split_statements(raw.decode()),
            )
        )
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two schema files share a version number in {directory}")
    if not migrations:
        raise ConfigError(f"no schema files in {directory}")
    return tuple(migrations)


def _table_id(keyspace: str, table: str) -> uuid.UUID:
    return uuid.uuid5(_TABLE_ID_NAMESPACE, f"{keyspace}.{table}")


def _bootstrap(session: Session, settings: CassandraSettings) -> None:
    ks = settings.keyspace
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {settings.replication.cql()}"
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {ks}.schema_migrations ("
        " version int PRIMARY KEY, name text, checksum text, applied_at timestamp,"
        f" applied_by text) WITH ID = {_table_id(ks, 'schema_migrations')}"
    )
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {ks}.schema_migration_lock ("
        " name text PRIMARY KEY, owner text, acquired_at timestamp)"
        f" WITH ID = {_table_id(ks, 'schema_migration_lock')}"
    )


def replication_warnings(
    session: Session, settings: CassandraSettings, development: bool
) -> list[str]:
    """What an operator must hear of the keyspace's replication: the setting is applied
    only when the keyspace is created, so a keyspace made with another (a first run
    without it: one replica) keeps it silently; and one replica outside development."""
    ks = settings.keyspace
    row = session.execute(
        "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s", (ks,)
    ).one()
    if row is None:
        return []
    found: dict[str, str] = dict(row.replication)
    warnings = []
    if not settings.replication.matches(found):
        warnings.append(
            f"keyspace {ks} is replicated {found}, not as REMINDERS_CASSANDRA_REPLICATION"
            " says: that setting applies only when the keyspace is created. To change it:"
            f" ALTER KEYSPACE {ks} WITH replication = {settings.replication.cql()}, then a"
            " full repair (nodetool repair --full) on every node"
        )
    if Replication.strategy_of(found) == "SimpleStrategy" and not development:
        warnings.append(
            f"keyspace {ks} uses SimpleStrategy outside REMINDERS_ENV=dev: production needs"
            " NetworkTopologyStrategy with a factor per data centre (3 for LOCAL_QUORUM to"
            " survive a node)"
        )
    return warnings


class _Lock:
    def __init__(self, session: Session, keyspace: str, owner: str) -> None:
        self._session = session
        self._ks = keyspace
        self.owner = owner

    def acquire(self, timeout_s: float, stopping: threading.Event) -> None:
        started = time.monotonic()
        said = False
        while True:
            if stopping.is_set():
                raise MigrationStopped("stopped while waiting for the schema lock")
            row = self._session.execute(
                f"INSERT INTO {self._ks}.schema_migration_lock (name, owner, acquired_at)"
                " VALUES (%s, %s, toTimestamp(now())) IF NOT EXISTS USING TTL %s",
                (_LOCK_NAME, self.owner, _LOCK_TTL_S),
            ).one()
            if row.applied:
                return
            if time.monotonic() - started > timeout_s:
                raise MigrationError(
                    f"another migrator ({row.owner}) has held the schema lock for over "
                    f"{timeout_s:.0f}s; it expires by itself {_LOCK_TTL_S}s after it was taken"
                )
            if not said:  # a start held up here says why
                log.info("waiting for the schema lock, held by %s", row.owner)
                said = True
            stopping.wait(0.5)

    def renew(self) -> None:
        row = self._session.execute(
            f"UPDATE {self._ks}.schema_migration_lock USING TTL %s SET owner = %s"
            " WHERE name = %s IF owner = %s",
            (_LOCK_TTL_S, self.owner, _LOCK_NAME, self.owner),
        ).one()
        if not row.applied:
            raise MigrationError("lost the schema lock (it expired); run migrate again")

    def release(self) -> None:
        self._session.execute(
            f"DELETE FROM {self._ks}.schema_migration_lock WHERE name = %s IF owner = %s",
            (_LOCK_NAME, self.owner),
        )


def _recorded(session: Session, keyspace: str) -> dict[int, tuple[str, str]]:
    statement = SimpleStatement(
        f"SELECT version, name, checksum FROM {keyspace}.schema_migrations",
        # At the LWTs' serial level: a SERIAL read where they are LOCAL_SERIAL fails with
        # a data centre gone, and every pod restarting in the others would wait NOT_SERVING.
        consistency_level=serial_read_level(session),
    )
    return {row.version: (row.name, row.checksum) for row in session.execute(statement)}


def require_current_schema(
    session: Session, keyspace: str, migrations: Sequence[Migration] | None = None
) -> None:
    """Raise SchemaBehind unless every schema file this release ships has been applied.

    Processes call it before preparing their statements: a pod rolled out before the
    migrate Job finished then waits not ready and tries again, rather than failing for
    good on a column or table its statements name and the database does not have yet.
    """
    shipped = load_migrations(default_cql_dir()) if migrations is None else migrations
    try:
        recorded = _recorded(session, keyspace)
    except InvalidRequest:
        # A keyspace made by hand, or one `reminders migrate` is creating right now.
        raise SchemaBehind(
            f"keyspace {keyspace!r} has no schema_migrations table: run `reminders migrate`"
        ) from None
    for migration in shipped:
        _check_recorded_as_shipped(migration, recorded)
    missing = [m.label for m in shipped if m.version not in recorded]
    if missing:
        raise SchemaBehind(
            f"keyspace {keyspace!r} lacks schema files {', '.join(missing)} of this release:"
            " run `reminders migrate`"
        )


def _check_recorded_as_shipped(migration: Migration, recorded: dict[int, tuple[str, str]]) -> None:
    """MigrationError if the database applied another file under `migration`'s version (a
    release of another branch), or this file as it was before an edit: waiting cannot
    mend either."""
    if migration.version not in recorded:
        return
    name, checksum = recorded[migration.version]
    if name != migration.name:
        raise MigrationError(
            f"schema version {migration.version} was applied as {name}, but this release"
            f" ships {migration.label}: the database was migrated by another release's files"
        )
    if checksum != migration.checksum:
        raise MigrationError(
            f"{migration.label}.cql changed after it was applied (as {name}); "
            "applied files are immutable: add a new file instead"
        )


def migrate(
    session: Session,
    settings: CassandraSettings,
    migrations: Sequence[Migration],
    *,
    owner: str | None = None,
    lock_timeout_s: float = 600.0,
    stopping: threading.Event | None = None,
    ahead_ok: bool = False,
) -> MigrationReport:
    """Apply the migrations not yet recorded, in order, under the schema lock. Once
    `stopping` is set it gives up (MigrationStopped) at the next safe point: while waiting
    for the lock, or between two statements, releasing the lock.

    A database with versions `migrations` lacks (a newer release's) is refused, unless
    `ahead_ok` and every one of `migrations` is applied: a process rolled back to an
    older release serves on the newer schema, as each release's schema allows."""
    stopping = stopping or threading.Event()
    owner = owner or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    _bootstrap(session, settings)
    lock = _Lock(session, settings.keyspace, owner)
    lock.acquire(lock_timeout_s, stopping)
    applied: list[str] = []
    already: list[str] = []
    try:
        recorded = _recorded(session, settings.keyspace)
        for migration in migrations:
            _check_recorded_as_shipped(migration, recorded)
        known = {m.version for m in migrations}
        unknown = sorted(set(recorded) - known)
        if unknown and not (ahead_ok and known <= set(recorded)):
            raise MigrationError(
                f"the database has schema versions {unknown} that this release does not know: "
                "is an older release migrating a newer schema?"
            )
        if unknown:
            log.warning("the schema is ahead of this release (versions %s): serving on it", unknown)
        session.set_keyspace(settings.keyspace)
        for migration in migrations:
            if migration.version in recorded:
                already.append(migration.label)
                continue
            for number, statement in enumerate(migration.statements, start=1):
                where = f"{migration.label}.cql, statement {number} ({statement[:60]}...)"
                if stopping.is_set():  # the statements are safe to re-apply on the next run
                    raise MigrationStopped(f"stopped before {where}")
                # Per statement: a file of slow statements must not outlast the lock's TTL.
                lock.renew()
                try:
                    result = session.execute(statement, timeout=120)
                except (DriverException, ErrorMessage) as error:
                    raise MigrationError(f"{where}: {error}") from error
                if not result.response_future.is_schema_agreed:
                    # The next statement or a process could see a table not everywhere yet.
                    raise MigrationError(
                        f"{where}: the nodes did not agree on the schema in time; check "
                        "the cluster (nodetool describecluster), then run migrate again "
                        "(statements are safe to re-apply; a file is recorded once all ran)"
                    )
            session.execute(
                "INSERT INTO schema_migrations (version, name, checksum, applied_at, applied_by)"
                " VALUES (%s, %s, %s, toTimestamp(now()), %s) IF NOT EXISTS",
                (migration.version, migration.name, migration.checksum, owner),
            )
            applied.append(migration.label)
    except BaseException:
        _release_after_failure(lock)
        raise
    lock.release()
    return MigrationReport(tuple(applied), tuple(already))


def _release_after_failure(lock: _Lock) -> None:
    """Release the lock on the way out of a failure, whose error stays the one told: a
    release failing too (storage gone) leaves the lock to expire by its TTL."""
    try:
        lock.release()
    # NoHostAvailable and a broken connection are not DriverExceptions: STORAGE_ERRORS.
    except (*STORAGE_ERRORS, DriverException, ErrorMessage, OSError) as error:
        log.warning(
            "the schema lock could not be released (%s): it expires by itself within %d s",
            type(error).__name__,
            _LOCK_TTL_S,
        )
