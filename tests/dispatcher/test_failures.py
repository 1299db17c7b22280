"""Crashes, frozen dispatchers, lost replies, outages, a notifier that is down or killed.

Every test runs its own stack of real processes (see stack.py): dispatchers are killed
with SIGKILL through the fault hooks, frozen with SIGSTOP, and the notifier is stopped,
made to answer "retry", and started again, while the reminders' rows and the notifier's
recorded pushes say what happened.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.config import CassandraSettings
from reminders_svc.health import LIVENESS_SERVICE
from reminders_svc.storage.parts import floor_minute, part_of
from tests.dispatcher.stack import (
    PARTS,
    Stack,
    closing,
    health_status,
    move_due,
    new_user,
    owners,
    part_checkpoints,
    pushed_early,
    room_wait_s,
    scrape,
    soon,
    user_in,
    wait_checkpointed,
    wait_health,
    wait_owning,
    wait_serving,
)
from tests.platform.helpers import free_port
from tests.servers import refusal_of_undecodable
from tests.tcp_proxy import TcpProxy


@pytest.fixture
def stack(cassandra_settings: CassandraSettings, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with closing(Stack(cassandra_settings), request) as running:
        running.start_api()
        yield running


# Part and claim leases far longer than these tests: a part or a ring another dispatcher
# takes within seconds was let go, not left to expire.
LONG_HOLDS = {
    "REMINDERS_DISPATCH_LEASE_S": "60",
    "REMINDERS_DISPATCH_CLAIM_LEASE_S": "60",
    "REMINDERS_DISPATCH_SHUTDOWN_GRACE_S": "20",
}


@pytest.mark.parametrize("hook", ["crash_after_claim", "crash_after_send"])
def test_a_crashed_dispatchers_ring_is_re_sent_by_the_next_owner_and_delivered_once(
    stack: Stack, hook: str
) -> None:
    stack.start_notifier()
    doomed = stack.start_dispatcher("doomed", REMINDERS_DISPATCH_FAULTS=hook)
    wait_owning(stack, {"doomed"})
    user = new_user()
    created = stack.create_at(user, soon(3))

    doomed.wait(timeout=30)
    assert doomed.returncode == -signal.SIGKILL
    stack.start_dispatcher("heir")

    pushes = stack.wait_for_pushes(1, user, created.id, timeout_s=40)
    assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]
    assert len(stack.pushes(user, created.id)) == 1
    assert pushes[0].idempotency_key.startswith(created.id)
    history = stack.deliveries(user, created.id)
    expected = (
        pb.Delivery.ANSWER_DUPLICATE
        if hook == "crash_after_send"
        else (pb.Delivery.ANSWER_ACCEPTED)
    )
    assert [d.answer for d in history] == [expected]  # one key, one row


def test_a_notifier_killed_before_its_push_answered_nothing_and_its_successor_pushes_once(
    stack: Stack,
) -> None:
    """The notifier records the ring's key, then dies before pushing (SIGKILL via its
    hook). It had answered nothing, so the dispatcher keeps retrying; the notifier started
    in its place finds the key held, unsettled, answers "retry" until the takeover bound,
    then takes the key over and pushes it: one push, answered ACCEPTED, not DUPLICATE."""
    takeover = {
        "REMINDERS_NOTIFIER_KEY_TAKEOVER_AFTER_S": "3",
        "REMINDERS_NOTIFIER_PUSH_TIMEOUT_S": "1",
    }
    doomed = stack.start_notifier(REMINDERS_NOTIFIER_FAULTS="crash_before_push", **takeover)
    stack.start_dispatcher("d")
    wait_owning(stack, {"d"})
    user = new_user()
    created = stack.create_at(user, soon(3))

    doomed.wait(timeout=30)
    assert doomed.returncode == -signal.SIGKILL
    stack.start_notifier(**takeover)

    pushes = stack.wait_for_pushes(1, user, created.id, timeout_s=40)
    assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]
    assert len(pushes) == 1
    history = stack.deliveries(user, created.id)
    assert [d.answer for d in history] == [pb.Delivery.ANSWER_ACCEPTED]


def test_sigterm_lets_go_of_unsent_claims_and_leases_at_once(stack: Stack) -> None:
    notifier = stack.start_notifier()
    leaving = stack.start_dispatcher("leaving", **LONG_HOLDS)
    wait_owning(stack, {"leaving"})
    # Reachable, answering every item "retry": rings are claimed and retried.
    notifier = stack.restart_notifier(notifier, REMINDERS_NOTIFIER_FAULTS="retry")
    # Room in the minute for the ring and the stop, so that waiting for the minute's end
    # (plus the 4 s grace) would take as long as the shutdown grace (20 s) cutting it short.
    time.sleep(room_wait_s(25))
    user = new_user()
    created = stack.create_at(user, soon(3))
    # Claimed; the notifier answers "retry".
    assert stack.wait_status(user, created.id, "sending").status == "sending"  # type: ignore[attr-defined]

    started = time.monotonic()
    assert stack.stop(leaving) == 0
    # Not the minute's end plus the grace, nor the shutdown grace: not half of it.
    shutdown_grace_s = float(LONG_HOLDS["REMINDERS_DISPATCH_SHUTDOWN_GRACE_S"])
    assert time.monotonic() - started < shutdown_grace_s / 2
    assert {owner for owner, _ in owners(stack).values()} == {None}
    stack.restart_notifier(notifier)
    stack.start_dispatcher("heir", **LONG_HOLDS)

    wait_owning(stack, {"heir"})
    # Well inside the claim lease (60 s) the heir would have waited out, had it been held.
    assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=20)) == 1
    assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]
    time.sleep(2)
    assert len(stack.pushes(user, created.id)) == 1


def test_a_stopping_dispatchers_released_parts_are_taken_while_it_still_drains(
    stack: Stack,
) -> None:
    stack.start_notifier()
    # "leaving" reaches the notifier through a proxy that passes its calls on and, once
    # holding, drops the answers: a hand-off is pushed and its call hangs (the call's
    # deadline, 10 s), the drain waiting for it.
    proxy = TcpProxy("127.0.0.1", stack.notifier_port)
    stack.start_dispatcher("staying", **LONG_HOLDS)
    leaving = stack.start_dispatcher(
        "leaving", REMINDERS_NOTIFIER_TARGET=f"127.0.0.1:{proxy.port}", **LONG_HOLDS
    )
    # Evenly: "leaving" holds a part besides the one whose drain hangs.
    wait_owning(stack, {"staying", "leaving"}, evenly=True)
    held = min(part for part, (owner, _) in owners(stack).items() if owner == "leaving")
    user = user_in(held)
    try:
        proxy.hold_replies()
        created = stack.create_at(user, soon(3))
        # Pushed, its answer dropped: its call is under way.
        assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=30)) == 1
        leaving.send_signal(signal.SIGTERM)
        # Every other part is released at once; counted in the fleet until its heartbeat
        # expired (a lease: 60 s), or until it left at the drain's end, "leaving" kept
        # "staying" at half of them meanwhile.
        others = set(range(PARTS)) - {held}
        while leaving.poll() is None:
            if all(owners(stack)[part][0] == "staying" for part in others):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the drain ended first: {owners(stack)}")
        assert leaving.wait(timeout=30) == 0  # its drain done: a second SIGTERM cuts it short
    finally:
        proxy.close()
    # The ring's claim let go as the drain ended: "staying" re-sends it, the same key.
    wait_owning(stack, {"staying"}, timeout_s=15)
    assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]
    assert len(stack.pushes(user, created.id)) == 1


def test_parts_handed_over_let_go_of_their_unsent_claims_at_once(stack: Stack) -> None:
    notifier = stack.start_notifier()
    metrics_port = free_port()
    first = {"REMINDERS_DISPATCH_METRICS_PORT": str(metrics_port), **LONG_HOLDS}
    stack.start_dispatcher("first", **first)
    wait_owning(stack, {"first"})
    # Reachable, answering every item "retry": rings are claimed and retried.
    notifier = stack.restart_notifier(notifier, REMINDERS_NOTIFIER_FAULTS="retry")
    users = [user_in(part) for part in range(PARTS)]
    due = soon(3)
    created = {user: stack.create_at(user, due).id for user in users}
    for user, reminder_id in created.items():
        assert stack.wait_status(user, reminder_id, "sending").status == "sending"  # type: ignore[attr-defined]

    stack.start_dispatcher("second", **LONG_HOLDS)  # "first" hands half of its parts over
    wait_owning(stack, {"first", "second"}, timeout_s=30)  # inside the 60 s leases
    stack.restart_notifier(notifier)

    # The rings of the parts handed over are re-claimed and sent by "second", those of the
    # parts kept by "first", each once.
    assert len(stack.wait_for_pushes(PARTS, timeout_s=30)) == PARTS
    for user, reminder_id in created.items():
        assert stack.wait_status(user, reminder_id, "done").status == "done"  # type: ignore[attr-defined]
    time.sleep(2)
    assert len(stack.pushes()) == PARTS
    samples = scrape(metrics_port)
    assert samples["reminders_dispatch_claims_lost_total"] == 0  # no user took anything
    assert samples["reminders_dispatch_leases_lost_total"] == 0  # handed over, not lost


def test_a_dispatcher_frozen_right_after_its_claim_hands_nothing_off_when_it_wakes(
    stack: Stack,
) -> None:
    stack.start_notifier()
    frozen = stack.start_dispatcher("frozen", REMINDERS_DISPATCH_FAULTS="freeze_after_claim")
    wait_owning(stack, {"frozen"})
    user = new_user()
    created = stack.create_at(user, soon(3))
    # Claimed, and the dispatcher stopped right after its claim.
    assert stack.wait_status(user, created.id, "sending").status == "sending"  # type: ignore[attr-defined]
    try:
        stack.start_dispatcher("heir")
        assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=40)) == 1
        assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]
    finally:
        frozen.send_signal(signal.SIGCONT)
    # It carries on from right after its claim, past its lease, and finds the lease gone.
    stack.wait_logged(frozen, LEASE_GONE)
    time.sleep(2)  # would a hand-off follow?

    assert frozen.poll() is None
    assert len(stack.pushes(user, created.id)) == 1
    history = stack.deliveries(user, created.id)
    # A late hand-off would be answered duplicate and recorded over the heir's answer.
    assert [d.answer for d in history] == [pb.Delivery.ANSWER_ACCEPTED]


def test_a_dropped_reply_is_retried_and_answered_duplicate(stack: Stack) -> None:
    stack.start_notifier(REMINDERS_NOTIFIER_FAULTS="drop_reply:1")
    stack.start_dispatcher("d")
    user = new_user()
    created = stack.create_at(user, soon(4))

    stack.wait_for_pushes(1, user, created.id, timeout_s=30)
    time.sleep(3)

    assert len(stack.pushes(user, created.id)) == 1
    history = stack.deliveries(user, created.id)
    assert [d.answer for d in history] == [pb.Delivery.ANSWER_DUPLICATE]


def test_a_ring_the_notifier_rejects_is_recorded_and_finalized_not_retried(
    stack: Stack,
) -> None:
    # The notifier answers every item REJECTED, an answer for good (as for an expired one).
    stack.start_notifier(REMINDERS_NOTIFIER_FAULTS="reject")
    stack.start_dispatcher("d")
    user = new_user()
    created = stack.create_at(user, soon(3))

    assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]
    time.sleep(3)  # would it be handed off again?

    history = stack.deliveries(user, created.id)
    assert [(d.answer, d.reason) for d in history] == [
        (pb.Delivery.ANSWER_REJECTED, "fault injected")
    ]
    assert stack.pushes(user, created.id) == []


# "part N: lease lost; stopping" or "part N: lease not renewed in time; stopping"
LEASE_GONE = "; stopping"


def _wait_frozen(process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Until `process` is stopped (state T), as its freeze_after_claim hook leaves it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{process.pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.1)
    raise AssertionError("the dispatcher did not freeze")


def test_a_frozen_dispatcher_past_its_lease_writes_nothing_when_it_wakes(stack: Stack) -> None:
    """Frozen (SIGSTOP, by its freeze_after_claim hook) while it holds a claim and, in every
    part, minutes still to read and checkpoint; another dispatcher takes its parts and the
    ring over and checkpoints past those minutes. Continued, the frozen one hands nothing
    off and moves no checkpoint back: its leases, and so its epochs, are dead."""
    stack.start_notifier()
    # An outage to catch up on: every part checkpointed 12 minutes ago, a ring of part 0
    # missed 8 minutes ago; the frozen dispatcher catches up slowly (one minute a second
    # over all parts), so it checkpoints part 0's first minutes, claims the ring and
    # freezes with minutes of every part open behind it.
    rewound = floor_minute(datetime.now(UTC)) - timedelta(minutes=12)
    for part in range(PARTS):
        stack.db.session.execute(
            "INSERT INTO dispatch_parts (part, epoch, checkpoint) VALUES (%s, 1, %s)",
            (part, rewound),
        )
    user = user_in(0)
    created = stack.create_at(user, soon(3600))
    move_due(stack, user, created.id, rewound + timedelta(minutes=3, seconds=30))
    frozen = stack.start_dispatcher(
        "frozen",
        REMINDERS_DISPATCH_FAULTS="freeze_after_claim",
        REMINDERS_DISPATCH_CATCH_UP_MINUTES_PER_S="1",
    )
    try:
        assert stack.wait_status(user, created.id, "sending").status == "sending"  # type: ignore[attr-defined]
        _wait_frozen(frozen)
        # Its checkpoint loop ran under the leases it is about to lose.
        assert any(c is not None and c > rewound for c in part_checkpoints(stack).values())

        stack.start_dispatcher("awake")
        assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=40)) == 1
        assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]
        wait_owning(stack, {"awake"})
        taken = owners(stack)
        # Past every minute the frozen one had open (at most 4 past its checkpoint a part).
        checkpoints = wait_checkpointed(
            stack, floor_minute(datetime.now(UTC)) - timedelta(minutes=2)
        )
        assert min(checkpoints.values()) > rewound + timedelta(minutes=7)
    finally:
        frozen.send_signal(signal.SIGCONT)
    # The woken dispatcher runs its loops (renew, read, checkpoint, hand off) and finds
    # its leases gone.
    stack.wait_logged(frozen, LEASE_GONE)
    time.sleep(4)  # would a checkpoint or a hand-off follow?

    assert frozen.poll() is None
    # Its old leases are dead: it may only come back through new ones (a higher epoch,
    # after rebalancing), never by renewing or checkpointing under its stale epoch.
    for part, (owner, epoch) in owners(stack).items():
        assert epoch >= taken[part][1]
        if owner == "frozen":
            assert epoch > taken[part][1]
    later = part_checkpoints(stack)
    for part, checkpoint in checkpoints.items():
        moved = later[part]
        assert moved is not None
        assert moved >= checkpoint, (
            f"part {part}: checkpoint moved back from {checkpoint} to {moved}"
        )
    # It handed the ring it had claimed off no second time: that would be answered
    # duplicate (the heir's hand-off holds the key), not pushed again.
    assert len(stack.pushes(user, created.id)) == 1
    answers = stack.notifier_answers()
    assert (answers["accepted"], answers["duplicate"]) == (1, 0), answers


def test_two_dispatchers_share_the_parts_and_hand_each_ring_off_once(stack: Stack) -> None:
    stack.start_notifier()
    metrics_ports = {name: free_port() for name in ("a", "b")}
    for name, port in metrics_ports.items():
        stack.start_dispatcher(name, REMINDERS_DISPATCH_METRICS_PORT=str(port))
    wait_owning(stack, {"a", "b"})
    users = [new_user() for _ in range(40)]
    assert {part_of(user, PARTS) for user in users} == set(range(PARTS))  # rings in every part
    due = soon(15)  # room for 40 creates, one after another, on a slow machine
    created = {stack.create_at(user, due).id for user in users}

    stack.wait_for_pushes(40, timeout_s=40)
    time.sleep(2)

    pushes = stack.pushes()
    keys = [p.idempotency_key for p in pushes]
    assert len(keys) == len(set(keys)) == 40
    assert not pushed_early(pushes), pushed_early(pushes)
    assert {key.split("/")[0] for key in keys} == created
    # Each key handed off once: a second hand-off would be answered duplicate, not pushed.
    answers = stack.notifier_answers()
    assert (answers["accepted"], answers["duplicate"]) == (40, 0), answers
    # Both worked: each handed off some of the rings, together all of them, each once.
    rung = {}
    for name, port in metrics_ports.items():
        samples = scrape(port)
        rung[name] = samples.get('reminders_dispatch_rings_total{outcome="accepted"}', 0)
        assert samples.get('reminders_dispatch_rings_total{outcome="duplicate"}', 0) == 0
    assert sum(rung.values()) == 40, rung
    assert all(rung.values()), rung


def test_after_an_outage_missed_rings_go_out_per_the_misfire_policy(stack: Stack) -> None:
    stack.start_notifier()
    # The outage: rows whose dues passed minutes ago, parts checkpointed before them.
    missed_at = (datetime.now(UTC) - timedelta(minutes=4)).replace(microsecond=0)
    one_off_user, repeat_user = new_user(), new_user()
    one_off = stack.create_at(one_off_user, soon(3600))
    hourly = stack.create_repeat(
        repeat_user, (missed_at - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:00")
    )
    for user, created in ((one_off_user, one_off), (repeat_user, hourly)):
        move_due(stack, user, created.id, missed_at)
    for part in range(PARTS):
        stack.db.session.execute(
            "INSERT INTO dispatch_parts (part, epoch, checkpoint) VALUES (%s, 1, %s)",
            (part, floor_minute(missed_at) - timedelta(minutes=10)),
        )

    stack.start_dispatcher("after-outage")

    for user, created in ((one_off_user, one_off), (repeat_user, hourly)):
        assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=40)) == 1
    time.sleep(2)
    for user, created in ((one_off_user, one_off), (repeat_user, hourly)):
        assert len(stack.pushes(user, created.id)) == 1  # a repeat rings once, not per miss
        history = stack.deliveries(user, created.id)
        assert [d.late for d in history] == [True]
    assert stack.row(one_off_user, one_off.id).status == "done"  # type: ignore[attr-defined]
    repeat_row = stack.row(repeat_user, hourly.id)
    assert repeat_row.status == "pending"  # type: ignore[attr-defined]
    assert repeat_row.due.replace(tzinfo=UTC) > datetime.now(UTC)  # type: ignore[attr-defined]


def test_a_backlog_drains_at_its_pace_without_holding_up_what_is_due_now(stack: Stack) -> None:
    stack.start_notifier()
    # The outage: 16 rings missed in one minute 6 minutes ago, four in each part, every
    # part checkpointed before it. More minutes lie between that one and now than a part
    # keeps open at once (4), so one cursor reached the minute due now only once the
    # missed minute was done.
    missed_minute = floor_minute(datetime.now(UTC) - timedelta(minutes=6))
    missed: dict[tuple[str, str], datetime] = {}
    for i in range(4 * PARTS):
        user = user_in(i % PARTS)
        created = stack.create_at(user, soon(3600))
        due = missed_minute + timedelta(seconds=5 + 3 * i)
        move_due(stack, user, created.id, due)
        missed[user, created.id] = due
    for part in range(PARTS):
        stack.db.session.execute(
            "INSERT INTO dispatch_parts (part, epoch, checkpoint) VALUES (%s, 1, %s)",
            (part, missed_minute - timedelta(minutes=1)),
        )

    # At one missed ring a second, the backlog takes ~16 s; a ring due in 8 s in each part
    # goes out on time all the same (each used to wait for its part's share of the
    # backlog: the part served last, ~16 s).
    stack.start_dispatcher("d", REMINDERS_DISPATCH_CATCH_UP_RINGS_PER_S="1")
    wait_owning(stack, {"d"})  # the backlog under way; its start is the machine's speed
    live_due = soon(8)
    live = [(user, stack.create_at(user, live_due).id) for user in map(user_in, range(PARTS))]
    for user, reminder_id in live:
        [push] = stack.wait_for_pushes(1, user, reminder_id, timeout_s=30)
        lateness = push.push_time.ToDatetime() - push.due_time.ToDatetime()
        assert timedelta(0) <= lateness < timedelta(seconds=6), (part_of(user, PARTS), lateness)

    # Checkpoints read before the pushes: a missed ring not pushed by then was not resolved
    # when they were read, so its part must not have been checkpointed past its minute.
    checkpoints = part_checkpoints(stack)
    unrung = [key for key in missed if not stack.pushes(*key)]
    assert unrung, "the backlog was done before the live rings: the test proves nothing"
    for user, reminder_id in unrung:
        checkpoint = checkpoints[part_of(user, PARTS)]
        assert checkpoint is not None
        assert checkpoint < floor_minute(missed[user, reminder_id])

    for user, reminder_id in missed:
        assert len(stack.wait_for_pushes(1, user, reminder_id, timeout_s=40)) == 1
    time.sleep(2)
    for user, reminder_id in missed:
        assert len(stack.pushes(user, reminder_id)) == 1
        assert [d.late for d in stack.deliveries(user, reminder_id)] == [True]
    for user, reminder_id in live:
        assert len(stack.pushes(user, reminder_id)) == 1
        assert [d.late for d in stack.deliveries(user, reminder_id)] == [False]


def test_a_row_the_dispatcher_cannot_handle_is_set_aside_and_its_part_goes_on(
    stack: Stack,
) -> None:
    stack.start_notifier()
    missed_at = (datetime.now(UTC) - timedelta(minutes=2)).replace(microsecond=0)
    minute = floor_minute(missed_at)
    part = 1
    odd_user, user = user_in(part), user_in(part)
    odd = stack.create_at(odd_user, soon(3600), text="words never logged")
    plain = stack.create_at(user, soon(3600))
    for owner, created in ((odd_user, odd), (user, plain)):
        move_due(stack, owner, created.id, missed_at)
    # A status this release does not know (as a newer one might write): the row cannot be
    # read into a reminder here.
    stack.db.session.execute(
        "UPDATE reminders SET status = 'archived' WHERE user_id = %s AND reminder_id = %s",
        (odd_user, uuid.UUID(odd.id)),
    )
    for each in range(PARTS):
        stack.db.session.execute(
            "INSERT INTO dispatch_parts (part, epoch, checkpoint) VALUES (%s, 1, %s)",
            (each, minute - timedelta(minutes=1)),
        )
    metrics_port = free_port()
    stack.start_dispatcher("d", REMINDERS_DISPATCH_METRICS_PORT=str(metrics_port))

    assert len(stack.wait_for_pushes(1, user, plain.id, timeout_s=30)) == 1
    # The part went on past the minute, not stuck on the row.
    assert wait_checkpointed(stack, minute)[part] >= minute
    assert stack.pushes(odd_user, odd.id) == []
    assert scrape(metrics_port)["reminders_dispatch_rings_set_aside_total"] == 1
    row = stack.row(odd_user, odd.id)
    assert (row.status, row.claim_token) == ("archived", None)  # type: ignore[attr-defined]
    log = "".join(path.read_text() for path in stack.logs.glob("dispatch-d-*.log"))
    assert f"reminder {odd.id}: set aside" in log
    assert "words never logged" not in log


def test_nothing_is_lost_or_claimed_while_the_notifier_is_down(stack: Stack) -> None:
    notifier = stack.start_notifier()
    metrics_port = free_port()
    stack.start_dispatcher("d", REMINDERS_DISPATCH_METRICS_PORT=str(metrics_port))
    wait_owning(stack, {"d"})
    stack.stop(notifier)
    user = new_user()
    due = soon(3)
    created = stack.create_at(user, due)

    # Due, and left unclaimed (free for its user's changes, no LWT renewing a claim) while
    # the dispatcher cannot reach the notifier; its metrics say so.
    _wait_for_sample(metrics_port, "reminders_dispatch_notifier_reachable", 0)
    time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 5)
    assert stack.row(user, created.id).status == "pending"  # type: ignore[attr-defined]

    stack.start_notifier()

    assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=60)) == 1
    assert stack.wait_status(user, created.id, "done").status == "done"  # type: ignore[attr-defined]
    _wait_for_sample(metrics_port, "reminders_dispatch_notifier_reachable", 1)


def _wait_for_sample(metrics_port: int, name: str, value: float, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while scrape(metrics_port).get(name) != value:
        assert time.monotonic() < deadline, f"{name} never read {value}"
        time.sleep(0.25)


def test_a_waiting_claim_is_aged_from_its_claim_and_its_minute_from_the_minute(
    stack: Stack,
) -> None:
    """The gauges SREs alert on, with a ring due 90 s ago claimed and the notifier
    answering "retry"."""
    stack.start_notifier(REMINDERS_NOTIFIER_FAULTS="retry")
    user = new_user()
    created = stack.create_at(user, soon(3600))
    missed_at = (datetime.now(UTC) - timedelta(seconds=90)).replace(microsecond=0)
    move_due(stack, user, created.id, missed_at)
    metrics_port = free_port()
    stack.start_dispatcher("d", REMINDERS_DISPATCH_METRICS_PORT=str(metrics_port))
    assert stack.wait_status(user, created.id, "sending").status == "sending"  # type: ignore[attr-defined]
    claimed_by = time.monotonic()

    def minute_age() -> float:
        return (datetime.now(UTC) - floor_minute(missed_at)).total_seconds()

    # A tick refreshes the gauges, every couple of seconds or more on a slow machine; the
    # empty minutes before the ring's (read from the initial lookback) may finish just
    # after its claim, so the lag may first show one of them.
    samples = scrape(metrics_port)
    while (
        samples["reminders_dispatch_oldest_unresolved_claim_seconds"] == 0
        or samples["reminders_dispatch_checkpoint_lag_seconds"] > minute_age()
    ):
        assert time.monotonic() - claimed_by < 15, f"the gauges never settled: {samples}"
        time.sleep(0.2)
        samples = scrape(metrics_port)

    claim_age = samples["reminders_dispatch_oldest_unresolved_claim_seconds"]
    assert 0 < claim_age <= time.monotonic() - claimed_by + 3
    assert minute_age() - 10 < samples["reminders_dispatch_checkpoint_lag_seconds"] <= minute_age()


def test_while_ringing_a_snooze_rings_later_and_a_delete_stops_the_series(stack: Stack) -> None:
    """Rings held in `sending` (the notifier answers "retry") while their users act."""
    notifier = stack.start_notifier(REMINDERS_NOTIFIER_FAULTS="retry")
    stack.start_dispatcher("d")
    start = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:00")
    reminders = {}
    for action in ("snooze", "delete"):
        user = new_user()
        created = stack.create_repeat(user, start)
        move_due(stack, user, created.id, soon(2))
        reminders[action] = (user, created)
    for user, created in reminders.values():
        assert stack.wait_status(user, created.id, "sending").status == "sending"  # type: ignore[attr-defined]

    snooze_user, snoozed = reminders["snooze"]
    answer = stack.api.SnoozeReminder(
        pb.SnoozeReminderRequest(id=snoozed.id, duration=Duration(seconds=10)),
        metadata=stack.md(snooze_user),
    )
    snooze_at = answer.snooze_until_time.ToDatetime(tzinfo=UTC)
    delete_user, deleted = reminders["delete"]
    gone = stack.api.DeleteReminder(
        pb.DeleteReminderRequest(id=deleted.id), metadata=stack.md(delete_user)
    )
    assert gone.was_sending  # the API says the ring in flight cannot be recalled
    stack.restart_notifier(notifier)

    # The snooze: the ring in flight goes out, then the snooze rings, then the series goes on.
    pushes = stack.wait_for_pushes(2, snooze_user, snoozed.id, timeout_s=120)
    assert len(pushes) == 2
    assert pushes[1].push_time.ToDatetime(tzinfo=UTC) >= snooze_at
    row = stack.wait_status(snooze_user, snoozed.id, "pending")
    assert row.snooze_until is None  # type: ignore[attr-defined]
    assert row.due.replace(tzinfo=UTC) > datetime.now(UTC)  # type: ignore[attr-defined]
    # The delete: at most the one ring already in flight, and nothing after it.
    assert len(stack.pushes(delete_user, deleted.id)) <= 1
    assert stack.row(delete_user, deleted.id).status == "deleted"  # type: ignore[attr-defined]


def _wait_unowned(stack: Stack, timeout_s: float = 30) -> None:
    """Until no part has an owner: every lease lapsed (its owner cell's TTL ran out)."""
    deadline = time.monotonic() + timeout_s
    while (held := {owner for owner, _ in owners(stack).values()}) != {None}:
        assert time.monotonic() < deadline, f"parts still owned: {held}"
        time.sleep(0.2)


def test_a_dispatcher_rides_out_a_storage_outage_and_rings_what_fell_due_during_it(
    stack: Stack,
) -> None:
    """Cassandra gone for longer than a part lease, for the dispatcher only: it keeps
    running (it does not exit on a failed renewal, heartbeat or balance), and once the
    database is back it leases its parts again and rings what fell due meanwhile."""
    stack.start_notifier()
    proxy = TcpProxy(stack.settings.contact_points[0], stack.settings.port)
    try:
        dispatcher = stack.start_dispatcher("d", REMINDERS_CASSANDRA_PORT=str(proxy.port))
        wait_owning(stack, {"d"})
        user = new_user()
        before = stack.create_at(user, soon(2))
        assert len(stack.wait_for_pushes(1, user, before.id, timeout_s=30)) == 1

        proxy.cut()
        during_due = soon(3)
        during = stack.create_at(user, during_due)
        # Every lease lapsed on Cassandra's clock, after failed renewals, heartbeats and
        # balances; and the ring fell due with no database.
        _wait_unowned(stack)
        time.sleep(max(0.0, (during_due - datetime.now(UTC)).total_seconds()))
        assert dispatcher.poll() is None, "the dispatcher exited during the outage"
        assert not stack.pushes(user, during.id)
        proxy.restore()

        assert len(stack.wait_for_pushes(1, user, during.id, timeout_s=60)) == 1
        wait_owning(stack, {"d"})
        after = stack.create_at(user, soon(3))
        assert len(stack.wait_for_pushes(1, user, after.id, timeout_s=30)) == 1
        assert dispatcher.poll() is None
    finally:
        proxy.close()


def test_a_dispatcher_started_before_its_database_waits_not_ready_then_works(
    stack: Stack,
) -> None:
    stack.start_notifier()
    proxy = TcpProxy(stack.settings.contact_points[0], stack.settings.port)
    proxy.cut()
    try:
        port = free_port()
        dispatcher = stack.start_dispatcher(
            "d", REMINDERS_CASSANDRA_PORT=str(proxy.port), REMINDERS_DISPATCH_PORT=str(port)
        )
        # Waiting for its database; its health server, up before it connects, answers.
        stack.wait_logged(dispatcher, "connecting failed")
        assert dispatcher.poll() is None, "the dispatcher exited without its database"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            # Not ready, but alive: Kubernetes' liveness probe asks this, and must not
            # restart a dispatcher for its database's absence.
            alive = health_pb2.HealthCheckRequest(service=LIVENESS_SERVICE)
            status = health.Check(alive, timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        assert refusal_of_undecodable(f"127.0.0.1:{port}", "/grpc.health.v1.Health/Check") == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "request: not a valid Check request",
        )

        proxy.restore()

        wait_owning(stack, {"d"}, timeout_s=60)
        wait_serving(f"127.0.0.1:{port}")
        user = new_user()
        created = stack.create_at(user, soon(3))
        assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=30)) == 1
    finally:
        proxy.close()


