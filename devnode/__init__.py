"""Local development: a Cassandra node for development, tests and CI, assembled from Maven
Central, the whole stack in the foreground, and the demo.

Not deployed: production runs against a real cluster (see k8s/).
"""

from devnode.node import (
    CASSANDRA_VERSION,
    NodeError,
    NodeSettings,
    NodeStatus,
    ensure_distribution,
    paxos_tracker_files,
    reset,
    start,
    status,
    stop,
)

__all__ = [
    "CASSANDRA_VERSION",
    "NodeError",
    "NodeSettings",
    "NodeStatus",
    "ensure_distribution",
    "paxos_tracker_files",
    "reset",
    "start",
    "status",
    "stop",
]
