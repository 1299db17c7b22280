"""Reminders service: the gRPC API, its domain and its Cassandra storage."""
