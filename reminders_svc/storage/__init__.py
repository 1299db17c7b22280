"""Cassandra storage: connection, schema migrations, and (later) the repositories."""
