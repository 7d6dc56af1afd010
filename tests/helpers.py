"""What several test files share, in one place: the tiny run config, a free loopback port,
reading a real swarm's children (a line they print, the JSON summary they write, the coordinator's
status), a fault-hook gate that holds a swarm at an exact point, and the process tree of a child
(Linux /proc: what it started, whether any of it is left, and the TCP ports it listens on).

Fixtures live in tests/conftest.py; this module holds plain functions, imported by name."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The tests' small, fast run: ~60k parameters, 8 inner steps, a 1 MB corpus; rounds close in
# about a second on 2 busy cores, and 3 rounds of 3 peers lower the validation loss by > 0.05.
TINY_SECTIONS: dict[str, dict] = {
    "model": {"d_model": 64, "n_layer": 1, "n_head": 2, "seq_len": 64},
    "data": {"batch_size": 4, "val_batches": 4, "max_corpus_bytes": 1_000_000},
    "inner": {"steps": 8, "warmup_steps": 4},
    "rounds": {"rounds": 3, "min_deadline_s": 2.0, "deadline_s": 30.0, "peer_timeout_s": 6.0},
}


def tiny_run_config(**sections):
    """The tiny RunConfig; each keyword is a section whose dict updates the tiny values
    (`rounds={"rounds": 4}`), or a top-level field (`seed=3`)."""
    from peer.run.config import RunConfig

    data = RunConfig().to_dict()
    for section, values in TINY_SECTIONS.items():
        data[section].update(values)
    for section, values in sections.items():
        if isinstance(values, dict):
            data[section].update(values)
        else:
            data[section] = values
    return RunConfig.from_dict(data)


def tiny_simulation_config(**sections):
    """tiny_run_config with a smaller model still: `swarmloco simulate` runs it in-process, often."""
    return tiny_run_config(seed=3, model={"seq_len": 32, "d_model": 32}, data={"batch_size": 8, "max_corpus_bytes": 300_000},
                           inner={"lr": 3e-3}, **sections)


# A BPE run as small as the byte-level one: a llama whose vocabulary is the trained tokenizer's.
BPE_TINY = {"model": {"arch": "llama", "d_model": 32, "n_layer": 1, "n_head": 2, "seq_len": 32, "vocab_size": 0},
            "data": {"tokenizer": "bpe", "bpe_vocab_size": 512, "max_corpus_bytes": 150_000}}


def bpe_config(path, model=None, **sections):
    """tiny_run_config with a 512-token BPE tokenizer trained on the text folder `path`."""
    return tiny_run_config(model={**BPE_TINY["model"], **(model or {})}, data={**BPE_TINY["data"], "path": str(path)}, **sections)


def text_folder(path: Path, skip: int, size: int = 160_000) -> Path:
    """A folder of stdlib sources (skipping the first `skip` files) of about `size` bytes."""
    from peer.learn.data import stdlib_sources

    _, files = stdlib_sources()
    path.mkdir()
    total = 0
    for i, source in enumerate(files[skip:]):
        shutil.copyfile(source, path / f"{i:04d}.py")
        total += source.stat().st_size
        if total > size:
            break
    return path


# Every codec spec form the codec tests run through (value formats, sparsifiers, chains).
ALL_CODEC_SPECS = [
    "fp32", "fp16", "bf16", "int8", "int4", "int2", "int8:128",
    "topk:0.01", "topk:0.3", "topk:0.01+int8", "chunk-topk:64:4", "chunk-topk:300:20+int4",
    "randk:0.1", "randk:0.1+fp16", "dct-topk:64:4", "dct-topk:64:4+int8", "dct-topk:512:16+int2",
    "sign", "sign:7", "topk:0.01+sign", "chunk-topk:32:1+sign", "randk:0.2+sign",
    "stat2", "stat2:64", "chunk-topk:512:8+stat2", "chunk-topk:64:4+stat2:16",
]


def vector(d: int, seed: int = 0):
    """(d,) float32 standard-normal values, the same for the same seed."""
    import torch

    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def round_trip(spec: str, x, seed: int = 0):
    """x through the codec `spec` and back; the payload fits the codec's max_encoded_size and says
    its own length (encoded_length), even with other bytes after it."""
    from optim.codecs import build

    codec = build(spec)
    payload = codec.encode(x, seed=seed)
    assert len(payload) <= codec.max_encoded_size(x.numel())
    assert codec.encoded_length(payload + b"\xff" * 9, x.numel()) == len(payload)
    return codec.decode(payload, x.numel(), seed=seed)


def rice_stream(gaps: list[int], b: int) -> bytes:
    """The Rice-coded index part of optim/index_coding.py written one bit at a time from its
    docstring, for any gaps (also ones its encoder would refuse): remainders at b bits, then
    each quotient as that many zero bits and a one bit, each stream zero-padded to a byte."""
    remainders = 0
    for i, gap in enumerate(gaps):
        remainders |= (gap & ((1 << b) - 1)) << (i * b)
    unary, bit = 0, 0
    for gap in gaps:
        bit += gap >> b
        unary |= 1 << bit
        bit += 1
    return remainders.to_bytes(ceil_div(len(gaps) * b, 8), "little") + unary.to_bytes(ceil_div(bit, 8), "little")


def chunk_gaps(offsets: list[int], k: int) -> list[int]:
    """Gaps of flat per-chunk offsets (entries [c*k, c*k + k) in chunk c): o_0, o_i - o_{i-1} - 1."""
    return [o - (-1 if i % k == 0 else offsets[i - 1]) - 1 for i, o in enumerate(offsets)]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def token_batch(rows: int = 8, T: int = 16, seed: int = 0):
    """(x, y): (rows, T) random byte tokens and the same shifted by one (next-token targets)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (rows, T + 1), generator=g)
    return data[:, :-1], data[:, 1:]


