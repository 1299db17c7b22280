"""A batch the notifier refuses whole (INVALID_ARGUMENT) is sent again in halves, down to
the item at fault, which is answered rejected (issue 5, point 8: recorded and finalized,
not retried forever), while every other ring of the batch goes out once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import grpc

from dispatcher.handoff import NotifierClient, Outcome, Ring
from genproto.notification.v1 import notification_pb2 as pb
from notifier.domain.model import MAX_BATCH_ITEMS
from notifier.rpc.server import NOTIFICATION_SERVICE
from notifier.settings import NotifierSettings
from tests.notifier.conftest import reminder_key, running_notifier


def rings(user: str, count: int) -> list[Ring]:
    now = datetime.now(UTC)
    return [
        Ring(reminder_key(), user, f"ring {n}", now, now + timedelta(minutes=5), now)
        for n in range(count)
    ]


def hand_off(target: str, batch: list[Ring]) -> dict[str, Outcome]:
    async def send() -> dict[str, Outcome]:
        client = NotifierClient(target, timeout_s=30)
        try:
            return {key: answer.outcome for key, answer in (await client.send(batch)).items()}
        finally:
            await client.close()

    return asyncio.run(send())


def test_a_batch_larger_than_the_notifier_takes_is_delivered_in_halves(
    notifier_settings: NotifierSettings, user: str
) -> None:
    """A dispatcher whose batch size outgrew its notifier's limit (the reference notifier
    takes MAX_BATCH_ITEMS) still hands every ring off, each once."""
    batch = rings(user, MAX_BATCH_ITEMS + 1)
    with running_notifier(notifier_settings) as notifier:
        outcomes = hand_off(notifier.target, batch)
        assert outcomes == {ring.key: Outcome.ACCEPTED for ring in batch}
        delivered = notifier.wait_delivered(len(batch), user, timeout_s=60)
        assert sorted(d.idempotency_key for d in delivered) == sorted(r.key for r in batch)


class _RefusesOneKey:
    """A notifier that validates more strictly than the reference one: a batch holding
    the key it cannot take is refused whole, as AIP-193 has a bad request refused."""

    def __init__(self, refused_key: str) -> None:
        self.refused_key = refused_key
        self.accepted: list[str] = []

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            NOTIFICATION_SERVICE,
            {
                "SendBatch": grpc.unary_unary_rpc_method_handler(
                    self._send_batch,
                    request_deserializer=pb.SendBatchRequest.FromString,
                    response_serializer=pb.SendBatchResponse.SerializeToString,
                )
            },
        )

    async def _send_batch(
        self, request: pb.SendBatchRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.SendBatchResponse:
        keys = [item.idempotency_key for item in request.notifications]
        if self.refused_key in keys:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "notifications: bad item")
        self.accepted += keys
        return pb.SendBatchResponse(
            results=[
                pb.SendResult(idempotency_key=key, outcome=pb.SendResult.OUTCOME_ACCEPTED)
                for key in keys
            ]
        )


def test_the_one_item_a_notifier_refuses_is_rejected_and_the_rest_of_its_batch_goes_out(
    user: str,
) -> None:
    batch = rings(user, 8)
    refused = batch[5].key
    notifier = _RefusesOneKey(refused)

    async def scenario() -> dict[str, Outcome]:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((notifier.handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = NotifierClient(f"127.0.0.1:{port}")
        try:
            answers = await client.send(batch)
        finally:
            await client.close()
            await server.stop(None)
        return {key: answer.outcome for key, answer in answers.items()}

    outcomes = asyncio.run(scenario())
    assert outcomes == {
        ring.key: Outcome.REJECTED if ring.key == refused else Outcome.ACCEPTED for ring in batch
    }
    # Each ring the notifier took, once: only calls it refused whole were sent again.
    assert sorted(notifier.accepted) == sorted(r.key for r in batch if r.key != refused)
