"""ListDelivered, the recording adapter's listing, through a real notifier on the real
node: pages in push order whatever their size, tokens bound to their filters, bad input
refused naming the field."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

from genproto.notification.v1 import notification_pb2 as pb
from notifier.delivery.adapters import RecordingPushAdapter
from notifier.domain.model import MAX_BATCH_ITEMS, Platform, Priority
from notifier.domain.push import PushMessage
from notifier.rpc.client import list_delivered
from notifier.rpc.servicer import MAX_DELIVERED_PAGE
from notifier.settings import NotifierSettings
from tests.grpc_errors import assert_refused
from tests.notifier.conftest import ACCEPTED, Client, item, running_notifier

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def deliver(notifier: Client, user: str, count: int) -> list[str]:
    """Sends `count` items to `user` in batches and waits until all are pushed; their keys."""
    keys: list[str] = []
    while len(keys) < count:
        batch = [item(user) for _ in range(min(MAX_BATCH_ITEMS, count - len(keys)))]
        assert {r.outcome for r in notifier.send_batch(*batch)} == {ACCEPTED}
        keys += [i.idempotency_key for i in batch]
    notifier.wait_delivered(count, user, timeout_s=60)
    return keys


def test_pages_follow_push_order_and_end_with_an_empty_token(notifier: Client, user: str) -> None:
    deliver(notifier, user, 7)
    in_order = [d.idempotency_key for d in notifier.delivered(user)]

    pages: list[list[str]] = []
    token = ""
    while True:
        request = pb.ListDeliveredRequest(user_id=user, page_size=3, page_token=token)
        answer = notifier.stub.ListDelivered(request, timeout=10)
        pages.append([d.idempotency_key for d in answer.delivered])
        token = answer.next_page_token
        if not token:
            break

    assert [len(page) for page in pages] == [3, 3, 1]
    assert [key for page in pages for key in page] == in_order
    # A page ending exactly at the last push says there is no more.
    exact = pb.ListDeliveredRequest(user_id=user, page_size=7)
    assert notifier.stub.ListDelivered(exact, timeout=10).next_page_token == ""


def test_a_listing_past_one_page_is_read_whole_page_by_page(notifier: Client, user: str) -> None:
    """Over the default page (500), one call answers a page and the client helper all of
    them, each once, in push order; the race tests list 1,000 rings this way."""
    count = MAX_DELIVERED_PAGE + 120
    keys = deliver(notifier, user, count)

    first = notifier.stub.ListDelivered(pb.ListDeliveredRequest(user_id=user), timeout=10)
    assert len(first.delivered) == MAX_DELIVERED_PAGE
    assert first.next_page_token

    listed = [d.idempotency_key for d in list_delivered(notifier.stub, user)]
    assert len(listed) == count
    assert set(listed) == set(keys)
    times = [d.push_time.ToDatetime() for d in list_delivered(notifier.stub, user)]
    assert times == sorted(times)


def test_bad_page_input_is_refused_naming_the_field(notifier: Client, user: str) -> None:
    other = f"{user}-other"
    deliver(notifier, user, 2)
    deliver(notifier, other, 2)
    token_of_user = notifier.stub.ListDelivered(
        pb.ListDeliveredRequest(user_id=user, page_size=1), timeout=10
    ).next_page_token
    assert token_of_user

    refused_token = "page_token: not a token from this listing"
    cases = [
        (pb.ListDeliveredRequest(user_id=user, page_size=-1), "page_size: must not be negative"),
        (pb.ListDeliveredRequest(user_id=user, page_token="not-a-token"), refused_token),
        # A token carries its listing's filters: another user's, or no filter, is refused,
        # so a page never mixes two listings.
        (pb.ListDeliveredRequest(user_id=other, page_token=token_of_user), refused_token),
        (pb.ListDeliveredRequest(page_token=token_of_user), refused_token),
        (
            pb.ListDeliveredRequest(user_id=user, idempotency_key="k", page_token=token_of_user),
            refused_token,
        ),
    ]
    for request, details in cases:
        with pytest.raises(grpc.RpcError) as refused:
            notifier.stub.ListDelivered(request, timeout=10)
        assert refused.value.details() == details, request
        field = details.split(":", 1)[0]
        assert_refused(refused.value, INVALID, field, "INVALID_FIELD", "notification.v1")


def test_a_notifier_keeping_no_record_says_so(notifier_settings: NotifierSettings) -> None:
    logging_only = dataclasses.replace(notifier_settings, adapter="logging")
    with running_notifier(logging_only) as notifier, pytest.raises(grpc.RpcError) as refused:
        notifier.stub.ListDelivered(pb.ListDeliveredRequest(user_id="u"), timeout=10)
    assert_refused(
        refused.value,
        grpc.StatusCode.FAILED_PRECONDITION,
        "adapter",
        "NO_DELIVERY_RECORD",
        "notification.v1",
    )
    assert "REMINDERS_NOTIFIER_ADAPTER=recording" in (refused.value.details() or "")


def test_a_listing_continues_after_its_last_push_when_older_ones_were_dropped() -> None:
    """The adapter keeps its newest pushes only; a token names a push by its number, so
    a listing resumes after it even once it, and those before it, are gone."""
    adapter = RecordingPushAdapter(capacity=3)

    def push(key: str) -> None:
        message = PushMessage(
            idempotency_key=key,
            collapse_id=key,
            user_id="u",
            device_token="d",
            platform=Platform.APNS,
            priority=Priority.URGENT,
            expire_time=None,
            title="t",
            body="b",
            data={},
            due_time=None,
        )
        asyncio.run(adapter.push(message))

    for key in "abc":
        push(key)
    first, after = adapter.page(limit=2)
    assert ([p.idempotency_key for p in first], after) == (["a", "b"], 2)
    for key in "de":  # drops a and b: what the token names is gone
        push(key)
    rest, end = adapter.page(after=2, limit=2)
    assert ([p.idempotency_key for p in rest], end) == (["c", "d"], 4)
    last, none_left = adapter.page(after=4, limit=2)
    assert ([p.idempotency_key for p in last], none_left) == (["e"], None)
