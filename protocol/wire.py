"""The wire contract's generated messages and stubs (proto/swarm.proto), reached only through here.

protocol/_generated is produced by `make proto` and never edited or imported elsewhere; code
outside protocol/ writes `from protocol.wire import swarm_pb2, swarm_pb2_grpc`.
"""

from protocol._generated import swarm_pb2, swarm_pb2_grpc

__all__ = ["swarm_pb2", "swarm_pb2_grpc"]
