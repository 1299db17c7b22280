"""The reminders domain: values, the row's state machine and errors. Pure: no I/O."""
