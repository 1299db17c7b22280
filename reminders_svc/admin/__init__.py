"""`reminders admin`: operators' commands on a running deployment (see docs/operations.md).

Every command works through the same code the service uses: parts and their counts
(storage/parts.py), leases (dispatcher/leases.py), bucket reads (dispatcher/buckets.py),
the row's state machine (domain/) and every row write by `ReminderStore.replace`, an LWT
compared on the row's whole state, bucket entry first. Output never carries reminder
texts.
"""
