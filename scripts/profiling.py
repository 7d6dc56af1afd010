"""cProfile across the threads of one ExchangePeer (scripts/exchange_round.py), for bench_vs_hivemind --profile.

cProfile sees only the thread that enables it, and the sliced exchange does its fetching and
gathering in thread pools. ThreadProfiles swaps the peer's pools for ones whose tasks run under
a per-thread profiler (enabled only while a task runs, so idle threads add nothing), profiles the
calling thread inside `with`, and the peer's gRPC loop thread throughout. The written report merges every thread: cumulative times of
concurrent threads add up, so they can exceed the wall time; tottime says where CPU went.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class ProfiledExecutor(ThreadPoolExecutor):
    def __init__(self, profiles: "ThreadProfiles", max_workers: int, thread_name_prefix: str) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.profiles = profiles

    def submit(self, fn, /, *args, **kwargs):  # map() submits through here
        return super().submit(self.profiles.run, fn, *args, **kwargs)


class ThreadProfiles:
    def __init__(self) -> None:
        self.main = cProfile.Profile()
        self.by_thread: list[cProfile.Profile] = []
        self.local = threading.local()
        self.lock = threading.Lock()
        self.wall_s = 0.0
        self.rounds = 0

    @classmethod
    def attach(cls, peer: Any) -> "ThreadProfiles":
        """Swap the peer's fetch threads and its SliceExchange's slice threads for profiled ones."""
        profiles = cls()
        old = [peer.workers, peer.exchange.slice_workers]
        peer.workers = ProfiledExecutor(profiles, peer.workers._max_workers, "bench-fetch")
        peer.exchange.workers = peer.workers
        peer.exchange.slice_workers = ProfiledExecutor(profiles, peer.exchange.slice_workers._max_workers, "bench-slice")
        for pool in old:
            pool.shutdown(wait=False)
        # and the peer's gRPC loop (its Peer server's, which its batched fetches share), from now on:
        # its idle time shows as the selector's poll
        loop_profile = cProfile.Profile()
        profiles.by_thread.append(loop_profile)
        peer.server.loop.call_soon_threadsafe(loop_profile.enable)
        return profiles

    def run(self, fn, *args, **kwargs):
        profile = getattr(self.local, "profile", None)
        if profile is None:
            profile = self.local.profile = cProfile.Profile()
            with self.lock:
                self.by_thread.append(profile)
        profile.enable()
        try:
            return fn(*args, **kwargs)
        finally:
            profile.disable()

    def __enter__(self) -> None:
        import time

        self._t0 = time.perf_counter()
        self.main.enable()

    def __exit__(self, *exc: object) -> None:
        import time

        self.main.disable()
        self.wall_s += time.perf_counter() - self._t0
        self.rounds += 1

    def report(self, limit: int = 30) -> str:
        out = io.StringIO()
        main = pstats.Stats(self.main, stream=out)
        out.write(f"calling thread only (wall {self.wall_s:.2f} s over {self.rounds} rounds), by cumulative time:\n")
        main.sort_stats("cumulative").print_stats(limit)
        merged = pstats.Stats(self.main, stream=out)
        for profile in self.by_thread:
            merged.add(profile)
        out.write(f"\nall threads merged ({1 + len(self.by_thread)} profiles; concurrent times add up), by own time:\n")
        merged.sort_stats("tottime").print_stats(limit)
        return out.getvalue()

    @staticmethod
    def write(path: str, labelled: list[tuple[str, "ThreadProfiles | None"]], header: str) -> None:
        with open(path, "w") as f:
            f.write(f"# cProfile of {header} (scripts/bench_vs_hivemind.py --profile)\n")
            for label, profiles in labelled:
                if profiles is not None and profiles.rounds:
                    f.write(f"\n## {label}\n\n{profiles.report()}")
