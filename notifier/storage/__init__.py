"""The notifier's Cassandra tables: idempotency keys and devices, in its own keyspace."""
