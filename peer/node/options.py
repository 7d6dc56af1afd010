"""What a training peer is told on its command line (`swarmloco peer`), checked up front."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True, slots=True)
class PeerOptions:
    coordinator: str | None = None  # HOST:PORT of the coordinator's gRPC port
    initial_peers: list[str] = field(default_factory=list)  # DHT multiaddrs
    run_id: str | None = None
    coordinator_key: str | None = None  # fingerprint of the run's coordinator key to pin (checked by protocol.run_state)
    identity_path: str | None = None
    data: str | None = None
    client_mode: bool = False
    device: str = "cpu"
    host: str = "0.0.0.0"
    port: int = 0
    announce_host: str = "127.0.0.1"
    host_maddrs: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    announce_maddrs: list[str] = field(default_factory=list)
    shard: int | None = None
    num_shards: int | None = None
    threads: int | None = None
    state_dir: str | None = None  # where --resume state is kept (default: next to the identity)
    resume: bool = False
    log_every: int = 5
    connect_timeout_s: float = 120.0  # the whole join, retried with backoff (peer/run/timeouts.JoinTimeouts)
    train_priority: str = "auto"  # overlapped rounds: the training thread's CPU priority (peer/node/thread_priority.py)

    def __post_init__(self) -> None:
        if not self.coordinator and not self.initial_peers:
            raise ValueError("give --coordinator HOST:PORT or --initial-peers MULTIADDR (the coordinator prints both)")
        if self.coordinator and (":" not in self.coordinator or not self.coordinator.rsplit(":", 1)[1].isdigit()):
            raise ValueError(f"--coordinator {self.coordinator!r}: expected HOST:PORT, e.g. 127.0.0.1:31338")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"--device {self.device!r}: use cpu or cuda")
        if (self.shard is None) != (self.num_shards is None):
            raise ValueError("--shard needs the form I/N")
        if not self.connect_timeout_s > 0:
            raise ValueError(f"--connect-timeout must be a positive number of seconds (got {self.connect_timeout_s:g})")
        if self.log_every < 1:
            raise ValueError("--log-every must be at least 1")
        from peer.node.thread_priority import check_mode

        check_mode(self.train_priority)
