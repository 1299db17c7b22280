"""CPU seconds of the processes a bench run involves, read from Linux /proc."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cassandra_pid() -> int:
    return int(subprocess.check_output(["pgrep", "-f", "CassandraDaemon"]).split()[0])


class CpuMeter:
    """CPU used by each named process between `start()` and `stop()`."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        self._pids = dict(pids)
        self._before: dict[str, float] = {}

    def start(self) -> None:
        self._before = {role: process_cpu_s(pid) for role, pid in self._pids.items()}

    def stop(self) -> dict[str, float]:
        return {role: process_cpu_s(pid) - self._before[role] for role, pid in self._pids.items()}
