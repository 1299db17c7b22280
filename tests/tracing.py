"""What the node reports scanning for one read: its "Read N live rows and M tombstone
cells" trace events. A tombstone cell is scanned by every read of its partition until
compaction drops it past gc_grace_seconds; Cassandra warns past 1,000 in one read."""

from __future__ import annotations

from typing import Any

from cassandra.cluster import Session


def scanned(session: Session, query: str, params: tuple[Any, ...]) -> list[str]:
    traced = session.execute(query, params, trace=True)
    events = [event.description for event in traced.get_query_trace().events]
    return [event for event in events if " live rows and " in event]
