"""The service's error hierarchy. The gRPC layer maps each class to one status code.

Every error carries a message safe to show the caller (never a reminder text, never a
stack trace) and a stable `reason`. `InvalidArgument` names the request field at fault;
a FailedPrecondition names what its precondition is about (e.g. the reused
`request_id`).
"""

from __future__ import annotations

from datetime import timedelta


class ReminderError(Exception):
    """Base of every error the API answers on purpose.

    `field`, when set, is the path in the request of the field at fault, e.g.
    "reminder.text"; `description` says what is wrong with it. `reason` is the error's
    stable, machine-readable name (google.rpc.ErrorInfo, AIP-193): clients branch on it,
    never on the message. Each class has one; a raise may name a more specific one.
    """

    reason = "ERROR"

    def __init__(
        self, message: str, *, field: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.description = message
        if reason is not None:
            self.reason = reason
        # ErrorInfo's metadata: facts a client acts on, beside the reason.
        self.metadata: dict[str, str] = {}


class InvalidArgument(ReminderError):
    """The request is malformed; `field` is its path in the request, e.g. "reminder.text"."""

    field: str
    reason = "INVALID_FIELD"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", field=field)
        self.description = message


class NotFound(ReminderError):
    """No such reminder for this caller (missing and not-owned look the same)."""

    reason = "REMINDER_NOT_FOUND"


class VersionConflict(ReminderError):
    """The caller's version is stale: re-read and retry (gRPC ABORTED, HTTP 409). The
    reminder's version is in the metadata (`current_version`)."""

    reason = "VERSION_STALE"

    def __init__(self, sent: int, current: int) -> None:
        super().__init__(f"version {sent} is not the reminder's: it is at version {current}")
        self.metadata["current_version"] = str(current)


class FailedPrecondition(ReminderError):
    """Valid, but not in the reminder's current state (or a reused request_id); `field`
    names what the precondition is about (google.rpc.PreconditionFailure's subject), and
    `reason` which one failed: each is listed in the proto, so each raise names its own."""

    field: str

    def __init__(self, message: str, *, field: str, reason: str) -> None:
        super().__init__(message, field=field, reason=reason)


class UserDataBeingDeleted(FailedPrecondition):
    """An operator's DeleteUserData of this user is under way: nothing is created for the
    user until it has finished."""

    def __init__(self) -> None:
        super().__init__(
            "this user's data is being deleted; nothing can be created until that finishes",
            field="user",
            reason="USER_DATA_BEING_DELETED",
        )


class QuotaExceeded(ReminderError):
    """A quota is used up; `subject` names whose (e.g. "user"), for the
    google.rpc.QuotaFailure that RESOURCE_EXHAUSTED carries (AIP-193)."""

    reason = "ACTIVE_REMINDERS_CAP"

    def __init__(self, message: str, *, subject: str) -> None:
        super().__init__(message)
        self.subject = subject


class Unauthenticated(ReminderError):
    """Missing, malformed, expired or wrongly signed credentials."""

    reason = "CREDENTIALS_INVALID"


class PermissionDenied(ReminderError):
    """Authenticated, but not allowed (e.g. a user token on an admin RPC)."""

    reason = "ADMIN_CREDENTIAL_REQUIRED"


class DeadlineExceeded(ReminderError):
    """A change outran the API's write deadline: it may or may not have been applied, so
    the caller reads before retrying (a create is repeated with its request_id)."""

    reason = "OUTCOME_UNKNOWN"


class Unavailable(ReminderError):
    """Storage cannot be reached or did not answer in time; safe to retry, no sooner than
    `retry_after` (google.rpc.RetryInfo: a gateway's Retry-After)."""

    reason = "STORAGE_UNAVAILABLE"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        retry_after: timedelta = timedelta(seconds=1),
    ) -> None:
        super().__init__(message, reason=reason)
        self.retry_after = retry_after

    @classmethod
    def contention(cls, on_what: str) -> Unavailable:
        """Compare-and-sets on `on_what` lost too many times in a row to other writers:
        soon over, as the writers they lost to finish."""
        return cls(
            f"too much contention on {on_what}; retry",
            reason="CONTENTION",
            retry_after=timedelta(milliseconds=200),
        )
