"""NotificationService over the intake, the device registry and the recording adapter."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from genproto.notification.v1 import notification_pb2 as pb
from genproto.notification.v1 import notification_pb2_grpc as pb_grpc
from notifier.delivery.adapters import RecordingPushAdapter
from notifier.domain.model import (
    MAX_BATCH_ITEMS,
    ItemResult,
    Notification,
    Outcome,
    device_problem,
    device_token_problem,
    user_id_problem,
)
from notifier.domain.push import PushAdapter
from notifier.intake import Intake
from notifier.rpc import convert
from notifier.rpc.errors import translated
from notifier.settings import Faults
from notifier.storage.devices import DeviceStore
from reminders_svc.api.paging import Pages, page_size
from reminders_svc.domain.errors import FailedPrecondition, InvalidArgument

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

# A batch is answered this long before its caller's deadline, for the reply's way back.
_REPLY_MARGIN_S = 0.5
# The pushes of a ListDelivered page, at most: 500 of the largest fit in 4 MiB.
MAX_DELIVERED_PAGE = 500


class NotificationServicer(pb_grpc.NotificationServiceServicer):
    def __init__(
        self, intake: Intake, devices: DeviceStore, adapter: PushAdapter, faults: Faults
    ) -> None:
        self._intake = intake
        self._devices = devices
        self._adapter = adapter
        self._replies_to_drop = faults.drop_reply
        # The answer a fault gives every item, if one is on.
        self._fault_outcome = (
            Outcome.REJECTED if faults.reject else Outcome.RETRYABLE if faults.retry else None
        )

    @translated
    async def Send(self, request: pb.SendRequest, context: Context) -> pb.SendResponse:
        [result] = await self._answer([request.notification], context)
        return pb.SendResponse(result=convert.send_result(result))

    @translated
    async def SendBatch(
        self, request: pb.SendBatchRequest, context: Context
    ) -> pb.SendBatchResponse:
        count = len(request.notifications)
        if not 1 <= count <= MAX_BATCH_ITEMS:
            raise InvalidArgument(
                "notifications", f"{count} items, expected 1 to {MAX_BATCH_ITEMS}"
            )
        if self._fault_outcome is not None:
            log.warning("fault: answering a SendBatch of %d %s", count, self._fault_outcome)
            results = [
                self._counted(message, self._fault_outcome, "fault injected")
                for message in request.notifications
            ]
        else:
            results = await self._answer(request.notifications, context)
        if self._replies_to_drop > 0:
            # Fault injection: everything above happened; only the answer is lost.
            self._replies_to_drop -= 1
            log.warning("fault drop_reply: dropping the reply to a SendBatch of %d", count)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fault injected: reply dropped")
        return pb.SendBatchResponse(results=[convert.send_result(r) for r in results])

    async def _answer(
        self, messages: Sequence[pb.Notification], context: Context
    ) -> list[ItemResult]:
        """One result per item, in request order; an item that cannot be read (a
        timestamp out of range) is rejected on its own, its batch answered as usual."""
        read: list[Notification | ItemResult] = []
        for message in messages:
            try:
                read.append(convert.notification(message))
            except convert.InvalidTimestamp as error:
                read.append(self._counted(message, Outcome.REJECTED, str(error)))
        readable = [item for item in read if isinstance(item, Notification)]
        remaining_s = context.time_remaining()
        # (A deadline too short for the margin: half of it, not none.)
        within_s = (
            None if remaining_s is None else max(remaining_s - _REPLY_MARGIN_S, remaining_s / 2)
        )
        accepted = iter(await self._intake.accept_batch(readable, within_s) if readable else [])
        return [next(accepted) if isinstance(item, Notification) else item for item in read]

    def _counted(self, message: pb.Notification, outcome: Outcome, reason: str) -> ItemResult:
        """An item answered before the intake sees it, counted like those it answers."""
        result = ItemResult(message.idempotency_key, outcome, reason)
        self._intake.count(result)
        return result

    @translated
    async def RegisterDevice(
        self, request: pb.RegisterDeviceRequest, context: Context
    ) -> pb.RegisterDeviceResponse:
        device = convert.device(request.device)
        _refuse_if(device_problem(request.user_id, device))
        registered = await self._devices.register(request.user_id, device)
        return pb.RegisterDeviceResponse(device=convert.device_message(registered))

    @translated
    async def ListDevices(
        self, request: pb.ListDevicesRequest, context: Context
    ) -> pb.ListDevicesResponse:
        _refuse_if(user_id_problem(request.user_id))
        devices = await self._devices.list(request.user_id)
        return pb.ListDevicesResponse(devices=[convert.device_message(d) for d in devices])

    @translated
    async def UnregisterDevice(
        self, request: pb.UnregisterDeviceRequest, context: Context
    ) -> pb.UnregisterDeviceResponse:
        problem = device_token_problem(request.user_id, request.device_token, field="device_token")
        _refuse_if(problem)
        await self._devices.remove(request.user_id, request.device_token)
        return pb.UnregisterDeviceResponse()

    @translated
    async def DeleteUserDevices(
        self, request: pb.DeleteUserDevicesRequest, context: Context
    ) -> pb.DeleteUserDevicesResponse:
        _refuse_if(user_id_problem(request.user_id))
        await self._devices.remove_all(request.user_id)
        return pb.DeleteUserDevicesResponse()

    @translated
    async def ListDelivered(
        self, request: pb.ListDeliveredRequest, context: Context
    ) -> pb.ListDeliveredResponse:
        if not isinstance(self._adapter, RecordingPushAdapter):
            raise FailedPrecondition(
                f"the {self._adapter.name} push adapter keeps no record; "
                "run with REMINDERS_NOTIFIER_ADAPTER=recording",
                field="adapter",
                reason="NO_DELIVERY_RECORD",
            )
        # The filters are in the token: a token of one listing is refused by another.
        pages = Pages(f"delivered:{request.user_id}:{request.idempotency_key}", _push_number, str)
        after = pages.cursor(request.page_token) or 0
        size = page_size(request.page_size, MAX_DELIVERED_PAGE, MAX_DELIVERED_PAGE)
        pushed, last = self._adapter.page(request.user_id, request.idempotency_key, after, size)
        return pb.ListDeliveredResponse(
            delivered=[convert.delivered_message(p) for p in pushed],
            next_page_token=pages.token(last),
        )


def _push_number(text: str) -> int:
    """A cursor of ListDelivered: the number of a push (ValueError if not one)."""
    number = int(text)
    if number < 1:
        raise ValueError(text)
    return number


def _refuse_if(problem: InvalidArgument | None) -> None:
    """Ends the call INVALID_ARGUMENT, naming the field at fault, before anything is read
    or written, when the request has a problem."""
    if problem is not None:
        raise problem
