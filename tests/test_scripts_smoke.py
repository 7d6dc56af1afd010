"""Smoke tests of the measurement scripts' small modes (no hivemind swarm, no namespaces needed).

- the swarmloco exchange round of bench_vs_hivemind (scripts/exchange_round.py): three real gRPC
  peers in this process run the real sliced exchange (and the all-to-all one) under a signed
  manifest; every peer's θ equals the run's math on the decoded payloads bit for bit and is within
  the wire precision of the exact mean;
- measure_bandwidth's analysis on hand-written peer summaries (goodput, utilization, the
  coordinator vs peer split, codec sizes from the codec docstring's examples, where an overlapped
  round landed); measure_scale's control/data split and targets;
- delay_proxy carries bytes and EOF unchanged; wan_emulation exits 0 with a message when it
  may not create namespaces, and passes its exchange mode to the run config.
The reports written from the scripts' JSON: tests/test_report_scripts.py.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import bench_vs_hivemind  # noqa: E402
import delay_proxy  # noqa: E402
import measure_bandwidth  # noqa: E402
import wan_emulation  # noqa: E402


@pytest.mark.parametrize("text, value", [("1M", 1_000_000), ("10M", 10_000_000), ("250K", 250_000), ("4096", 4096), ("1e6", 1_000_000)])
def test_parse_numel(text, value):
    assert bench_vs_hivemind.parse_numel(text) == value


def test_parse_numel_refuses_nonsense():
    with pytest.raises(Exception, match="use an integer"):
        bench_vs_hivemind.parse_numel("lots")


@pytest.mark.parametrize("mode, codec, tolerance", [("sliced", "fp32", 1e-6), ("sliced", "fp16", 2e-3), ("all-to-all", "fp16", 2e-3)])
def test_exchange_round_three_real_peers_run_the_real_exchange(mode, codec, tolerance):
    """Three real gRPC peers and a coordinator key, through SliceExchange (or ManifestFetcher)."""
    from exchange_round import BenchCoordinator, ExchangePeer, ExchangeSpec, run_round
    from peer.run.round_math import RoundMath

    d = 10_000
    spec = ExchangeSpec(codec=codec, mode=mode, slices=8, replicas=2, spot_checks=1)
    updates = [torch.randn(d, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    peers = [ExchangePeer(u, spec) for u in updates]
    coordinator = BenchCoordinator(spec, d)
    try:
        results = run_round(peers, coordinator, 1)
        # every honest peer computes the same bits from the same signed bytes
        assert all(torch.equal(results[0], r) for r in results[1:])
        # fedavg at lr 1 from 0: θ is minus the aggregate the run's math computes from the decoded
        # payloads in one process (the simulator's path), bit for bit
        by_id = {p.peer_id: p for p in peers}
        math = RoundMath(spec.config(), d)
        decoded = [math.decode(by_id[e.peer_id].payload, 1) for e in peers[0].manifest.entries]
        reference = torch.zeros(d)
        math.apply(reference, decoded, round_=1)
        assert torch.equal(results[0], reference)
        # and within the wire precision of the exact mean (fp16 slices and fp16 aggregated slices)
        error = float((results[0] + torch.stack(updates).mean(dim=0)).abs().max())
        assert error < tolerance
        assert codec != "fp16" or error > 1e-5  # fp16 really rounded something
        if mode == "sliced":
            assert [len(p.round.owners[j]) for p in peers[:1] for j in range(8)] == [2] * 8
            for peer in peers:  # one claim per slice: nobody lied, only the spot check recomputed
                assert not peer.outcome.liars and peer.outcome.recomputed == peer.outcome.spot_checked
                assert len(peer.outcome.spot_checked) == 1
        else:  # each fetched the other two payloads over gRPC (its own is not fetched)
            for peer in peers:
                assert peer.counter.total().received >= sum(len(o.payload) for o in peers if o is not peer)
    finally:
        for p in peers:
            p.close()


def _summary(peer_id: str, rounds: list[dict], traffic: dict) -> dict:
    return {"peer_id": peer_id, "history": rounds, "traffic": traffic}


def _record(round_: int, **kw) -> dict:
    base = {"round": round_, "updates": 4, "bytes_sent": 3000, "bytes_received": 5000, "payload_bytes": 1000,
            "compute_s": 9.0, "encode_s": 0.1, "wait_s": 0.5, "fetch_s": 0.3, "aggregate_s": 0.1, "round_s": 10.0}
    return base | kw


def test_analyze_goodput_utilization_and_split():
    traffic = {"0": {"10.0.0.1:31338": {"bytes_sent": 1200, "bytes_received": 700, "calls": 5},
                     "coordid": {"bytes_sent": 1000, "bytes_received": 60, "calls": 1},
                     "10.0.0.3:31400": {"bytes_sent": 66, "bytes_received": 1004, "calls": 1}}}
    summaries = [_summary("aaaaaaaaaaaa", [_record(0), _record(1, compute_s=7.0, round_s=10.0, fetch_s=0.0)], traffic)]
    result = measure_bandwidth.analyze(summaries, codec="fp16", numel=1000, coordinator_keys=("10.0.0.1:31338", "coordid"))
    first, second = result["rows"]
    assert first["fetched_payload_bytes"] == 3000  # 3 other peers' payloads of 1000 B
    assert first["goodput_MBps"] == pytest.approx(3000 / 1e6 / 0.3)
    assert second["goodput_MBps"] is None  # nothing timed: no rate made up
    assert (first["coordinator_sent"], first["coordinator_received"]) == (2200, 760)
    assert (first["peers_sent"], first["peers_received"]) == (66, 1004)
    assert result["utilization"] == pytest.approx(16.0 / 20.0)
    assert result["codec_bytes"] == 2004  # optim/codecs.py: fp16 of 1000 values = 4 + 2*1000
    assert result["fp32_bytes"] == 4000
    assert result["bytes_per_peer_per_round"] == 8000
    assert "80.0%" in measure_bandwidth.format_table(result)


def test_codec_sizes_int8():
    assert measure_bandwidth.codec_sizes("int8", 1000)["codec_bytes"] == 4 + 4 * 16 + 1000  # ceil(1000/64) = 16 blocks


@contextlib.contextmanager
def _python_proxy(listen: tuple[str, int], target: tuple[str, int], delay_s: float):
    loop = asyncio.new_event_loop()
    loop.create_task(delay_proxy.serve(listen, target, delay_s))
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    try:
        yield
    finally:
        # Cancel the proxy and its connection handlers, let them unwind, then close the loop:
        # a loop left to the garbage collector with live tasks fires callbacks at shutdown.
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(timeout=10)
        loop.close()


@contextlib.contextmanager
def _c_proxy(listen: tuple[str, int], target: tuple[str, int], delay_s: float):
    if delay_proxy.native_binary() is None:
        pytest.skip("no C compiler here to build scripts/delay_proxy.c (wan_emulation then uses the Python proxy)")
    argv = delay_proxy.command(f"{listen[0]}:{listen[1]}", f"{target[0]}:{target[1]}", delay_s * 1000)
    assert argv[0] == str(delay_proxy.NATIVE_BINARY)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"delay proxy {listen[0]}:{listen[1]} -> ")  # listening
        yield
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0  # SIGTERM: a clean exit, as the Python one's
        proc.stdout.close()


@pytest.mark.parametrize("proxy", [_python_proxy, _c_proxy], ids=["python", "c"])
def test_delay_proxy_carries_bytes_and_eof(proxy):
    echo = socket.socket()
    echo.bind(("127.0.0.1", 0))
    echo.listen(1)

    def serve_echo():
        conn, _ = echo.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve_echo, daemon=True).start()
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    proxy_port = probe.getsockname()[1]
    probe.close()
    delay_s = 0.005
    try:
        with proxy(("127.0.0.1", proxy_port), echo.getsockname(), delay_s):
            blob = bytes(range(256)) * 4096 * 8  # 8 MiB: more than the 4 MiB a direction may hold
            for _ in range(200):
                try:
                    client = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
                    break
                except OSError:
                    threading.Event().wait(0.02)
            started = time.monotonic()
            client.sendall(b"?")
            assert client.recv(1) == b"?"
            assert time.monotonic() - started >= 2 * delay_s  # the delay is added each way
            received = bytearray()

            def read_back():
                while data := client.recv(65536):
                    received.extend(data)

            reader = threading.Thread(target=read_back)
            reader.start()
            client.sendall(blob)
            client.shutdown(socket.SHUT_WR)  # EOF must travel through both directions
            reader.join(timeout=20)
            client.close()
            assert bytes(received) == blob
    finally:
        echo.close()


def test_wan_emulation_without_permission_exits_cleanly(monkeypatch, capsys):
    monkeypatch.setattr(wan_emulation.os, "geteuid", lambda: 1000)
    assert wan_emulation.main(["--codec", "fp16"]) == 0
    assert "cannot emulate a WAN on this machine: network namespaces need root" in capsys.readouterr().out


def test_wan_shaping_is_named_beside_figures():
    assert wan_emulation.shaping_text(100, 50, "proxy") == (
        "tbf 100 Mbit/s up + down per node (burst 32kb); +50 ms RTT on gRPC via user-space delay proxy (DHT not delayed)")
    assert wan_emulation.shaping_text(0, 0, "none") == "no rate limit; no added latency"


def _peer_summary(peer_id: str, rounds: int, received: int, control: int, to_coordinator: int, n: int) -> dict:
    """What a peer's --summary-json holds: per-round totals and the transport ledger by counterpart."""
    ledger = {"127.0.0.1:5000": {"bytes_sent": control // 4, "bytes_received": control, "calls": 9},
              "c0ffee": {"bytes_sent": to_coordinator, "bytes_received": 300, "calls": 2},
              "127.0.0.1:6001": {"bytes_sent": 500, "bytes_received": received - control, "calls": 40}}
    history = [{"round": r, "updates": n, "in_sync": True, "bytes_sent": 1_000 + control // 4 + to_coordinator,
                "bytes_received": received, "payload_bytes": 100, "slices": {"owned": 21, "spot_checked": 1, "recomputed": 1}}
               for r in range(rounds)]
    return {"peer_id": peer_id, "history": history, "traffic": {str(r): ledger for r in range(rounds)}}


def test_measure_scale_splits_control_from_data_and_checks_the_targets(tmp_path):
    import measure_scale
    import scale_report
    from peer.run.slice_plan import expected_traffic

    # the formula: k = 0 is docs/sliced-exchange.md's; each spot check adds ((n−1)·P − A)/S
    assert measure_scale.expected("sliced", 3, 1.0, 1.0, 2, 32, 0)["received"] == pytest.approx(expected_traffic(3, 1.0, 1.0, 2)["received"])
    assert measure_scale.expected("sliced", 3, 1.0, 1.0, 2, 32, 1)["received"] == pytest.approx(4 / 3 + 1 / 3 + 1 / 32)
    assert measure_scale.expected("sliced", 12, 1.0, 1.0, 2, 32, 1)["received"] == pytest.approx(22 / 12 + 10 / 12 + 10 / 32)
    assert measure_scale.expected("all-to-all", 12, 1.0, 1.0, 2)["received"] == 11.0

    args = argparse.Namespace(slices=32, replicas=2, spot_checks=1, inner_steps=2, rounds=3, skip_rounds=1)
    runs = []
    for n, received, control in ((3, 1_700_000, 80_000), (12, 3_200_000, 200_000)):
        summaries = [_peer_summary(f"p{i}", 3, received, control, 60_000, n) for i in range(n)]
        rows = [row for s in summaries for row in measure_scale.ledger_rows(s, "127.0.0.1:5000", "c0ffee")]
        assert rows[0]["control_received"] == control and rows[0]["to_coordinator_sent"] == 60_000
        run = {"rows": rows, "wall_s": 1.0, "problems": [], "rounds_done": 3, "coordinator_total": 0}
        runs.append(measure_scale.summarize("fp16", "sliced", n, args, 1_000_000, 1_000_000, 1_000_000, run))
    small, large = runs
    assert small["data_received_mean"] == 1_620_000 and small["control_received_mean"] == 80_000
    # per round: n peers x (control both ways + what the coordinator fetched + its requests)
    assert small["coordinator_bytes_per_round"] == 3 * (80_000 + 20_000 + 60_000 + 300)
    assert small["data_received_vs_expected"] == pytest.approx(1_620_000 / (1e6 * (4 / 3 + 1 / 3 + 1 / 32)))
    assert measure_scale.control_fit(runs) == pytest.approx((80_000 - 3 * 120_000 / 9, 120_000 / 9))

    proj = measure_scale.projection({"runs": runs})
    by = {(p["params"], p["peers"], p["slices"]): p for p in proj}
    assert len(proj) == 8 and by[(1e9, 1000, 1000)]["owned_busiest"] == 2 and by[(1e9, 1000, 32)]["owned_busiest"] == 1
    # S fixed: a peer checks with probability coverage·S/(n·k) = 0.5·32/1000 (the default coverage), so
    # the swarm recomputes each slice about every other round and a peer's spot-check bytes stay near
    # 0.5·P instead of n·P/S
    assert by[(1e9, 1000, 32)]["spot_bytes"] == pytest.approx(0.5 * 32 / 1000 * (999e9 - 1e9) / 32)
    assert by[(1e9, 1000, 1000)]["all_to_all_bytes"] == pytest.approx(999e9)

    data = {"runs": runs, "projection": proj, "control_fit": measure_scale.control_fit(runs),
            "invocations": [{"command": "measure_scale.py --peers 3 12", "load_before": "1 / 1 / 1", "load_after": "2 / 2 / 2"}]}
    out = tmp_path / "scale.md"
    scale_report.write_markdown(out, data)
    text = out.read_text()
    assert "**fp16: received per peer at 12 peers / at 3 peers ≤ 1.6x: NOT reached**, 1.88x" in text
    assert "coordinator ≤ ~2 models' worth per round at every n: reached" in text
    assert "nan" not in text.lower() and "<!-- notes -->" in text


def test_wan_report_says_where_the_overlapped_average_landed(tmp_path):
    """landed_after_steps travels from the peers' records into the rows, the per-peer table and the
    md's "lands after (steps of H)" column; synchronous and older results (no field) show "-"."""
    def run(landed: list[int | None] | None, shaping: str) -> dict:
        records = [_record(i) | ({} if landed is None else {"landed_after_steps": landed[i]}) for i in range(4)]
        result = measure_bandwidth.analyze([_summary("aaaaaaaaaaaa", records, {})], codec="fp16", numel=1000)
        return {**result, "inner_steps": 20, "shaping": shaping}

    overlapped = run([4, 7, 10, None], "tbf; overlapped rounds")  # last round: no next phase
    assert [r["landed_after_steps"] for r in overlapped["rows"]] == [4, 7, 10, None]
    assert wan_emulation.landing_spread(overlapped) == "0.35 (0.20–0.50)"  # median of 4/20, 7/20, 10/20
    assert overlapped["rows"] and "land" in measure_bandwidth.format_table(overlapped).splitlines()[1]
    synchronous, stored = run([None] * 4, "tbf"), run(None, "tbf")
    assert wan_emulation.landing_spread(synchronous) == wan_emulation.landing_spread(stored) == "-"
    assert "land" not in measure_bandwidth.format_table(stored).splitlines()[1]
    md = tmp_path / "wan.md"
    wan_emulation.write_markdown(md, [{"json": "new.json", "runs": [overlapped, synchronous]}, {"json": "old.json", "runs": [stored]}])
    rows = [line for line in md.read_text().splitlines() if line.startswith("| ") and ".json |" in line]
    header = next(line for line in md.read_text().splitlines() if line.startswith("| JSON"))
    assert header.rstrip(" |").split(" | ")[-5] == "lands after (steps of H)"  # then the 4 bound columns
    assert [row.rstrip(" |").split(" | ")[-5] for row in rows] == ["0.35 (0.20–0.50)", "-", "-"]


def test_a_window_runs_landing_is_a_share_of_the_phase_it_landed_in():
    """A compute window's phases vary: a round's landing is also given as a share of the steps of
    the same peer's next phase (its record's inner_steps), beside the share of H."""
    records = [_record(0, landed_after_steps=5, inner_steps=20), _record(1, landed_after_steps=6, inner_steps=25),
               _record(2, inner_steps=30)]
    result = {**measure_bandwidth.analyze([_summary("aaaaaaaaaaaa", records, {})], codec="fp16", numel=1000),
              "inner_steps": 20, "window_s": 3.0}
    assert [r["phase_steps"] for r in result["rows"]] == [20, 25, 30]
    assert wan_emulation.landing_shares(result, of_phase=True) == [5 / 25, 6 / 30]
    assert wan_emulation.landing_spread(result) == "0.20 (0.20–0.20) of the phase's steps; of H = 20: 0.28 (0.25–0.30)"
    assert "steps" in measure_bandwidth.format_table(result).splitlines()[1]


def test_the_wan_run_config_takes_the_exchange_mode(tmp_path):
    """wan_emulation --exchange all-to-all reaches the swarm's run config; without it the default (sliced)."""
    path = measure_bandwidth.write_run_config(tmp_path / "a", peers=4, rounds=6, inner_steps=25, codec="fp16", overlap=True,
                                              exchange="all-to-all")
    config = json.loads(path.read_text())
    assert (config["exchange"]["mode"], config["rounds"]["overlap_communication"], config["inner"]["steps"]) == ("all-to-all", True, 25)
    default = measure_bandwidth.write_run_config(tmp_path / "b", peers=4, rounds=6, inner_steps=25, codec="fp16")
    assert json.loads(default.read_text())["exchange"]["mode"] == "sliced"
    with pytest.raises(SystemExit):
        wan_emulation.main(["--exchange", "ring"])


def test_wan_report_only_needs_to_be_told_which_md(capsys):
    """--report-only without --write-md would have rewritten benchmarks/wan.md from the JSONs given
    alone (every other row gone): refused, saying what to pass; nothing is written."""
    md = ROOT / "benchmarks" / "wan.md"
    before = md.read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        wan_emulation.main(["--report-only", "benchmarks/wan_s17_p4_sync.json"])
    assert exit_info.value.code == 2
    assert "--write-md PATH" in capsys.readouterr().err
    assert md.read_bytes() == before


@pytest.mark.parametrize("cpu_groups", ["per-node", "shared"])
def test_the_testbeds_nodes_share_the_cores_as_asked_and_are_killed_as_a_group(cpu_groups, tmp_path):
    """netns_testbed's cpu_groups: per-node puts each node's process in a session (so a scheduling
    group) of its own; shared keeps it in ours. Either way it leads a process group, which close() kills."""
    from netns_testbed import Testbed, namespaces_permitted

    if why := namespaces_permitted():
        pytest.skip(why)
    bed = Testbed(1, rate_mbit=0, rtt_ms=0, cpu_groups=cpu_groups)
    try:
        bed.up()
        probe = bed.spawn(0, [sys.executable, "-c", "import os, time; print(os.getsid(0), os.getpgid(0), flush=True); time.sleep(60)"],
                          tmp_path / "probe.log")
        for _ in range(500):  # until it printed (bounded: 25 s)
            if (tmp_path / "probe.log").read_text().strip():
                break
            time.sleep(0.05)
        sid, pgid = map(int, (tmp_path / "probe.log").read_text().split())
        assert pgid == probe.pid  # `ip netns exec` execs the probe: same process
        assert sid == (probe.pid if cpu_groups == "per-node" else os.getsid(0))
    finally:
        bed.close()
    assert probe.poll() is not None  # close() killed its group
    with pytest.raises(ValueError, match="cpu_groups"):
        Testbed(1, rate_mbit=0, rtt_ms=0, cpu_groups="per-peer")
