"""Fetch, configure, start, stop and inspect the local Cassandra node.

The node is `cassandra-all` plus its runtime dependencies, resolved by Maven into a cache
outside the repository once per version, and started as ``CassandraDaemon`` with a config
written from ``resources/``. State (data, logs, pid) lives in a node home directory, so a
second ``start`` finds and reuses the running node.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from reminders_svc.config import CASSANDRA_PREFIX, Env

# The newest 5.0.x that Maven Central served when this was pinned (2026-11-30).
CASSANDRA_VERSION = "5.0.9"
_SUPPORTED_JAVA = (11, 17)
_COMPLETE_MARKER = ".complete"
# Above this many, loading them takes the node's start past a minute (measured: 14,000
# files, about 170 s on 2 cores; a fresh node starts in under 10 s).
SLOW_START_TRACKER_FILES = 3000


class NodeError(RuntimeError):
    """The node could not be fetched, started or reached; the message says why and what to do."""


@dataclass(frozen=True)
class NodeSettings:
    home: Path
    cache: Path
    host: str = "127.0.0.1"
    native_port: int = 9042
    storage_port: int = 7000
    heap: str = "1G"
    # Generous: a node that is alive is loading (a development node's start slows as the
    # suite's dropped tables pile up, see paxos_tracker_files); only a hung one hits this.
    startup_timeout_s: float = 600.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> NodeSettings:
        """Raises ConfigError, naming the variable, for a malformed or out-of-range value."""
        env = os.environ if environ is None else environ
        node = Env(env, "REMINDERS_NODE_")
        state = Path(env.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
        cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return cls(
            home=Path(node.raw("HOME") or state / "reminders" / "cassandra-node"),
            cache=Path(node.raw("CACHE") or cache / "reminders" / "cassandra"),
            # Not Env.port: a node cannot listen on "any free port" (0), its clients must
            # know where it is.
            native_port=node.integer("PORT", cls.native_port, low=1, high=65535),
            storage_port=node.integer("STORAGE_PORT", cls.storage_port, low=1, high=65535),
            heap=node.text("HEAP", cls.heap),
            startup_timeout_s=node.number(
                "STARTUP_TIMEOUT", cls.startup_timeout_s, low=1, high=86400, unit=" s"
            ),
        )

    def client_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """What the node's clients (migrate, the stack's services, the tests) must add to
        `environ` to reach this node: they read REMINDERS_CASSANDRA_PORT, the node listens
        on REMINDERS_NODE_PORT, so a node moved off a taken 9042 takes its clients along
        unless they were pointed elsewhere on purpose."""
        if Env(environ, CASSANDRA_PREFIX).raw("PORT") is not None:
            return {}
        if Env(environ, "REMINDERS_NODE_").raw("PORT") is None:
            return {}
        return {"REMINDERS_CASSANDRA_PORT": str(self.native_port)}

    @property
    def lib_dir(self) -> Path:
        return self.cache / CASSANDRA_VERSION / "lib"

    @property
    def pid_file(self) -> Path:
        return self.home / "cassandra.pid"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def paxos_tracker_dir(self) -> Path:
        return self.home / "data" / "system" / "_paxos_repair_state"


@dataclass(frozen=True)
class NodeStatus:
    running: bool
    pid: int | None
    cql_ready: bool
    rss_bytes: int | None
    version: str


def _java_binary() -> Path:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is not None and candidate.exists():
        return candidate
    found = shutil.which("java")
    if found is None:
        raise NodeError(
            "Java not found: Cassandra 5.0 needs Java 11 or 17. Install OpenJDK 17 "
            "(e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    return Path(found)


def _java_major(java: Path) -> int:
    out = subprocess.run([str(java), "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        raise NodeError(f"could not read the Java version from `{java} -version`: {out.stderr!r}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _checked_java() -> Path:
    java = _java_binary()
    major = _java_major(java)
    if major not in _SUPPORTED_JAVA:
        raise NodeError(
            f"{java} is Java {major}; Cassandra {CASSANDRA_VERSION} runs on Java 11 or 17. "
            "Set JAVA_HOME to a JDK 17."
        )
    return java


def ensure_distribution(settings: NodeSettings) -> Path:
    """Resolve cassandra-all and its runtime jars into the cache, once per version."""
    lib = settings.lib_dir
    if (lib / _COMPLETE_MARKER).exists():
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise NodeError(
            f"Maven (mvn) not found: it is needed once to fetch Cassandra {CASSANDRA_VERSION} "
            f"into {settings.cache}. Install it (e.g. `apt-get install maven`)."
        )
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent, prefix="fetch-") as tmp:
        pom = Path(tmp) / "pom.xml"
        template = resources.files("devnode").joinpath("resources/pom.xml").read_text()
        pom.write_text(template.replace("@CASSANDRA_VERSION@", CASSANDRA_VERSION))
        staged = Path(tmp) / "lib"
        result = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staged}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
            raise NodeError(f"Maven could not fetch Cassandra {CASSANDRA_VERSION}:\n{tail}")
        (staged / _COMPLETE_MARKER).write_text(CASSANDRA_VERSION)
        # A concurrent fetch may have won; either copy is complete, so keep the first.
        if not (lib / _COMPLETE_MARKER).exists():
            shutil.rmtree(lib, ignore_errors=True)
            staged.rename(lib)
    return lib


def _render(name: str, settings: NodeSettings) -> str:
    text = resources.files("devnode").joinpath(f"resources/{name}").read_text()
    values = {
        "@HOST@": settings.host,
        "@NATIVE_PORT@": str(settings.native_port),
        "@STORAGE_PORT@": str(settings.storage_port),
        "@HOME@": str(settings.home),
    }
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


def _write_config(settings: NodeSettings) -> Path:
    conf = settings.home / "conf"
    for sub in ("conf", "data", "commitlog", "saved_caches", "hints", "cdc_raw", "logs"):
        (settings.home / sub).mkdir(parents=True, exist_ok=True)
    (conf / "cassandra.yaml").write_text(_render("cassandra.yaml", settings))
    (conf / "logback.xml").write_text(_render("logback.xml", settings))
    return conf


def _jvm_options() -> list[str]:
    text = resources.files("devnode").joinpath("resources/jvm17.options").read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _read_pid(settings: NodeSettings) -> int | None:
    """The pid of this home's running node, or None. A pid file outlives its node (a
    machine restarted, a session ended) and pids are reused: the pid counts only while
    it is this home's CassandraDaemon, never a process that took the number since."""
    try:
        pid = int(settings.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if _alive(pid) and _is_node_of(pid, settings.home):
        return pid
    settings.pid_file.unlink(missing_ok=True)
    return None


def _is_node_of(pid: int, home: Path) -> bool:
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return (
        b"org.apache.cassandra.service.CassandraDaemon" in arguments
        and f"-Dcassandra.storagedir={home}".encode() in arguments
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not a running node.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def _cql_ready(settings: NodeSettings) -> bool:
    """True when the native protocol answers a real query (not just an open socket)."""
    from cassandra.cluster import Cluster  # imported here: slow, and only needed to start

    cluster = Cluster(
        [settings.host], port=settings.native_port, connect_timeout=2, control_connection_timeout=2
    )
    try:
        session = cluster.connect()
        session.execute("SELECT release_version FROM system.local", timeout=5)
    except Exception:  # any failure to connect or query means "not ready yet"
        return False
    finally:
        cluster.shutdown()
    return True


def log_tail(settings: NodeSettings, lines: int = 30) -> str:
    chunks: list[str] = []
    for name in ("system.log", "stdout.log"):
        path = settings.log_dir / name
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            chunks.append(f"--- {path} (last {len(tail)} lines) ---\n" + "\n".join(tail))
    return "\n".join(chunks) or f"(no log in {settings.log_dir})"


def start(settings: NodeSettings, notice: Callable[[str], None] = print) -> tuple[int, bool]:
    """Start the node (or reuse the one running); returns (pid, started_now).

    `notice` hears, before a start that will be slow, why and what to do about it.
    """
    running = _read_pid(settings)
    if running is not None:
        if not _wait_ready(settings, running):
            raise NodeError(
                f"the node (pid {running}) runs but CQL on {settings.host}:"
                f"{settings.native_port} does not answer.\n{log_tail(settings)}"
            )
        return running, False
    java = _checked_java()
    for port, what in ((settings.native_port, "CQL"), (settings.storage_port, "storage")):
        if _port_in_use(settings.host, port):
            raise NodeError(
                f"port {port} ({what}) on {settings.host} is taken by another process; stop it "
                "or choose other ports with REMINDERS_NODE_PORT / REMINDERS_NODE_STORAGE_PORT."
            )
    tracker_files = paxos_tracker_files(settings)
    if tracker_files > SLOW_START_TRACKER_FILES:
        notice(
            f"this node's start will be slow: Cassandra loads {tracker_files} Paxos tracker "
            "files, most left by dropped keyspaces (the test suite creates and drops many). "
            "Its data is disposable: `reminders cassandra reset` deletes it."
        )
    lib = ensure_distribution(settings)
    conf = _write_config(settings)
    command = [
        str(java),
        f"-Xms{settings.heap}",
        f"-Xmx{settings.heap}",
        *_jvm_options(),
        f"-Dcassandra.config=file://{conf / 'cassandra.yaml'}",
        f"-Dlogback.configurationFile=file://{conf / 'logback.xml'}",
        f"-Dcassandra.logdir={settings.log_dir}",
        f"-Dcassandra.storagedir={settings.home}",
        "-Dcassandra-foreground=yes",
        "-cp",
        f"{conf}:{lib}/*",
        "org.apache.cassandra.service.CassandraDaemon",
    ]
    with (settings.log_dir / "stdout.log").open("ab") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=settings.home,
            start_new_session=True,
        )
    settings.pid_file.write_text(str(process.pid))
    if not _wait_ready(settings, process.pid, process):
        code = process.poll()
        stop(settings)
        why = (
            f"within {settings.startup_timeout_s:.0f}s"
            if code is None
            else f"(the process exited with code {code})"
        )
        raise NodeError(f"Cassandra did not come up {why}.\n{log_tail(settings)}")
    return process.pid, True


def _wait_ready(
    settings: NodeSettings, pid: int, process: subprocess.Popen[bytes] | None = None
) -> bool:
    deadline = time.monotonic() + settings.startup_timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return False
        if process is None and not _alive(pid):
            return False
        if _cql_ready(settings):
            return True
        time.sleep(1.0)
    return False


def stop(settings: NodeSettings, timeout_s: float = 60.0) -> bool:
    """Stop the node; returns False when none was running."""
    pid = _read_pid(settings)
    if pid is None:
        settings.pid_file.unlink(missing_ok=True)
        return False
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)
    settings.pid_file.unlink(missing_ok=True)
    return True


