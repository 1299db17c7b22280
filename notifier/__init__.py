"""The reference Notification Service: dedupes alerts by idempotency key, keeps a device
registry per user, and pushes through a push adapter (recording or logging here; APNs /
FCM adapters fit the same interface). Its own deployable: `reminders notifier`."""
