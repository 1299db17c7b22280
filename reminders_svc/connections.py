"""gRPC connection options shared by the project's servers and its own clients.

A gRPC channel keeps one long-lived HTTP/2 connection per address, so behind a
Kubernetes Service its calls all go to the pod it reached first, and pods added later
get none of them. So servers close each connection after a while (calls in flight get a
grace to finish; the client reconnects and resolves its target again), and the project's
clients spread their calls over every address the target resolves to (a headless
Service gives one per pod).
"""

from __future__ import annotations

MAX_METADATA_BYTES = 16 * 1024

# The grace outlasts any call a client makes (the longest: DeleteUserData, 120 s in the
# API's service config; a SendBatch 10 s), so a closing connection never cuts one off (a
# purge of a user with thousands of reminders, cut at 30 s, answered UNAVAILABLE).
CONNECTION_AGE_GRACE_S = 130
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_connection_age_ms", 5 * 60 * 1000),
    ("grpc.max_connection_age_grace_ms", CONNECTION_AGE_GRACE_S * 1000),
    # gRPC shares a port with any process that also asks (SO_REUSEPORT): a second API, or
    # a stack's leftover child, would take half the calls unseen instead of failing to start.
    ("grpc.so_reuseport", 0),
    # One bound for a call's metadata (its headers: mostly the bearer token), not gRPC's
    # soft 8 KiB and hard 16 KiB, between which it refuses calls at random.
    ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
)

# A server back after an outage is reached within seconds: gRPC's own reconnect backoff
# grows to 2 minutes, and rings held back by a notifier outage waited that much more.
MAX_RECONNECT_BACKOFF_MS = 2000

CLIENT_OPTIONS: tuple[tuple[str, str | int], ...] = (
    ("grpc.lb_policy_name", "round_robin"),
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
)
