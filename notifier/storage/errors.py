"""Which driver errors mean "storage unavailable now, retry later"."""

from __future__ import annotations

from cassandra import DriverException
from cassandra.cluster import NoHostAvailable

STORAGE_ERRORS: tuple[type[Exception], ...] = (DriverException, NoHostAvailable)