class FixedSampler:
    """A sampler whose every batch is the same (x, y): for trainers that must see one batch only."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def next_batch(self):
        return self.x, self.y


def simulate(**options) -> dict:
    """`swarmloco simulate` in-process (SimulationOptions keywords), on the tiny simulation
    config and one thread unless told otherwise; its result dict."""
    from peer.cli.simulate import SimulationOptions, run_simulation

    options.setdefault("config", tiny_simulation_config())
    options.setdefault("threads", 1)
    return run_simulation(SimulationOptions(**options))


def assert_md_regenerates(main, args: list[str], md_name: str, tmp_path: Path, out_flag: str = "--md") -> str:
    """benchmarks/<md_name>'s tables (all above its `<!-- notes -->`) come out exactly from its JSON:
    `main([*args, out_flag, TMP])` writes them again. Returns the committed tables."""
    notes = "<!-- notes -->"
    out = tmp_path / md_name
    assert main([*args, out_flag, str(out)]) == 0
    committed = (ROOT / "benchmarks" / md_name).read_text().split(notes)[0]
    assert out.read_text().split(notes)[0] == committed
    return committed


def write_run_config(path: Path, **sections) -> Path:
    """tiny_run_config(**sections) written as a config file for the CLI (`--config PATH`)."""
    path.write_text(json.dumps(tiny_run_config(**sections).to_dict()))
    return path


# Ports handed out by free_port: below Linux's ephemeral range (32768+), where the kernel never
# gives a port to a socket bound to 0 or to an outgoing connection, in one block per xdist worker
# and in turn within it, so no other test or process takes a port between free_port() and the bind
# (a port picked by binding to 0 could be reused by any other test's child at once).
_PORT_BASE, _PORT_BLOCK = 20_000, 1_500
_next_port: list[int] = []


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and no other test of this run
    will be handed (for a flag that needs a fixed one)."""
    if not _next_port:
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
        _next_port.append(_PORT_BASE + (worker % 8) * _PORT_BLOCK + (os.getpid() % 50) * 20)
    block_start = _PORT_BASE + (_next_port[0] - _PORT_BASE) // _PORT_BLOCK * _PORT_BLOCK
    for _ in range(_PORT_BLOCK):
        port = _next_port[0]
        _next_port[0] = block_start + (port + 1 - block_start) % _PORT_BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use (or lingering from an earlier run): the next one
                continue
            return port
    raise RuntimeError(f"no free port in {block_start}-{block_start + _PORT_BLOCK - 1}")


def assert_closing_releases_a_fetch_in_flight(pool, wanted: list) -> None:
    """A batched fetch from a holder that accepts and never answers, and `pool` closed while it is
    in flight (a node shutting down): the caller is released at once with nothing fetched."""
    import threading

    from protocol.batched_fetch import fetch_items

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # accepts, never answers
    got: list = []
    fetching = threading.Thread(target=lambda: got.append(fetch_items(pool, f"127.0.0.1:{silent.getsockname()[1]}", wanted)))
    try:
        fetching.start()
        time.sleep(0.5)
        assert fetching.is_alive()  # in flight: the holder is silent and the stall bound is 5 s
        pool.close()
        fetching.join(10)
        assert not fetching.is_alive() and got == [[None] * len(wanted)]
    finally:
        silent.close()


def wait_line(child, pattern: str, timeout_s: float) -> re.Match:
    """The first match of `pattern` in a Swarm child's output so far, waiting up to `timeout_s`;
    an AssertionError with the child's last output when it never prints it (or exits first: its
    `pump` thread, which reads its output, has ended)."""
    deadline = time.monotonic() + timeout_s
    regex = re.compile(pattern)
    while time.monotonic() < deadline:
        read_to_end = not child.pump.is_alive()  # EOF: it exited, and every line it wrote is in
        match = regex.search("".join(child.lines))
        if match:
            return match
        if read_to_end:
            break
        time.sleep(0.05)
    raise AssertionError(f"{child.name} never printed {pattern!r}:\n{''.join(child.lines)[-3000:]}")


