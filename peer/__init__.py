"""The running system: peer node, coordinator, round math, model + data, CLI."""

import protocol  # noqa: F401  first: it turns off gRPC's fork handlers before grpc is imported (see there)

VERSION = "0.1.0"
