"""The worker processes of scripts/bench_vs_hivemind.py and the pool that drives them.

Each of N worker processes hosts BOTH systems: a hivemind DHT + DecentralizedAverager (started
first: hivemind forks, gRPC is not fork-safe) and, per swarmloco variant timed, an ExchangePeer of
scripts/exchange_round.py. The parent (WorkerPool) plays the coordinator: it verifies the headers,
signs the manifest and relays the slice results; each round starts at a shared barrier.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import threading
import time
from dataclasses import asdict

PRECISIONS = {  # wire precision -> (swarmloco codec, hivemind compression class)
    "fp32": ("fp32", "NoCompression"),
    "fp16": ("fp16", "Float16Compression"),
    "8-bit": ("int8", "Uniform8BitQuantization"),
}
MATCH_DEADLINE_S = 60.0  # a hivemind matchmaking (or all-reduce) not done by then is cancelled and the round tried again
HIVEMIND_TRIES = 3
AVERAGE_TOLERANCE = 0.05  # |hivemind's average - the exact mean| above this: a partial all-reduce (fp16 rounding is ~3e-3)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # /proc's CPU times are in these
SPLIT_KEYS = ("encode_s", "manifest_s", "reduce_s", "results_s", "gather_s")



def run_worker(rank: int, n: int, numel: int, precision: str, spec_fields: list[dict], conn, barrier, match_s: float,
            profile_path: str) -> None:
    parent = os.getppid()
    os.setsid()  # own process group: the parent can kill hivemind's p2pd with us
    _die_with(parent)
    mp.set_start_method("fork", force=True)  # hivemind forks its DHT and averager processes
    import gc
    import hashlib
    import resource

    import torch
    import hivemind
    from hivemind.averaging.control import AveragingStage

    torch.set_num_threads(1)
    initial_peers = conn.recv()
    dht = hivemind.DHT(initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    if rank == 0:
        conn.send([str(m) for m in dht.get_visible_maddrs()])

    def update_of(r: int) -> torch.Tensor:
        return torch.randn(numel, generator=torch.Generator().manual_seed(r))  # (d,) peer r's update

    local = update_of(rank)
    exact_mean = sum(update_of(r) for r in range(n)) / n  # (d,) what both systems must compute
    compression = getattr(hivemind.compression, PRECISIONS[precision][1])()
    averager = hivemind.averaging.DecentralizedAverager(
        [local.clone()], dht, start=True, prefix="bench", target_group_size=n, min_group_size=n,
        min_matchmaking_time=match_s, request_timeout=max(0.5, match_s / 2), compression=compression,
        allreduce_timeout=MATCH_DEADLINE_S,  # a stuck all-reduce lets go of the averaged tensors (and the round is tried again)
    )

    # gRPC only now: hivemind's DHT and averager have forked their children.
    from exchange_round import ExchangePeer, ExchangeSpec
    from profiling import ThreadProfiles

    specs = [ExchangeSpec(**fields) for fields in spec_fields]
    peers = [ExchangePeer(local, spec) for spec in specs]
    profiles = [ThreadProfiles.attach(p) if profile_path and rank == 0 else None for p in peers]
    gc.freeze()  # as peer/node/node.py's Node.run does once the node is set up
    from peer.run.process_memory import keep_freed_memory

    keep_freed_memory()  # as Node.run does too; hivemind's averager forked before: its process keeps glibc's defaults
    pids = session_pids()  # whose CPU a round is charged
    conn.send(("ready", [(p.peer_id, p.endpoint) for p in peers]))

    gc_s = [0.0, 0.0]  # [start of the collection under way, seconds collected this round]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_s[0] = time.perf_counter()
        else:
            gc_s[1] += time.perf_counter() - gc_s[0]

    gc.callbacks.append(on_gc)

    def swarm_round(i: int, round_: int, coordinator_key: bytes) -> dict:
        peer, profile = peers[i], profiles[i]
        # The CPU counters are read outside the barriers (before the first, after the second): read
        # inside, ~1 ms of /proc reads per worker ran on the shared cores in other workers' rounds.
        threads0 = thread_cpu_s()
        s0 = cpu_s(pids)
        barrier.wait()
        before = peer.counter.total()
        gc_s[:] = [0.0, 0.0]
        t0 = time.perf_counter()
        with profile or _nothing():
            conn.send(("header", *peer.commit(round_)))
            t_encoded = time.perf_counter()
            signed_manifest = conn.recv()
            t_manifest = time.perf_counter()
            peer.open(signed_manifest, coordinator_key, round_)
            conn.send(("results", peer.reduce()))
            t_reduced = time.perf_counter()
            results = conn.recv()
            t_results = time.perf_counter()
            params = peer.gather(results, round_)
            t_end = time.perf_counter()
        after = peer.counter.total()
        outcome = peer.outcome
        barrier.wait(timeout=300)  # the checks below run once every worker's round is over, not inside a slower one's
        s1 = cpu_s(pids)
        threads1 = thread_cpu_s()
        return {
            "round_s": t_end - t0, "encode_s": t_encoded - t0, "manifest_s": t_manifest - t_encoded,
            "reduce_s": t_reduced - t_manifest, "results_s": t_results - t_reduced, "gather_s": t_end - t_results,
            "max_abs_error": float((params + exact_mean).abs().max()),  # fedavg lr 1 stepped θ = 0 to -aggregate
            "params_sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
            "payload_bytes": len(peer.payload), "sent_bytes": after.sent - before.sent,
            "received_bytes": after.received - before.received,
            "recomputed": len(outcome.recomputed) if outcome is not None else 0,
            "liars": len(outcome.liars) if outcome is not None else 0,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "cpu_s": s1 - s0, "gc_s": gc_s[1], "thread_cpu_s": cpu_by_kind(threads0, threads1),
        }

    def hivemind_round() -> dict:
        """One try. A matchmaking that does not form its group of n within MATCH_DEADLINE_S is
        cancelled (every worker still meets the barriers), and the round comes back not `formed`:
        the parent runs it again (WorkerPool.hivemind_round) instead of waiting out hivemind's
        own step timeout on a group that never forms."""
        with averager.get_tensors() as tensors:
            tensors[0].copy_(local)
        control = averager.step(require_trigger=True, wait=False, timeout=120)
        deadline = time.monotonic() + MATCH_DEADLINE_S
        while control.stage != AveragingStage.AWAITING_TRIGGER and not control.done() and time.monotonic() < deadline:
            time.sleep(0.005)
        matched = control.stage == AveragingStage.AWAITING_TRIGGER
        if not matched:
            control.cancel()
        s0 = cpu_s(pids)  # outside the barriers, as swarm_round's
        barrier.wait(timeout=300)
        t0 = time.perf_counter()
        group = None
        if matched:
            control.allow_allreduce()
            try:
                group = control.result(timeout=MATCH_DEADLINE_S)
            except Exception:  # noqa: BLE001 - a failed or timed-out all-reduce: the parent retries the round
                control.cancel()
        t_end = time.perf_counter()
        barrier.wait(timeout=300)  # as swarm_round: the check after every worker's round
        s1 = cpu_s(pids)
        with averager.get_tensors() as tensors:
            error = float((tensors[0] - exact_mean).abs().max())
        return {"round_s": t_end - t0, "group_size": len(group) if group else 0, "max_abs_error": error, "cpu_s": s1 - s0,
                # a partial all-reduce ("received 78.6% results") averages wrong: not a round of hivemind's either
                "formed": group is not None and len(group) == n and error <= AVERAGE_TOLERANCE}

    try:
        while True:
            command = conn.recv()
            if command[0] == "stop":
                break
            if command[0] == "swarm":
                conn.send(("result", swarm_round(*command[1:])))
            elif command[0] == "hivemind":
                conn.send(("result", hivemind_round()))
    finally:
        if profile_path and rank == 0:
            ThreadProfiles.write(profile_path, [(s.label, p) for s, p in zip(specs, profiles)],
                                 header=f"worker 0 of {n} peers x {numel:,} floats, {precision}")
        for p in peers:
            p.close()
        averager.shutdown()
        dht.shutdown()


def _die_with(parent: int) -> None:
    """Kill this worker's whole process group (hivemind's DHT, averager and p2pd children too)
    once `parent` is gone: a bench killed by a signal it cannot catch (SIGKILL, a timeout's second
    signal) must not leave setsid'd workers behind, out of reach of its terminal and its group."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(os.getpgid(0), 9)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def session_pids() -> list[int]:
    """The processes of this worker's session (it calls setsid): the worker, hivemind's DHT and
    averager children, their p2pd daemons; read once they are all started."""
    sid, pids = os.getsid(0), []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(_stat_fields(int(entry))[3]) == sid:  # field 6 of stat: the session
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system, every thread) these processes used so far. Both systems' rounds
    are charged the same background (the other system's idle processes)."""
    return sum(_cpu_of(str(pid)) for pid in pids)


def thread_cpu_s() -> dict[int, float]:
    """CPU seconds so far of each thread of this process, by native thread id."""
    return {int(tid): _cpu_of(f"self/task/{tid}") for tid in os.listdir("/proc/self/task")}


def _cpu_of(proc: str) -> float:
    """User + system CPU seconds of /proc/PROC (a process, or self/task/TID); 0 once it is gone."""
    try:
        fields = _stat_fields(proc)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_by_kind(before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """The worker's CPU seconds between two thread_cpu_s() by kind of thread: the Python thread's
    name without its number (swarmloco-rpc-loop, swarmloco-slice, MainThread, ...), "native" for
    threads Python did not start (gRPC's event engine and timers)."""
    names = {t.native_id: re.sub(r"[_-]?\d+$", "", t.name) for t in threading.enumerate()}
    kinds: dict[str, float] = {}
    for tid, cpu in after.items():
        kind = names.get(tid, "native")
        kinds[kind] = kinds.get(kind, 0.0) + cpu - before.get(tid, 0.0)
    return {k: round(v, 4) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v > 0}


def _stat_fields(proc: int | str) -> list[str]:
    """/proc/PROC/stat after the command name: fields[0] is the state (field 3)."""
    with open(f"/proc/{proc}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# --- parent ---------------------------------------------------------------------------------


class WorkerPool:
    """N workers that each host swarmloco peers and a hivemind averager; the parent is the coordinator."""

    def __init__(self, n: int, numel: int, precision: str, specs: list, match_s: float, profile_path: str = "") -> None:
        from exchange_round import BenchCoordinator

        ctx = mp.get_context("spawn")
        self.barrier = ctx.Barrier(n)
        self.conns, self.procs = [], []
        self.rounds = 0
        try:
            for rank in range(n):
                parent_end, child_end = ctx.Pipe()
                proc = ctx.Process(target=run_worker, args=(rank, n, numel, precision, [asdict(s) for s in specs], child_end, self.barrier, match_s, profile_path))
                proc.start()
                self.conns.append(parent_end)
                self.procs.append(proc)
                if rank == 0:
                    parent_end.send([])
                    initial = self._recv(parent_end, 120)
                else:
                    parent_end.send(initial)
            for c in self.conns:
                self._recv(c, 180)
            # gRPC in the parent only after every worker has forked its hivemind children.
            self.coordinators = [BenchCoordinator(spec, numel) for spec in specs]
        except BaseException:
            self.close()
            raise

    def _recv(self, conn, timeout_s: float):
        if not conn.poll(timeout_s):
            raise TimeoutError(f"a benchmark worker did not answer within {timeout_s:.0f}s (overloaded machine?)")
        return conn.recv()

    def swarm_round(self, i: int) -> tuple[list[dict], float]:
        """One round of variant i; (each worker's figures, the coordinator's manifest seconds)."""
        self.rounds += 1
        coordinator = self.coordinators[i]
        for c in self.conns:
            c.send(("swarm", i, self.rounds, coordinator.public_key))
        headers = [tuple(self._recv(c, 300)[1:]) for c in self.conns]
        t = time.perf_counter()
        signed_manifest = coordinator.manifest(headers, self.rounds)
        coordinator_s = time.perf_counter() - t
        for c in self.conns:
            c.send(signed_manifest)
        results = [r for c in self.conns for r in self._recv(c, 600)[1]]
        for c in self.conns:
            c.send(results)
        return [self._recv(c, 600)[1] for c in self.conns], coordinator_s

    def hivemind_round(self) -> list[dict]:
        """One hivemind round; a try whose group did not form on every worker (a matchmaking that
        never completed, an all-reduce that failed part-way or averaged only part of the peers'
        parts) is run again, up to HIVEMIND_TRIES."""
        for attempt in range(1, HIVEMIND_TRIES + 1):
            for c in self.conns:
                c.send(("hivemind",))
            results = [self._recv(c, 600)[1] for c in self.conns]
            if all(r["formed"] for r in results):
                return results
            print(f"  hivemind: the group did not form on every worker (try {attempt} of {HIVEMIND_TRIES}): running the round again",
                  flush=True)
        raise RuntimeError(f"hivemind's averaging group of {len(self.conns)} did not form in {HIVEMIND_TRIES} tries")

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 20
        for p in self.procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive() or p.pid:
                try:
                    os.killpg(p.pid, 9)  # the worker's group: p2pd daemons and averager children too
                except (ProcessLookupError, PermissionError):
                    pass
            p.join(timeout=5)
