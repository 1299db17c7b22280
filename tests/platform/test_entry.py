"""The `reminders` console script handles SIGTERM from its first instant: a container's
PID 1 ignores a signal it has no handler for, and a pod deleted while the commands were
still being imported (about a second) ran until its grace period's SIGKILL."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A SIGTERM sent from a thread while the main thread is still importing the commands.
_TERMINATED_WHILE_IMPORTING = """
import os, signal, sys, threading
sys.argv = ["reminders", "dispatch"]
from reminders_svc import entry
threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
sys.exit(entry.main())
"""


def test_the_console_script_is_the_entry_that_handles_sigterm_first() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["reminders"] == "reminders_svc.entry:main"


def test_a_sigterm_while_the_commands_are_imported_ends_the_process_at_once_with_143() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", _TERMINATED_WHILE_IMPORTING],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Without a handler (as PID 1 would ignore it), the default action: killed, -15.
    assert finished.returncode == 143, finished.stderr


def test_the_entry_imports_nothing_slow_before_its_handler_is_in() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; import reminders_svc.entry;"
            " print(' '.join(m for m in ('grpc', 'cassandra', 'google.protobuf')"
            " if m in sys.modules))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert loaded.stdout.strip() == ""
