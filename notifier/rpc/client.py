"""The client side of NotificationService's development listing, for tests, benchmarks and
the demo."""

from __future__ import annotations

from genproto.notification.v1 import notification_pb2 as pb
from genproto.notification.v1 import notification_pb2_grpc as pb_grpc


def list_delivered(
    stub: pb_grpc.NotificationServiceStub,
    user_id: str = "",
    idempotency_key: str = "",
    timeout_s: float = 10,
) -> list[pb.Delivered]:
    """Every push the recording adapter kept that matches the filters, in push order,
    page after page (ListDelivered)."""
    delivered: list[pb.Delivered] = []
    token = ""
    while True:
        request = pb.ListDeliveredRequest(
            user_id=user_id, idempotency_key=idempotency_key, page_token=token
        )
        answer = stub.ListDelivered(request, timeout=timeout_s)
        delivered.extend(answer.delivered)
        token = answer.next_page_token
        if not token:
            return delivered
