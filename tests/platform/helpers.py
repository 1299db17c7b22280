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


def free_port() -> int:
    """A port free now, for a process about to listen on it."""
    while True:
        port = random.choice(_LISTEN_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
