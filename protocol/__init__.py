"""The wire: generated stubs (through protocol.wire), identity, channels, discovery, envelopes."""

import os

# gRPC's fork handlers (on by default) run in this process at every fork, also a fork+exec such as
# torch starting torch_shm_manager after our channels exist; twice this session a process then
# aborted in gRPC's poller ("Epoll1Poller ... epoll_wait error: Bad file descriptor"). The cause is
# grpcio's (grpc/grpc#43055, open; a regression since 1.78, we run 1.85): its child-side fork
# handler restarts the epoll1 poller thread in the forked child, and subprocess.Popen's close_fds
# then closes that poller's epoll fd before exec, so its epoll_wait fails with EBADF and gRPC
# aborts the child (proposed fixes: grpc/grpc#43157, #43432). We never need the handlers: the only
# process we fork that keeps running Python (hivemind's DHT) starts before any gRPC object exists
# (protocol/discovery.py); and hivemind now shares memory by file descriptor, so a coordinator, a
# standby and a peer start no torch_shm_manager (3 processes each, not 4: benchmarks/exits.md).
# Must be set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
