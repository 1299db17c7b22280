"""Hand-off to the Notification Service: one SendBatch, one answer per ring."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import grpc

from genproto.notification.v1 import notification_pb2 as npb
from genproto.notification.v1 import notification_pb2_grpc as npb_grpc
from reminders_svc.connections import CLIENT_OPTIONS
from reminders_svc.timestamps import timestamp
from reminders_svc.tls import ClientTls, TlsFiles

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
    # The first attempt of this process's hand-off of the ring: the notifier waits out a
    # push service asking for retries for its give-up bound from then, not from the due.
    first_sent: datetime


# A notifier's reason is kept in the delivery history and listed to the user: cut to this,
# so that no notifier's prose makes a history page pass a client's message limit (500
# records a page).
REASON_CHARS = 200


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


class RefusalBreaker:
    """Holds new claims back while the notifier takes nothing: its calls fail, or answer
    every ring "retry" (its own storage down, say), REFUSALS_TO_OPEN calls running over at
    least OPEN_AFTER_S. Without it, every ring due meanwhile was claimed and retried, its
    claim renewed by an LWT at each retry, for the whole outage, standing in the way of
    its user's changes; held back, a ring waits unclaimed, as while the notifier cannot be
    reached. One ring every PROBE_EVERY_S is let through to find out whether the notifier
    takes rings again (the rings already claimed keep retrying too); the first answer
    other than "retry" closes the breaker."""

    REFUSALS_TO_OPEN = 3
    OPEN_AFTER_S = 2.0
    PROBE_EVERY_S = 2.0

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._refusals = 0
        self._refusing_since = 0.0
        self._next_probe = 0.0

    def record(self, taken: bool) -> None:
        """A call's answer: `taken` when any of its rings was answered other than "retry"."""
        if taken:
            self._refusals = 0
            return
        if self._refusals == 0:
            self._refusing_since = self._clock()
        self._refusals += 1

    def open(self) -> bool:
        return (
            self._refusals >= self.REFUSALS_TO_OPEN
            and self._clock() - self._refusing_since >= self.OPEN_AFTER_S
        )

    def wait_s(self) -> float:
        """0 when a new ring may be claimed now (the breaker closed, or this ring is the
        probe); otherwise how long until the next probe."""
        if not self.open():
            return 0.0
        now = self._clock()
        if now >= self._next_probe:
            self._next_probe = now + self.PROBE_EVERY_S
            return 0.0
        return self._next_probe - now


# How often a TLS channel's files are looked at again (a stat of each, before a call).
TLS_LOOK_EVERY_S = 1.0


