"""Per-caller token buckets: a flood from one peer (or one host) slows that caller, not the swarm."""

from __future__ import annotations

import threading
import time


class RateLimiter:
    """Token bucket per key: `rate_per_s` tokens refill per second, at most `burst` saved up."""

    def __init__(self, rate_per_s: float, burst: float, max_keys: int = 100_000) -> None:
        if rate_per_s <= 0 or burst <= 0:
            raise ValueError("rate_per_s and burst must be positive")
        self.rate = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last time)

    def allow(self, key: str, cost: float = 1.0) -> bool:
        now = time.monotonic()
        with self._lock:
            if key not in self._buckets and len(self._buckets) >= self.max_keys:
                # Memory stays bounded under a flood of fresh identities: forget the oldest half.
                for stale in sorted(self._buckets, key=lambda k: self._buckets[k][1])[: self.max_keys // 2]:
                    del self._buckets[stale]
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens < cost:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - cost, now)
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)


class CallerLimits:
    """Two buckets per call: the caller's claimed peer id, and the host it calls from.

    The peer id in call metadata is self-declared, so a flooder could rotate it to get a fresh
    bucket per call; the per-host bucket (a larger budget, since several honest peers may share
    a NAT address or a test machine) stops that. Both must admit the call.
    """

    def __init__(self, *, per_peer_rate: float, per_peer_burst: float, host_factor: float = 10.0) -> None:
        self.per_peer = RateLimiter(per_peer_rate, per_peer_burst)
        self.per_host = RateLimiter(per_peer_rate * host_factor, per_peer_burst * host_factor)

    def allow(self, peer: str, host: str, cost: float = 1.0) -> bool:
        return self.per_host.allow(host, cost) and self.per_peer.allow(peer, cost)
