"""The gRPC adapter: notification.v1 messages to and from the domain, and the server."""