def paxos_tracker_files(settings: NodeSettings) -> int:
    """How many Paxos tracker files the node will load when it starts.

    Cassandra 5.0 keeps these files for every table that ever ran an LWT, dropped ones
    included, and at start lists the whole directory once per table it names: the start
    of a node whose tests created and dropped thousands of keyspaces takes minutes.
    """
    try:
        return sum(1 for _ in settings.paxos_tracker_dir.iterdir())
    except FileNotFoundError:
        return 0


def reset(settings: NodeSettings) -> bool:
    """Stop the node and delete its home (data, logs, config); False when there was none.
    A home that holds anything but a node's (REMINDERS_NODE_HOME set to a wrong directory)
    is refused, not deleted."""
    if not settings.home.exists():
        stop(settings)
        return False
    others = sorted(entry.name for entry in settings.home.iterdir() if not _of_a_node(entry.name))
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise NodeError(
            f"{settings.home} is not only a node's home (it holds {shown}): nothing deleted;"
            " check REMINDERS_NODE_HOME"
        )
    stop(settings)
    shutil.rmtree(settings.home)
    return True


# What a node's home holds: `_write_config`'s directories and the pid file, and what the
# JVM leaves in its working directory when it crashes or runs out of memory.
_NODE_HOME_ENTRIES = frozenset(
    {"conf", "data", "commitlog", "saved_caches", "hints", "cdc_raw", "logs", "cassandra.pid"}
)
_JVM_LEFTOVERS = ("hs_err_pid*.log", "java_pid*.hprof", "replay_pid*.log")


def _of_a_node(name: str) -> bool:
    return name in _NODE_HOME_ENTRIES or any(fnmatch.fnmatch(name, p) for p in _JVM_LEFTOVERS)


def _rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        return None
    return None


def status(settings: NodeSettings) -> NodeStatus:
    pid = _read_pid(settings)
    return NodeStatus(
        running=pid is not None,
        pid=pid,
        cql_ready=pid is not None and _cql_ready(settings),
        rss_bytes=None if pid is None else _rss_bytes(pid),
        version=CASSANDRA_VERSION,
    )
