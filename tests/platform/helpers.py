"""Small helpers for platform tests: run the `reminders` CLI as a user would."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REMINDERS = str(Path(sys.executable).with_name("reminders"))


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [REMINDERS, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# Below Linux's ephemeral range (32768-60999 by default): a port the kernel picks for
# bind(0) is also one it may give an outgoing connection (a driver's to Cassandra) before
# the process meant to listen on it has started, which then fails "address in use".
_LISTEN_PORTS = range(20000, 32768)


def _own_listen_ports() -> range:
    """This test process's share of `_LISTEN_PORTS`: parallel workers (pytest-xdist)
    pick from disjoint ranges, so none takes a port another picked and is yet to listen on
    (a stack picks its ports, then migrates a keyspace for seconds before starting)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = len(_LISTEN_PORTS) // max(workers, 1)
    start = _LISTEN_PORTS.start + int(worker.removeprefix("gw")) % max(workers, 1) * share
    return range(start, start + share)


# Ports handed out by this process: a stack picks several before any of its processes
# listens, so a port free now may be one picked a moment ago.
_ISSUED: set[int] = set()


def free_port() -> int:
    """A port free now, and not handed out before by this process, for a process about to
    listen on it."""
    ports = _own_listen_ports()
    while True:
        port = random.choice(ports)
        if port in _ISSUED:
            if len(_ISSUED) >= len(ports):
                _ISSUED.clear()  # every one handed out once: start over
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ISSUED.add(port)
        return port
