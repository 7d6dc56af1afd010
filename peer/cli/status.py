"""`swarmloco status`: the coordinator's view of the run, as a table or JSON; `--watch` redraws it in place.

Imports neither torch nor hivemind (a test checks), so it answers in a fraction of a second.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import grpc

from peer.run.progress import format_bytes
from protocol.wire import swarm_pb2, swarm_pb2_grpc
from protocol.channels import CONNECT_TIMEOUT, DEFAULT_DEADLINE, create_channel, wait_ready

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


def fetch_status(endpoint: str, connect_timeout: timedelta = CONNECT_TIMEOUT) -> dict:
    channel = create_channel(endpoint)
    try:
        wait_ready(channel, endpoint, connect_timeout)
        reply = swarm_pb2_grpc.CoordinatorStub(channel).Status(swarm_pb2.StatusRequest(), timeout=DEFAULT_DEADLINE.total_seconds())
        return json.loads(reply.json)
    finally:
        channel.close()


def print_status(endpoint: str, *, as_json: bool, connect_timeout_s: float | None = None, watch_s: float | None = None) -> int:
    """Print the status once, or (watch_s) redraw it every watch_s seconds until ^C."""
    timeout = CONNECT_TIMEOUT if connect_timeout_s is None else timedelta(seconds=connect_timeout_s)
    if watch_s is not None:
        return watch(endpoint, timeout, watch_s, as_json)
    try:
        status = fetch_status(endpoint, timeout)
    except grpc.RpcError as exc:
        print(f"swarmloco status: {endpoint} answered {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if as_json else status_table(status))
    return 0


def watch(endpoint: str, timeout: timedelta, every_s: float, as_json: bool) -> int:
    """Redraw in place until ^C; a coordinator that stops answering is shown as such and asked again."""
    try:
        while True:
            try:
                status = fetch_status(endpoint, timeout)
                text = json.dumps(status, indent=2) if as_json else status_table(status)
            except (grpc.RpcError, ConnectionError) as exc:
                text = f"{endpoint}: {exc.details() if isinstance(exc, grpc.RpcError) else exc} (asking again)"
            sys.stdout.write(f"{CLEAR}{text}\n\n{time.strftime('%H:%M:%S')} | every {every_s:g}s | ^C to stop\n")
            sys.stdout.flush()
            time.sleep(every_s)
    except KeyboardInterrupt:
        return 0


def status_table(status: dict) -> str:
    state = "finished" if status["finished"] else "running"
    lines = [f"run {status['run_id']} | {state} | round {status['round']}/{status['rounds']} | hash {status['param_hash'][:12]} | "
             f"codec {status['codec']} | outer {status['outer']} | aggregator {status['aggregator']} | deadline {status['deadline_s']}s"]
    coordinator = status.get("coordinator") or {}
    if coordinator:
        heard = coordinator.get("standbys")
        if heard:  # the standbys that heartbeat this coordinator: the round each holds
            standbys = ", ".join(f"{s['fingerprint'][:8]} at {s['endpoint'] or '-'} (holds round {s['holding_round']}"
                                 f"{'' if s['counted'] else ', not counted'})" for s in heard)
        else:
            standbys = ", ".join(coordinator.get("standby_endpoints") or []) or "none"
        lease = (coordinator.get("lease") or {}).get("lease_s")
        lines.append(f"coordinator {coordinator['fingerprint'][:16]} (term {coordinator['term']}"
                     f"{f', lease {lease:g}s' if lease else ''}) | run keys {len(coordinator.get('coordinators') or [])} | standbys: {standbys}")
    if status["history"]:
        last = status["history"][-1]
        lines.append(f"last round {last['round'] + 1}: {last['updates']} updates, val loss {last['val_loss']:.4f} "
                     f"(initial {status['initial_val_loss']:.4f}), {last['seconds']:.1f}s")
    lines.append(f"{'peer':10} {'state':11} {'round':>5} {'in sync':>7} {'sent':>10} {'recv':>10} {'last round sent/recv':>22} {'util':>5}  note")
    for p in status["peers"]:
        in_sync = "yes" if p["param_hash"] == status["param_hash"] else "no"
        util = f"{100 * p['utilization']:.0f}%" if p["utilization"] is not None else "-"
        note = p["banned_reason"] or p["excluded_reason"]
        if p.get("left_out_without_reason"):  # the peer's word: censorship made visible
            note = (note + " " if note else "") + f"left out without a reason in round(s) {p['left_out_without_reason']}"
        agg = p.get("aggregation") or {}
        if agg:
            if "distance_to_aggregate" in agg:
                note = (note + " " if note else "") + f"weight {agg['weight']:.2f} dist {agg['distance_to_aggregate']:.3g}"
            else:  # sliced exchange: the share of slices its update took part in
                note = (note + " " if note else "") + f"in {round(agg['weight'] * agg['slices'])}/{agg['slices']} slices"
        work = p.get("work") or {}
        if work:  # the work its last listed update signed, and that update's share of the round
            capped = f" capped by {work['capped_by']}" if work.get("capped_by") else ""
            note = (note + " " if note else "") + f"work {work['inner_steps']} steps/{work['tokens']} tok, share {work['weight']:.2f}{capped}"
        last = p.get("last_round_bytes") or {}
        per_round = f"{format_bytes(last['sent'])}/{format_bytes(last['received'])}" if "sent" in last else "-"
        lines.append(f"{p['peer_id'][:8]:10} {p['state']:11} {p['last_round'] + 1:>5} {in_sync:>7} "
                     f"{format_bytes(p['bytes_sent']):>10} {format_bytes(p['bytes_received']):>10} {per_round:>22} {util:>5}  {note}")
    if status["rejections"]:
        lines.append("rejections: " + ", ".join(f"{k} {v}" for k, v in sorted(status["rejections"].items())))
    return "\n".join(lines)
