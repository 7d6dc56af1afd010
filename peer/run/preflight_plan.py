"""What `swarmloco preflight` recommends from what it measured: pure arithmetic, shown to the user.

Per round a peer computes H inner steps (H x step time) and exchanges its update: it sends and
receives the bytes of the run's exchange (peer/run/slice_plan.expected_traffic for the sliced
exchange: about r payloads plus one aggregate each way; all-to-all: every other peer's payload
in) and waits for about ROUND_TRIPS sequential round trips (commit, manifest, slice results,
gather). Communication stays under TARGET of compute when

    comm(codec) = sent / upload + received / download + ROUND_TRIPS x RTT  <=  TARGET x H x step
    so  H >= comm(codec) / (TARGET x step), rounded up to a whole number of steps (at least 1).

Communication overlapped with compute (--overlap) hides it instead; this is the budget without that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from peer.run.slice_plan import expected_traffic

TARGET = 0.05  # communication at most 5% of compute
ROUND_TRIPS = 6
MAX_H = 500  # DiLoCo's largest tested H; beyond it the outer step's quality drops
CANDIDATES = ("fp32", "fp16", "int8", "int4")  # dense codecs, least lossy first (every aggregator accepts them)


@dataclass(kw_only=True, slots=True)
class Link:
    rtt_s: float
    upload_bytes_per_s: float
    download_bytes_per_s: float
    dial_back: bool | None = None  # None: not checked (--skip-dial-back)
    dial_address: str = ""
    dial_error: str = ""

    def __post_init__(self) -> None:
        if self.upload_bytes_per_s <= 0 or self.download_bytes_per_s <= 0 or self.rtt_s < 0:
            raise ValueError("throughputs must be positive and the RTT non-negative")


@dataclass(kw_only=True, slots=True)
class Swarm:
    """The run's side: its codec, H, exchange, and how many peers take part."""

    codec: str
    inner_steps: int
    peers: int
    sliced: bool = True
    replicas: int = 2
    num_slices: int = 32
    spot_checks: int = 1
    coverage: float = 2.0
    payload_bytes: dict[str, int] = field(default_factory=dict)  # codec -> encoded update size
    numel: int = 0


def traffic(swarm: Swarm, codec: str) -> tuple[float, float]:
    """(sent, received) bytes of one peer in one round with `codec`."""
    payload = swarm.payload_bytes[codec]
    n = max(2, swarm.peers)
    if not swarm.sliced:
        return float(payload), float((n - 1) * payload)
    result = swarm.numel * (4 if codec == "fp32" else 2)  # aggregated slices: fp32 when lossless, else fp16
    t = expected_traffic(n, payload, result, swarm.replicas, spot_checks=swarm.spot_checks, coverage=swarm.coverage,
                         num_slices=swarm.num_slices)
    return t["sent"], t["received"]


def plan_row(link: Link, swarm: Swarm, codec: str, step_s: float) -> dict[str, Any]:
    sent, received = traffic(swarm, codec)
    comm = sent / link.upload_bytes_per_s + received / link.download_bytes_per_s + ROUND_TRIPS * link.rtt_s
    h_min = comm / (TARGET * step_s)
    return {"codec": codec, "payload_bytes": swarm.payload_bytes[codec], "sent_bytes": round(sent), "received_bytes": round(received),
            "comm_s": comm, "h_min": h_min, "h_min_steps": whole_steps(h_min), "share_at_run_h": comm / (swarm.inner_steps * step_s)}


def whole_steps(h: float) -> int:
    """The least whole number of inner steps >= h (at least 1: a round trains at least one step)."""
    return max(1, math.ceil(h - 1e-9))  # 1e-9: 20.000000000001 from float noise is still 20


def _g(x: float) -> str:
    """x with 3 significant digits, never rounded to 0 (0.00042, 0.249, 12.4, 1.2e+03)."""
    return f"{x:.3g}"


def _nice(h: float) -> int:
    """Round a minimum H up to a number people type: a multiple of 5 (of 50 past 100)."""
    step = 50 if h > 100 else 5
    return max(step, int(math.ceil(h / step) * step))


def recommend(link: Link, swarm: Swarm, step_s: float) -> dict[str, Any]:
    codecs = [swarm.codec] + [c for c in CANDIDATES if c != swarm.codec and c in swarm.payload_bytes]
    rows = [plan_row(link, swarm, codec, step_s) for codec in codecs]
    current = rows[0]
    if current["h_min"] <= swarm.inner_steps:
        choice = {"codec": swarm.codec, "inner_steps": swarm.inner_steps,
                  "why": f"the run's codec and H keep communication at {_g(100 * current['share_at_run_h'])}% of compute"}
    else:
        fitting = [r for r in rows if r["h_min"] <= MAX_H]
        if fitting:
            best = fitting[0]  # the run's codec when a larger H suffices, else the least lossy that fits
            choice = {"codec": best["codec"], "inner_steps": max(swarm.inner_steps, _nice(best["h_min"])),
                      "why": f"the {'run' if best is current else 'least lossy'} codec that stays under {100 * TARGET:.0f}% with H <= {MAX_H}"}
        else:
            best = min(rows, key=lambda r: r["h_min"])
            choice = {"codec": best["codec"], "inner_steps": _nice(best["h_min"]),
                      "why": f"no codec here stays under {100 * TARGET:.0f}% with H <= {MAX_H}: this link is slow for this model "
                             "(use --overlap, or a smaller model)"}
    client_mode = {"recommended": link.dial_back is False,
                   "why": ("the coordinator could not dial back " + link.dial_address + f" ({link.dial_error}): other peers cannot "
                           "fetch from you; join with --client-mode (or open/forward the port)") if link.dial_back is False else
                   ("the coordinator reached " + link.dial_address + ": serve updates normally (no --client-mode)") if link.dial_back else
                   "not checked"}
    return {"rows": rows, "choice": choice, "client_mode": client_mode, "target": TARGET, "round_trips": ROUND_TRIPS, "max_h": MAX_H,
            "arithmetic": arithmetic(link, swarm, step_s, rows)}


def arithmetic(link: Link, swarm: Swarm, step_s: float, rows: list[dict[str, Any]]) -> list[str]:
    up, down = link.upload_bytes_per_s, link.download_bytes_per_s
    lines = [f"compute per round = H x {_g(step_s)} s; budget: communication <= {100 * TARGET:.0f}% of it",
             f"exchange: {'sliced' if swarm.sliced else 'all-to-all'}, {max(2, swarm.peers)} peers"
             + (f", r = {swarm.replicas} owners per slice" if swarm.sliced else "")]
    for r in rows:
        lines.append(f"{r['codec']:>5}: {_g(r['sent_bytes'] / 1e6)} MB / {_g(up / 1e6)} MB/s + {_g(r['received_bytes'] / 1e6)} MB / "
                     f"{_g(down / 1e6)} MB/s + {ROUND_TRIPS} x {_g(link.rtt_s)} s = {_g(r['comm_s'])} s"
                     f"  ->  H >= {_g(r['comm_s'])} s / ({TARGET:g} x {_g(step_s)} s) = {_g(r['h_min'])}, so H >= {r['h_min_steps']}"
                     f"  (at the run's H = {swarm.inner_steps}: {_g(100 * r['share_at_run_h'])}%)")
    return lines
