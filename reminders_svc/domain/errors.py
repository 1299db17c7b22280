"""The service's error hierarchy. The gRPC layer maps each class to one status code.

Every error carries a message safe to show the caller (never a reminder text, never a
stack trace). `InvalidArgument` names the request field at fault; any other error may
name one too (e.g. the reused `request_id` of a FailedPrecondition).
"""

from __future__ import annotations


class ReminderError(Exception):
    """Base of every error the API answers on purpose.

    `field`, when set, is the path in the request of the field at fault, e.g.
    "reminder.text"; `description` says what is wrong with it.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.description = message


class InvalidArgument(ReminderError):
    """The request is malformed; `field` is its path in the request, e.g. "reminder.text"."""

    field: str

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", field=field)
        self.description = message


class NotFound(ReminderError):
    """No such reminder for this caller (missing and not-owned look the same)."""


class VersionConflict(ReminderError):
    """The caller's version is stale: re-read and retry (gRPC ABORTED, HTTP 409)."""


class FailedPrecondition(ReminderError):
    """Valid, but not in the reminder's current state (or a reused request_id)."""


class QuotaExceeded(ReminderError):
    """A quota is used up; `subject` names whose (e.g. "user"), for the
    google.rpc.QuotaFailure that RESOURCE_EXHAUSTED carries (AIP-193)."""

    def __init__(self, message: str, *, subject: str) -> None:
        super().__init__(message)
        self.subject = subject


class Unauthenticated(ReminderError):
    """Missing, malformed, expired or wrongly signed credentials."""


class PermissionDenied(ReminderError):
    """Authenticated, but not allowed (e.g. a user token on an admin RPC)."""


class DeadlineExceeded(ReminderError):
    """A change outran the API's write deadline: it may or may not have been applied, so
    the caller reads before retrying (a create is repeated with its request_id)."""


class Unavailable(ReminderError):
    """Storage cannot be reached or did not answer in time; safe to retry."""
