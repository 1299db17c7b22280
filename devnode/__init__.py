"""A local Cassandra node for development, tests and CI, assembled from Maven Central.

Not deployed: production runs against a real cluster (see k8s/). This package only
fetches, configures, starts, stops and reports on one node on loopback.
"""

from devnode.node import (
    CASSANDRA_VERSION,
    NodeError,
    NodeSettings,
    NodeStatus,
    ensure_distribution,
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
    "start",
    "status",
    "stop",
]
