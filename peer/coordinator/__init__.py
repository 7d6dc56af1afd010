"""The coordinator: round clock, admission, manifests, checkpoints, its gRPC service."""
