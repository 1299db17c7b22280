"""`reminders stack`: the whole service on this machine, in the foreground.

Starts the local Cassandra node (reused if running), applies the schema, then runs the
API, the reference notifier (recording adapter) and one dispatcher as child processes
with REMINDERS_ENV=dev, their output interleaved and prefixed. Ctrl-C (or SIGTERM) stops
them all gracefully, the dispatcher first so it releases its claims and leases.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from devnode.node import NodeError, NodeSettings, start

# Started in this order, stopped in reverse.
_SERVICES: tuple[tuple[str, Sequence[str]], ...] = (
    ("api", ("serve-api",)),
    ("notifier", ("notifier",)),
    ("dispatch", ("dispatch",)),
)


def _relay(name: str, stream: IO[bytes]) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"[{name}] {line.decode(errors='replace')}")
        sys.stdout.flush()


def run_stack() -> int:
    try:
        pid, started = start(NodeSettings.from_env())
    except NodeError as error:
        print(f"reminders stack: {error}", file=sys.stderr)
        return 1
    print(f"cassandra {'started' if started else 'running'} (pid {pid})")
    reminders = str(Path(sys.executable).with_name("reminders"))
    env = {
        "REMINDERS_ENV": "dev",
        # Nothing on a development machine needs shielding from a catch-up: a stack stopped
        # overnight reads its 16 hours of empty minutes (64 parts) in a minute or two, where
        # the default pace takes five.
        "REMINDERS_DISPATCH_CATCH_UP_MINUTES_PER_S": "2000",
        **os.environ,
    }
    if subprocess.run([reminders, "migrate"], env=env, check=False).returncode != 0:
        return 1
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        for name, args in _SERVICES:
            child = subprocess.Popen(
                [reminders, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            assert child.stdout is not None
            threading.Thread(target=_relay, args=(name, child.stdout), daemon=True).start()
            children.append((name, child))
        print("stack up: API 127.0.0.1:50051, notifier 127.0.0.1:50061; Ctrl-C stops it")
        while not stop.is_set():
            for name, child in children:
                if child.poll() is not None:
                    print(
                        f"reminders stack: {name} exited with {child.returncode}", file=sys.stderr
                    )
                    stop.set()
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for _, child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    child.kill()
    return 0
