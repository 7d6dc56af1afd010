"""Per-peer token buckets: a flood from one peer slows that peer, not the swarm."""

from __future__ import annotations

import threading
import time


class RateLimiter:
    def __init__(self, rate_per_s: float, burst: float, max_keys: int = 100_000) -> None:
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
