"""Every RPC x {own reminder, another user's, no token, bad signature, expired token};
the admin RPC x {admin credential, a user's own token, no token, bad signature, expired}."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import jwt
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask

from genproto.reminders.v1 import reminders_pb2 as pb
from reminders_svc.api.auth import TokenKey
from reminders_svc.storage.session import CassandraConnection
from tests.api.conftest import Api, code_of, reason_of, snapshot_of, weekly_monday_nine

Metadata = tuple[tuple[str, str], ...]
Call = Callable[[Api, str, Metadata], Any]

OK = grpc.StatusCode.OK
NOT_FOUND = grpc.StatusCode.NOT_FOUND
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED

# Each RPC, called on reminder `rid` with metadata `md`.
CALLS: dict[str, Call] = {
    "GetReminder": lambda api, rid, md: api.reminders.GetReminder(
        pb.GetReminderRequest(id=rid), metadata=md
    ),
    "UpdateReminder": lambda api, rid, md: api.reminders.UpdateReminder(
        pb.UpdateReminderRequest(
            reminder=pb.Reminder(id=rid, version=1, text="x"), update_mask=FieldMask(paths=["text"])
        ),
        metadata=md,
    ),
    "SnoozeReminder": lambda api, rid, md: api.reminders.SnoozeReminder(
        pb.SnoozeReminderRequest(id=rid, duration=Duration(seconds=300)), metadata=md
    ),
    "PauseReminder": lambda api, rid, md: api.reminders.PauseReminder(
        pb.PauseReminderRequest(id=rid), metadata=md
    ),
    "ResumeReminder": lambda api, rid, md: api.reminders.ResumeReminder(
        pb.ResumeReminderRequest(id=rid), metadata=md
    ),
    "ListDeliveries": lambda api, rid, md: api.reminders.ListDeliveries(
        pb.ListDeliveriesRequest(reminder_id=rid), metadata=md
    ),
    "DeleteReminder": lambda api, rid, md: api.reminders.DeleteReminder(
        pb.DeleteReminderRequest(id=rid), metadata=md
    ),
}
# RPCs that name no reminder: only the credential matters.
UNTARGETED: dict[str, Call] = {
    "CreateReminder": lambda api, rid, md: api.reminders.CreateReminder(
        pb.CreateReminderRequest(
            reminder=pb.Reminder(text="x", schedule=weekly_monday_nine()),
            request_id=uuid.uuid4().hex,
        ),
        metadata=md,
    ),
    "ListReminders": lambda api, rid, md: api.reminders.ListReminders(
        pb.ListRemindersRequest(), metadata=md
    ),
    "PreviewSchedule": lambda api, rid, md: api.reminders.PreviewSchedule(
        pb.PreviewScheduleRequest(schedule=weekly_monday_nine()), metadata=md
    ),
}


def _bearer(token: str) -> Metadata:
    return (("authorization", f"Bearer {token}"),)


def _credentials(key: TokenKey, subject: str) -> dict[str, Metadata]:
    """Credentials that must not pass, each otherwise fit for `key`'s audience."""
    now = int(time.time())
    return {
        "no token": (),
        "bad signature": _bearer(
            jwt.encode(
                {"sub": subject, "aud": key.audience, "iat": now, "exp": now + 600},
                "an-attacker-secret-that-is-long-enough-0000",
                algorithm=key.algorithm,
            )
        ),
        "expired": _bearer(
            jwt.encode(
                {"sub": subject, "aud": key.audience, "iat": now - 4200, "exp": now - 3600},
                key.key.value,
                algorithm=key.algorithm,
            )
        ),
    }


def _owned_reminder(api: Api, owner: str) -> pb.Reminder:
    return api.reminders.CreateReminder(
        pb.CreateReminderRequest(
            reminder=pb.Reminder(text="mine", schedule=weekly_monday_nine()),
            request_id=uuid.uuid4().hex,
        ),
        metadata=api.as_user(owner),
    )


@pytest.mark.parametrize("rpc", sorted(CALLS))
def test_targeted_rpcs(api: Api, user: str, rpc: str) -> None:
    reminder = _owned_reminder(api, user)
    call = CALLS[rpc]
    before = api.reminders.GetReminder(
        pb.GetReminderRequest(id=reminder.id), metadata=api.as_user(user)
    )

    outcomes = {
        "another user's": code_of(lambda: call(api, reminder.id, api.as_user(f"{user}-mallory"))),
        **{
            name: code_of(lambda md=md: call(api, reminder.id, md))  # type: ignore[misc]
            for name, md in _credentials(api.auth.user, user).items()
        },
    }
    unchanged = api.reminders.GetReminder(
        pb.GetReminderRequest(id=reminder.id), metadata=api.as_user(user)
    )
    own = code_of(lambda: call(api, reminder.id, api.as_user(user)))

    assert outcomes == {
        "another user's": NOT_FOUND,
        "no token": UNAUTHENTICATED,
        "bad signature": UNAUTHENTICATED,
        "expired": UNAUTHENTICATED,
    }
    assert unchanged == before  # nothing a refused call did changed the reminder
    # Resume of a pending reminder is a valid call in the wrong state.
    assert own == (grpc.StatusCode.FAILED_PRECONDITION if rpc == "ResumeReminder" else OK)


