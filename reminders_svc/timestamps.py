"""Instants as protobuf Timestamps, at every gRPC boundary (the API, the notifier, the
dispatcher's hand-off): one conversion, so each writes the same instant the same way."""

from __future__ import annotations

from datetime import datetime
from typing import overload

from google.protobuf.timestamp_pb2 import Timestamp


@overload
def timestamp(instant: datetime) -> Timestamp: ...
@overload
def timestamp(instant: datetime | None) -> Timestamp | None: ...
def timestamp(instant: datetime | None) -> Timestamp | None:
    """`instant` as a Timestamp (a naive one is UTC, as the Cassandra driver reads them);
    None (a field left unset) for None."""
    if instant is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(instant)  # an aware instant is converted to UTC
    return stamp
