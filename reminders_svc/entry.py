"""The `reminders` console script: SIGTERM is handled from its first instant.

A container's PID 1 ignores a signal it has no handler for, and importing the commands
(grpc, the Cassandra driver, protobuf) takes about a second: a pod deleted meanwhile ran
until its termination grace's SIGKILL (110 s for a dispatcher). Nothing is held yet, so a
SIGTERM then ends the process at once, with the code a shell reports for it; each command
puts its own handling in place of this one as it starts.
"""

from __future__ import annotations

import os
import signal


def _exit_at_once(signum: int, frame: object) -> None:
    os._exit(128 + signum)


def main() -> int:
    signal.signal(signal.SIGTERM, _exit_at_once)
    from reminders_svc.cli import main as run_command

    return run_command()