def _wait_clock_measured_ahead(metrics_port: int, timeout_s: float = 60) -> None:
    """Until the dispatcher has measured its host clock 30 s ahead of the database's (the
    fault hook's), so what the test checks next follows a measurement, not a start-up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if scrape(metrics_port).get("reminders_dispatch_clock_offset_seconds", 0) < -20:
                return
        except OSError:
            pass  # not serving its metrics yet
        assert time.monotonic() < deadline, "the clock was never measured off"
        time.sleep(0.2)


def test_a_dispatcher_whose_clock_is_off_takes_no_part_and_the_fleet_rings_without_it(
    stack: Stack,
) -> None:
    """A host clock 30 s ahead would tell a part's minutes live or past wrongly (DESIGN.md
    invariant 8): not ready, the dispatcher takes no part and is not counted in the fleet's
    shares, so another takes every part and rings."""
    stack.start_notifier()
    port, metrics_port = free_port(), free_port()
    stack.start_dispatcher(
        "off",
        REMINDERS_DISPATCH_FAULTS="wall_clock_ahead",
        REMINDERS_DISPATCH_PORT=str(port),
        REMINDERS_DISPATCH_METRICS_PORT=str(metrics_port),
    )
    _wait_clock_measured_ahead(metrics_port)
    time.sleep(5)  # a few more ticks (every 2 s), each measuring the clock, none taking a part
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert {owner for owner, _ in owners(stack).values()} <= {None}

    stack.start_dispatcher("on")
    wait_owning(stack, {"on"})
    user = new_user()
    created = stack.create_at(user, soon(3))
    assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=30)) == 1


def test_a_dispatcher_that_never_reached_its_notifier_takes_no_part_until_it_does(
    stack: Stack,
) -> None:
    """A release whose settings cannot reach the notifier (a wrong target, CA or server
    name) went ready and took its share of parts, whose rings then waited on it while the
    rollout went on to the next pod. Not ready and holding nothing until it is reached."""
    port = free_port()
    dispatcher = stack.start_dispatcher("d", REMINDERS_DISPATCH_PORT=str(port))
    stack.wait_logged(dispatcher, "has not been reached since start")  # after a lease, 6 s
    assert health_status(f"127.0.0.1:{port}") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert {owner for owner, _ in owners(stack).values()} <= {None}

    stack.start_notifier()
    wait_health(f"127.0.0.1:{port}", health_pb2.HealthCheckResponse.SERVING, timeout_s=30)
    wait_owning(stack, {"d"})
    user = new_user()
    created = stack.create_at(user, soon(3))
    assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=30)) == 1


def test_a_dispatcher_whose_clock_goes_bad_hands_its_parts_over_after_a_lease(
    stack: Stack,
) -> None:
    """Parts held when the clock goes bad would wait for it to come back: not ready for a
    lease's length, the dispatcher winds them down and releases them to the fleet."""
    stack.start_notifier()
    port, metrics_port = free_port(), free_port()
    drifting = stack.start_dispatcher(
        "drifting",
        REMINDERS_DISPATCH_FAULTS="wall_clock_ahead_on_sigusr1",
        REMINDERS_DISPATCH_PORT=str(port),
        REMINDERS_DISPATCH_METRICS_PORT=str(metrics_port),
    )
    wait_owning(stack, {"drifting"})
    drifting.send_signal(signal.SIGUSR1)
    stack.start_dispatcher("steady")
    # Measured off: not ready at once, its parts still held until off for a lease (6 s).
    _wait_clock_measured_ahead(metrics_port)
    # The same tick marks it not ready, just after the measurement; well within the lease.
    wait_health(f"127.0.0.1:{port}", health_pb2.HealthCheckResponse.NOT_SERVING, timeout_s=3)
    assert "drifting" in {owner for owner, _ in owners(stack).values()}

    wait_owning(stack, {"steady"}, timeout_s=60)
    user = new_user()
    created = stack.create_at(user, soon(3))
    assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=30)) == 1
    assert drifting.poll() is None


def test_a_storage_blip_shorter_than_the_lease_costs_no_part_its_work(stack: Stack) -> None:
    """A few seconds without the database: bucket reads and checkpoints are tried again,
    so no part is dropped and re-taken (its epoch stays), and rings go on."""
    stack.start_notifier()
    proxy = TcpProxy(stack.settings.contact_points[0], stack.settings.port)
    try:
        dispatcher = stack.start_dispatcher(
            "d", REMINDERS_CASSANDRA_PORT=str(proxy.port), REMINDERS_DISPATCH_LEASE_S="30"
        )
        wait_owning(stack, {"d"})
        epochs = {part: epoch for part, (_, epoch) in owners(stack).items()}
        time.sleep(3)  # into a minute's polling

        proxy.cut()
        time.sleep(2)
        proxy.restore()

        user = new_user()
        created = stack.create_at(user, soon(3))
        assert len(stack.wait_for_pushes(1, user, created.id, timeout_s=30)) == 1
        assert {part: epoch for part, (_, epoch) in owners(stack).items()} == epochs
        assert dispatcher.poll() is None
    finally:
        proxy.close()
