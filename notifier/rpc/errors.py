"""The notifier's errors: answered as the reminders API answers its own (status codes,
google.rpc details), under the notifier's ErrorInfo domain."""

from __future__ import annotations

from reminders_svc.api.errors import ErrorDomain, translated_in

NOTIFIER = ErrorDomain(
    "notification.v1",
    "storage did not confirm the change, which may have been applied: repeat the call"
    " (each of this service's calls may be repeated safely)",
)
translated = translated_in(NOTIFIER)
