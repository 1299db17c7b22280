"""Hand-off to the Notification Service: one SendBatch, one answer per ring."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from genproto.notification.v1 import notification_pb2 as npb
from genproto.notification.v1 import notification_pb2_grpc as npb_grpc
from reminders_svc.connections import CLIENT_OPTIONS
from reminders_svc.tls import ClientTls

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    RETRYABLE = "retryable"


@dataclass(frozen=True)
class Ring:
    key: str
    user_id: str
    text: str
    due: datetime
    expires: datetime


@dataclass(frozen=True)
class Answer:
    outcome: Outcome
    reason: str


_OUTCOMES = {
    npb.SendResult.OUTCOME_ACCEPTED: Outcome.ACCEPTED,
    npb.SendResult.OUTCOME_DUPLICATE: Outcome.DUPLICATE,
    npb.SendResult.OUTCOME_REJECTED: Outcome.REJECTED,
    npb.SendResult.OUTCOME_RETRYABLE: Outcome.RETRYABLE,
}


def _stamp(instant: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(instant)
    return stamp


class NotifierClient:
    """One channel to the notifier: plaintext, or TLS (mutual when `tls` holds a client
    certificate). A call the notifier refuses (a handshake failing, no client certificate)
    fails like any other: every ring of it is answered RETRYABLE."""

    def __init__(
        self, target: str, timeout_s: float = 10.0, *, tls: ClientTls | None = None
    ) -> None:
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS)
        else:
            self._channel = grpc.aio.secure_channel(
                target, tls.credentials(), options=(*CLIENT_OPTIONS, *tls.channel_options())
            )
        log.info(
            "notifier at %s (tls=%s, mtls=%s, server_name=%s)",
            target,
            tls is not None,
            tls is not None and tls.mutual,
            tls.server_name if tls is not None else None,
        )
        self._stub = npb_grpc.NotificationServiceStub(self._channel)
        self._timeout_s = timeout_s

    async def close(self) -> None:
        await self._channel.close()

    async def send(self, rings: Sequence[Ring]) -> dict[str, Answer]:
        """Answers by key; a failed call answers every ring RETRYABLE (same keys next time)."""
        request = npb.SendBatchRequest(
            notifications=[
                npb.Notification(
                    idempotency_key=ring.key,
                    user_id=ring.user_id,
                    priority=npb.PRIORITY_URGENT,
                    title="Reminder",
                    body=ring.text,
                    data={"reminder_key": ring.key},
                    due_time=_stamp(ring.due),
                    expire_time=_stamp(ring.expires),
                )
                for ring in rings
            ]
        )
        try:
            response = await self._stub.SendBatch(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.INVALID_ARGUMENT:
                # A batch this dispatcher built wrong: retrying the same will not help.
                # Not its details: a notifier may quote the field at fault, a reminder's text.
                log.error(
                    "the notifier refused a batch of %d as INVALID_ARGUMENT (%d characters of "
                    "details not logged)",
                    len(rings),
                    len(error.details() or ""),
                )
            reason = f"notifier call failed: {error.code().name}"
            return {ring.key: Answer(Outcome.RETRYABLE, reason) for ring in rings}
        answers = {
            result.idempotency_key: Answer(
                _OUTCOMES.get(result.outcome, Outcome.RETRYABLE), result.reason
            )
            for result in response.results
        }
        missing = Answer(Outcome.RETRYABLE, "no result for this item")
        return {ring.key: answers.get(ring.key, missing) for ring in rings}