def read_summary(swarm, name: str) -> dict:
    """The JSON summary the Swarm child `name` wrote when it exited (coordinator, standby or peer)."""
    return json.loads((swarm.workdir / f"{name}.json").read_text())


def wait_run_end(swarm, coordinator, peers, *, within_s: float = 240.0, peers_within_s: float = 60.0) -> None:
    """The run ends cleanly: the coordinator (a Swarm child) exits 0 within `within_s`, then each
    of `peers` within `peers_within_s`; an AssertionError with the tail of its output when one does not."""
    assert swarm.wait(coordinator, within_s) == 0, f"{coordinator.name}:\n" + "".join(coordinator.lines)[-3000:]
    for peer in peers:
        assert swarm.wait(peer, peers_within_s) == 0, f"{peer.name}:\n" + "".join(peer.lines)[-2000:]


def wait_status(endpoint: str, fact, timeout_s: float) -> dict:
    """The coordinator's status (its Status RPC) once `fact(status)` holds, asked again until then;
    an AssertionError with the last status when it does not within `timeout_s`."""
    from peer.cli.status import fetch_status

    deadline = time.monotonic() + timeout_s
    status: dict = {}
    while time.monotonic() < deadline:
        try:
            status = fetch_status(endpoint)
        except Exception:  # noqa: BLE001 - not answering yet
            status = {}
        if status and fact(status):
            return status
        time.sleep(0.2)
    raise AssertionError(f"{endpoint}: status never showed the fact within {timeout_s:.0f} s; last: {json.dumps(status)[:2000]}")


class Gate:
    """A fault-hook gate (peer/run/faults.py `wait=PATH`): every child started with `fault` in
    SWARMLOCO_FAIL_AT stops at `phase` of round `round` until `open()` creates the file, so a
    test holds a swarm at an exact point while something slow (a process start) happens, instead
    of hoping it happens in time. `reached(child)` waits for the child's word that it is there."""

    def __init__(self, path: Path, phase: str, round_: int) -> None:
        self.path, self.phase, self.round = path, phase, round_

    @property
    def fault(self) -> str:
        return f"{self.phase}:{self.round}:wait={self.path}"

    def reached(self, child, timeout_s: float) -> None:
        wait_line(child, re.escape(f"reached {self.phase}:{self.round}, waiting for {self.path}"), timeout_s)

    def open(self) -> None:
        self.path.touch()



def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) of a process, None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # "pid (comm) state ppid ...": comm may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def process_tree(root: int) -> dict[int, int]:
    """pid -> start time of `root` and all its descendants, whatever their process group (the
    start time tells a reused pid apart)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if (stat := _stat(pid)) is not None:
            found[pid] = stat[2]
            todo.extend(children.get(pid, []))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_alive(pid: int, started: int) -> bool:
    """Is the process `pid` that started at `started` still running (a zombie is dead, only not yet reaped)?"""
    stat = _stat(pid)
    return stat is not None and stat[2] == started and stat[1] != "Z"


def still_running(processes: dict[int, int], within_s: float) -> dict[int, str]:
    """pid -> command line of those of `processes` (a process_tree) still running after up to `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        alive = {pid: cmdline(pid) for pid, started in processes.items() if process_alive(pid, started)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def kill_tree(processes: dict[int, int]) -> None:
    """SIGKILL every process of `processes` (a process_tree) still running: a failed test's cleanup."""
    for pid, started in processes.items():
        if process_alive(pid, started):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def listening_ports(pid: int) -> set[tuple[str, int]]:
    """(protocol, port) of the TCP sockets process `pid` listens on (seen in its own namespace)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):  # closed meanwhile
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    except OSError:
        return set()
    found = set()
    for proto in ("tcp", "tcp6"):
        for row in _tcp_rows(f"/proc/{pid}/net/{proto}"):
            if row[3] == "0A" and row[9] in inodes:
                found.add((proto, int(row[1].rsplit(":", 1)[1], 16)))
    return found


def _tcp_rows(path: str) -> list[list[str]]:
    try:
        return [line.split() for line in Path(path).read_text().splitlines()[1:]]
    except OSError:
        return []


def host_listening(ports: set[tuple[str, int]]) -> list[str]:
    """Those of `ports` something in this (the host's) namespace still listens on."""
    listening = {(proto, int(row[1].rsplit(":", 1)[1], 16)) for proto in ("tcp", "tcp6")
                 for row in _tcp_rows(f"/proc/self/net/{proto}") if row[3] == "0A"}
    return sorted(f"{proto}:{port}" for proto, port in ports & listening)