def test_a_client_tells_an_expired_token_from_a_bad_one_by_the_reason(api: Api, user: str) -> None:
    """Every refusal carries an ErrorInfo reason (AIP-193): a client refreshes an expired
    token, asks for one when it sent none, and does not retry a forged or wrong one."""
    reminder = _owned_reminder(api, user)
    get = CALLS["GetReminder"]
    reasons = {
        name: reason_of(lambda md=md: get(api, reminder.id, md))  # type: ignore[misc]
        for name, md in _credentials(api.auth.user, user).items()
    }
    reasons["another user's"] = reason_of(
        lambda: get(api, reminder.id, api.as_user(f"{user}-mallory"))
    )
    for name, md in (
        ("a user's token on the admin RPC", api.as_user(user)),
        ("an expired admin token", _credentials(api.auth.admin, "ops")["expired"]),
    ):
        reasons[name] = reason_of(
            lambda md=md: api.admin.DeleteUserData(  # type: ignore[misc]
                pb.DeleteUserDataRequest(user_id=user), metadata=md
            )
        )

    assert reasons == {
        "no token": "CREDENTIALS_MISSING",
        "bad signature": "CREDENTIALS_INVALID",
        "expired": "TOKEN_EXPIRED",
        "another user's": "REMINDER_NOT_FOUND",
        "a user's token on the admin RPC": "ADMIN_CREDENTIAL_REQUIRED",
        "an expired admin token": "TOKEN_EXPIRED",
    }


@pytest.mark.parametrize("rpc", sorted(UNTARGETED))
def test_untargeted_rpcs(api: Api, user: str, cassandra: CassandraConnection, rpc: str) -> None:
    call = UNTARGETED[rpc]
    # Every refused token but the missing one names `user` as its subject: a create that
    # wrote before its credential was checked would write under `user`.
    before = snapshot_of(cassandra, user)
    outcomes = {
        name: code_of(lambda md=md: call(api, "", md))  # type: ignore[misc]
        for name, md in _credentials(api.auth.user, user).items()
    }
    assert set(outcomes.values()) == {UNAUTHENTICATED}, outcomes
    assert snapshot_of(cassandra, user) == before  # a refused call wrote nothing
    assert code_of(lambda: call(api, "", api.as_user(user))) == OK


def test_delete_user_data_needs_the_admin_credential(api: Api, user: str) -> None:
    reminder = _owned_reminder(api, user)
    request = pb.DeleteUserDataRequest(user_id=user)
    get = pb.GetReminderRequest(id=reminder.id)

    def purge(md: Metadata) -> Any:
        return api.admin.DeleteUserData(request, metadata=md)

    refused = {
        # Authenticated, but not as an operator: the credential is valid, the right missing.
        "user's own token": code_of(lambda: purge(api.as_user(user))),
        **{
            name: code_of(lambda md=md: purge(md))  # type: ignore[misc]
            for name, md in _credentials(api.auth.admin, "ops").items()
        },
    }
    survived = api.reminders.GetReminder(get, metadata=api.as_user(user))
    answer = purge(api.as_admin())

    assert refused == {
        "user's own token": PERMISSION_DENIED,
        "no token": UNAUTHENTICATED,
        "bad signature": UNAUTHENTICATED,
        "expired": UNAUTHENTICATED,
    }
    assert survived.id == reminder.id  # no refused call deleted anything
    assert answer.reminders_deleted == 1
    assert code_of(lambda: api.reminders.GetReminder(get, metadata=api.as_user(user))) == NOT_FOUND


def test_a_missing_reminder_looks_exactly_like_another_users(api: Api, user: str) -> None:
    theirs = _owned_reminder(api, f"{user}-bob")
    md = api.as_user(user)
    with pytest.raises(grpc.RpcError) as missing:
        api.reminders.GetReminder(pb.GetReminderRequest(id=str(uuid.uuid4())), metadata=md)
    with pytest.raises(grpc.RpcError) as foreign:
        api.reminders.GetReminder(pb.GetReminderRequest(id=theirs.id), metadata=md)
    assert (missing.value.code(), missing.value.details()) == (
        foreign.value.code(),
        foreign.value.details(),
    )
