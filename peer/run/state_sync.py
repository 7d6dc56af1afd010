"""The swarm's state θ_r (+ the outer optimizer's global state) as content-addressed parts that
every in-sync node can serve, so a late joiner or a resyncing peer downloads it from many peers
at once instead of from the coordinator alone.

Every honest node holds a bit-identical θ_r and outer state, so every node cuts them into the
same bytes:

    part 0      a header: canonical JSON of the round, the parameter hash, the vector names and
                the state's scalar fields (e.g. the optimizer's name)
    part 1+j    slice j of every (d,) vector, in the header's order (params first), float32 LE

The coordinator signs {run, round, param_hash, sha256 and size of every part} (protocol
state_manifest); a joiner fetches each part by its sha256 from any holder, verifies it, and
rebuilds the state. A holder that vanishes mid-transfer costs a resume from the next one.
"""

from __future__ import annotations

import hashlib
import json
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from optim.slicing import SliceLayout
from protocol.payload_fetch import ChannelPool, fetch_blob
from protocol.state_manifest import StateManifest

FORMAT = "swarmloco-state-v1"


def _flatten(state: Any, prefix: str, numel: int, vectors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
    if isinstance(state, dict):
        for key in sorted(state):
            _flatten(state[key], f"{prefix}/{key}", numel, vectors, scalars)
    elif isinstance(state, torch.Tensor):
        if state.shape != (numel,):
            raise ValueError(f"state entry {prefix} has shape {tuple(state.shape)}; only ({numel},) vectors are sliced")
        vectors[prefix] = state.detach().to("cpu", torch.float32).contiguous()
    elif state is None or isinstance(state, (str, int, float, bool)):
        scalars[prefix] = state
    else:
        raise ValueError(f"state entry {prefix} is a {type(state).__name__}; cannot be part of the swarm state")


def state_parts(round_: int, param_hash: str, params: torch.Tensor, global_state: dict, layout: SliceLayout) -> list[bytes]:
    """The state's parts: [header, slice 0, ..., slice S-1] (identical bytes on every in-sync node)."""
    vectors: dict[str, torch.Tensor] = {"params": params.detach().to("cpu", torch.float32).contiguous()}
    scalars: dict[str, Any] = {}
    _flatten(global_state, "state", layout.numel, vectors, scalars)
    header = json.dumps({"format": FORMAT, "round": round_, "param_hash": param_hash, "numel": layout.numel,
                         "bounds": list(layout.bounds), "vectors": list(vectors), "scalars": scalars},
                        sort_keys=True, separators=(",", ":")).encode()
    parts = [header]
    for j in range(layout.num_slices):
        part = layout.range(j)
        parts.append(b"".join(v[part].numpy().tobytes() for v in vectors.values()))
    return parts


def part_hashes(parts: list[bytes]) -> list[str]:
    return [hashlib.sha256(p).hexdigest() for p in parts]


def rebuild(parts: list[bytes]) -> tuple[int, str, torch.Tensor, dict]:
    """[header, slices...] -> (round, param_hash, params (d,), global state dict)."""
    header = json.loads(parts[0])
    if header.get("format") != FORMAT:
        raise ValueError("not a swarmloco state header")
    layout = SliceLayout(int(header["numel"]), tuple(int(b) for b in header["bounds"]))
    names = list(header["vectors"])
    if len(parts) != layout.num_slices + 1:
        raise ValueError(f"state has {len(parts) - 1} slice parts, its header says {layout.num_slices}")
    vectors = {name: torch.empty(layout.numel, dtype=torch.float32) for name in names}
    for j, data in enumerate(parts[1:]):
        size = layout.size(j)
        if len(data) != 4 * size * len(names):
            raise ValueError(f"state part {j + 1} has {len(data)} bytes, expected {4 * size * len(names)}")
        values = torch.frombuffer(bytearray(data), dtype=torch.float32).view(len(names), size)
        for k, name in enumerate(names):
            vectors[name][layout.range(j)] = values[k]
    state: dict = {}
    for path, value in [*((p, v) for p, v in vectors.items() if p != "params"), *header["scalars"].items()]:
        keys = path.split("/")[1:]
        node = state
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return int(header["round"]), str(header["param_hash"]), vectors["params"], state


def download(pool: ChannelPool, workers: ThreadPoolExecutor, manifest: StateManifest, holders: list[str],
             fallback: str) -> list[bytes]:
    """Every part from the holders, in a random order per part (which spreads the load over
    them), the coordinator (`fallback`) last; each part checked against the signed manifest."""

    def one(index: int) -> bytes:
        order = random.sample(holders, len(holders)) + [fallback]
        return fetch_blob(pool, order, manifest.part_sha256[index], manifest.part_sizes[index])

    return list(workers.map(one, range(len(manifest.part_sha256))))


def publish(store, identity: Any, *, run_id: str, config_hash: str, round_: int, param_hash: str, params: torch.Tensor,
            global_state: dict, layout: SliceLayout, sign: bool) -> Any:
    """Serve this node's copy of the state's parts from `store` (by sha256); the coordinator
    (`sign=True`) also returns the signed state manifest for them."""
    from protocol.state_manifest import StateManifest, sign_state_manifest

    parts = state_parts(round_, param_hash, params, global_state, layout)
    hashes = part_hashes(parts)
    for sha, data in zip(hashes, parts):
        store.put_blob(sha, round_, data)
    if not sign:
        return None
    manifest = StateManifest(run_id=run_id, round=round_, param_hash=param_hash, config_hash=config_hash,
                             part_sha256=tuple(hashes), part_sizes=tuple(len(p) for p in parts))
    return sign_state_manifest(identity, manifest)
