"""The wire: generated stubs (through protocol.wire), identity, channels, discovery, envelopes."""

import os

# gRPC's fork handlers (on by default) run in this process at every fork, also a fork+exec such as
# torch starting torch_shm_manager after our channels exist; twice this session a process then
# aborted in gRPC's poller ("Epoll1Poller ... epoll_wait error: Bad file descriptor"). We never need
# them: the only process we fork that keeps running Python (hivemind's DHT) starts before any gRPC
# object exists (protocol/discovery.py). Must be set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