class NotifierClient:
    """One channel to the notifier: plaintext, or TLS (mutual when `tls` holds a client
    certificate). A call the notifier refuses (a handshake failing, no client certificate)
    fails like any other: every ring of it is answered RETRYABLE.

    With TLS, the files are looked at again before a call (at most every
    `TLS_LOOK_EVERY_S`): renewed ones (cert-manager rotating the Secret) open a new
    channel for the calls from then on, and the old one is closed once its calls are
    answered, so a renewal needs no restart."""

    def __init__(
        self, target: str, timeout_s: float = 10.0, *, tls: ClientTls | None = None
    ) -> None:
        self._target = target
        self._timeout_s = timeout_s
        self._tls_files = None if tls is None else TlsFiles(tls)
        self._next_look = time.monotonic() + TLS_LOOK_EVERY_S
        self._retiring: set[asyncio.Task[None]] = set()
        self._connected = asyncio.Event()  # set by `_watch` once the channel is connected
        self._reached = False  # connected at least once since this client was made
        self._watch: asyncio.Task[None] | None = None
        self.refusals = RefusalBreaker()
        self._channel = self._open()
        self._stub = npb_grpc.NotificationServiceStub(self._channel)
        log.info(
            "notifier at %s (tls=%s, mtls=%s, server_name=%s)",
            target,
            tls is not None,
            tls is not None and tls.mutual,
            tls.server_name if tls is not None else None,
        )

    def _open(self) -> grpc.aio.Channel:
        if self._tls_files is None:
            return grpc.aio.insecure_channel(self._target, options=CLIENT_OPTIONS)
        tls = self._tls_files.current
        return grpc.aio.secure_channel(
            self._target, tls.credentials(), options=(*CLIENT_OPTIONS, *tls.channel_options())
        )

    def _follow_renewals(self) -> None:
        if self._tls_files is None or time.monotonic() < self._next_look:
            return
        self._next_look = time.monotonic() + TLS_LOOK_EVERY_S
        if self._tls_files.renewed() is None:
            return
        retired = self._channel
        self._channel = self._open()
        self._stub = npb_grpc.NotificationServiceStub(self._channel)
        # The old channel's calls run to their own deadline; new calls take the new one.
        closing = asyncio.create_task(retired.close(grace=self._timeout_s))
        self._retiring.add(closing)
        closing.add_done_callback(self._retiring.discard)

    def connect(self) -> None:
        """Connect now, not at the first ring (which would wait for the handshake)."""
        self._channel.get_state(try_to_connect=True)

    def reached(self) -> bool:
        """Whether the channel has been connected since this client was made: until it
        has, a target, a CA or a server name wrong in this release's settings cannot be
        told from an outage, and the dispatcher takes no part (a rollout stops at it). Once
        it has, a later failure is an outage, which rings wait out (`until_connected`)."""
        if not self._reached:
            state = self._channel.get_state(try_to_connect=True)
            self._reached = state is grpc.ChannelConnectivity.READY
        return self._reached

    def connection_failing(self) -> bool:
        """Whether the notifier is known unreachable: the channel's attempts to connect fail
        (gRPC keeps TRANSIENT_FAILURE until one succeeds, trying at least every
        MAX_RECONNECT_BACKOFF_MS). An idle channel is asked to connect."""
        state = self._channel.get_state(try_to_connect=True)
        return state is grpc.ChannelConnectivity.TRANSIENT_FAILURE

    async def until_taking(self, wait_s: float) -> bool:
        """Whether a new ring may be claimed: the channel connected and the notifier taking
        rings (`RefusalBreaker`), waiting up to `wait_s` for that."""
        if not await self.until_connected(wait_s):
            return False
        if (refusing_s := self.refusals.wait_s()) == 0:
            return True
        await asyncio.sleep(min(refusing_s, wait_s))
        return False

    async def until_connected(self, wait_s: float) -> bool:
        """Whether the channel is connected, waiting up to `wait_s` for it to be (an idle
        one is asked to connect). Every waiter shares one watch of the channel: a
        dispatcher holds back up to a thousand rings during an outage, and each watching
        on its own cost twice the CPU (0.062 of a core against 0.034, for 1,024)."""
        if self._channel.get_state(try_to_connect=True) is grpc.ChannelConnectivity.READY:
            return True
        if self._watch is None or self._watch.done():
            self._connected.clear()
            self._watch = asyncio.create_task(self._watch_until_connected())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self._connected.wait()
        return self._channel.get_state(try_to_connect=False) is grpc.ChannelConnectivity.READY

    async def _watch_until_connected(self) -> None:
        """Sets `_connected` once the channel is (or a renewal's new channel is)."""
        while True:
            channel = self._channel
            state = channel.get_state(try_to_connect=True)
            if state is grpc.ChannelConnectivity.READY:
                self._connected.set()
                return
            if state is grpc.ChannelConnectivity.SHUTDOWN and channel is self._channel:
                return  # closed: waiters time out
            # Bounded, so a channel retired by a renewal meanwhile is left for the new one.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TLS_LOOK_EVERY_S):
                    await channel.wait_for_state_change(state)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        await self._channel.close()
        await asyncio.gather(*self._retiring)

    async def send(self, rings: Sequence[Ring]) -> dict[str, Answer]:
        """Answers by key; a failed call answers every ring RETRYABLE (same keys next time).

        A batch refused whole (INVALID_ARGUMENT: more items than this notifier takes, one
        item it cannot read) is sent again in halves, down to the item at fault: that one
        is answered REJECTED, so it is recorded and finalized rather than retried forever
        with every ring that shared its batch."""
        request = npb.SendBatchRequest(
            notifications=[
                npb.Notification(
                    idempotency_key=ring.key,
                    user_id=ring.user_id,
                    priority=npb.PRIORITY_URGENT,
                    title="Reminder",
                    body=ring.text,
                    data={"reminder_key": ring.key},
                    due_time=timestamp(ring.due),
                    expire_time=timestamp(ring.expires),
                    first_send_time=timestamp(ring.first_sent),
                )
                for ring in rings
            ]
        )
        self._follow_renewals()
        try:
            response = await self._stub.SendBatch(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.INVALID_ARGUMENT:
                return await self._refused_whole(rings, error)
            self.refusals.record(taken=False)
            reason = f"notifier call failed: {error.code().name}"
            return {ring.key: Answer(Outcome.RETRYABLE, reason) for ring in rings}
        answers = {
            result.idempotency_key: Answer(
                _OUTCOMES.get(result.outcome, Outcome.RETRYABLE), result.reason[:REASON_CHARS]
            )
            for result in response.results
        }
        missing = Answer(Outcome.RETRYABLE, "no result for this item")
        answered = {ring.key: answers.get(ring.key, missing) for ring in rings}
        self.refusals.record(any(a.outcome is not Outcome.RETRYABLE for a in answered.values()))
        return answered

    async def _refused_whole(
        self, rings: Sequence[Ring], error: grpc.aio.AioRpcError
    ) -> dict[str, Answer]:
        # Not its details: a notifier may quote the field at fault, a reminder's text.
        log.error(
            "the notifier refused a batch of %d as INVALID_ARGUMENT (%d characters of "
            "details not logged)%s",
            len(rings),
            len(error.details() or ""),
            "" if len(rings) == 1 else "; sending it again in halves",
        )
        if len(rings) == 1:
            return {rings[0].key: Answer(Outcome.REJECTED, "notifier refused it: INVALID_ARGUMENT")}
        half = len(rings) // 2
        first, second = await asyncio.gather(self.send(rings[:half]), self.send(rings[half:]))
        return first | second
