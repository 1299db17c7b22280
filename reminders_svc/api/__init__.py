"""The gRPC layer: a thin adapter between protobuf messages and the domain."""
