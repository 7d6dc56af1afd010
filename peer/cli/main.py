"""`swarmloco`: coordinator, peer, demo, simulate, status, preflight, runs.

Network flags follow hivemind/Petals habits (--initial-peers, --host-maddrs, --announce-maddrs,
--identity-path, --client-mode). Run-config overrides (--rounds, --codec, ...) come from one table
mapped onto the typed RunConfig (peer/cli/run_flags.py), the same for every verb that runs.
Each verb's module is imported only when that verb runs: `--help` and `status` never load torch.
A typo'd flag or verb gets the verb's usage and a "did you mean" (peer/cli/parsing.py); the paths
a verb writes are checked before it starts (peer/cli/output_paths.py); gRPC's C++ log stays off
the terminal unless -v (or GRPC_VERBOSITY / GRPC_TRACE) asks for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading

from peer.cli.model_verbs import HANDLERS as MODEL_HANDLERS, add_model_verbs
from peer.cli.output_paths import check_outputs
from peer.cli.parsing import CliParser
from peer.cli.run_flags import add_run_flags, load_run_config
from peer.node.thread_priority import MODES as PRIORITY_MODES
from peer.run.gil_handoff import quicken_handoffs

EPILOG_PEER = """examples:
  swarmloco peer --initial-peers /ip4/203.0.113.7/tcp/31337/p2p/12D3KooW...
  swarmloco peer --coordinator 203.0.113.7:31338 --client-mode      # behind NAT, no inbound port
"""


# optim.attacks.NAMES, spelled out so that --help does not import torch (tests check they agree).
ATTACKS = ("sign-flip", "gaussian", "label-flip", "alie", "ipm", "mimic", "stale-replay", "free-rider", "nan", "huge-norm",
           "min-max", "min-sum", "agr-tailored", "index-poison", "slow-accumulate", "vote-tailored")


def _shard(text: str) -> tuple[int, int]:
    try:
        index, total = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: use I/N, e.g. 0/4") from None
    if not 0 <= index < total:
        raise argparse.ArgumentTypeError(f"--shard {text!r}: need 0 <= I < N")
    return index, total


def _add_metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on http://HOST:PORT/metrics (0 = any free port)")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="interface for the metrics endpoint (0.0.0.0 for a remote Prometheus)")


def _add_tls_flags(parser: argparse.ArgumentParser, serves: bool) -> None:
    """--tls-cert/--tls-key/--tls-ca: TLS on every gRPC server and channel of the process
    (protocol/channels.py, configure_tls)."""
    tls = parser.add_argument_group("TLS (every gRPC server and channel of this process)")
    if serves:
        tls.add_argument("--tls-cert", metavar="PEM", help="this process's certificate, naming --announce-host, signed by the swarm's CA")
        tls.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    tls.add_argument("--tls-ca", metavar="PEM", help="CA certificate that signed the certificates of the processes this one dials")


def _configure_tls(args: argparse.Namespace) -> None:
    cert, key, ca = (getattr(args, name, None) for name in ("tls_cert", "tls_key", "tls_ca"))
    if cert or key or ca:
        from protocol.channels import TlsConfig, configure_tls

        serves = args.verb == "coordinator" or (args.verb == "peer" and not args.client_mode)
        configure_tls(TlsConfig(cert_path=cert, key_path=key, ca_path=ca), serves=serves)


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="swarmloco",
        description="Train one model together over the internet: DiLoCo rounds, compressed pseudo-gradients, robust aggregation.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (gRPC's C++ log included)")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    # coordinator
    c = sub.add_parser("coordinator", help="bootstrap a swarm: DHT node, run config, round clock, signed manifests")
    c.add_argument("--port", type=int, default=31338, help="gRPC port peers use with --coordinator (0 = any free port)")
    c.add_argument("--host", default="0.0.0.0", help="interface for the gRPC server")
    c.add_argument("--announce-host", default="127.0.0.1", help="address peers should dial for the gRPC port (your public IP on the internet)")
    c.add_argument("--host-maddrs", nargs="+", default=["/ip4/0.0.0.0/tcp/31337"], help="DHT listen multiaddrs")
    c.add_argument("--announce-maddrs", nargs="+", default=[], help="DHT multiaddrs to advertise (public address behind port forwarding)")
    c.add_argument("--identity-path", help="Ed25519 key file (created with mode 0600 if missing)")
    c.add_argument("--checkpoint", help="checkpoint file: written atomically every round, resumed from on restart")
    c.add_argument("--summary-json", help="write the final status here when the run ends")
    ha = c.add_argument_group("standby coordinators (docs/threat-model.md)")
    ha.add_argument("--standby", action="store_true",
                    help="follow the run's active coordinator (found through --initial-peers) and take over when its DHT lease lapses")
    ha.add_argument("--initial-peers", nargs="+", default=[], metavar="MULTIADDR",
                    help="DHT multiaddr(s) of the run (a standby's way in; list several)")
    ha.add_argument("--coordinator-key", metavar="FINGERPRINT", help="a standby's pin on the active coordinator's key")
    ha.add_argument("--coordinators", nargs="+", default=[], metavar="FINGERPRINT",
                    help="fingerprints of the keys that may coordinate this run (this one's is added): list the standbys here")
    _add_tls_flags(c, serves=True)
    _add_metrics_flags(c)
    c.add_argument("--dashboard-port", type=int, help="serve the live dashboard on this port (0 = any free port)")
    c.add_argument("--dashboard-host", default="127.0.0.1", help="interface for the dashboard (default loopback: it shows endpoints and evidence)")
    c.add_argument("--run-log", metavar="PATH", help="append one JSON line per event (rounds, joins, bans, takeovers); scripts/plot_run.py plots it")
    add_run_flags(c, "coordinator")

    # peer
    p = sub.add_parser("peer", help="join a swarm and train", epilog=EPILOG_PEER, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_argument_group("how to find the swarm (one of)")
    where.add_argument("--initial-peers", nargs="+", default=[], metavar="MULTIADDR", help="DHT multiaddr(s) printed by the coordinator")
    where.add_argument("--coordinator", metavar="HOST:PORT", help="the coordinator's gRPC port, directly (no DHT)")
    p.add_argument("--run-id", "--run", dest="run_id", help="which run, when the DHT hosts several (`swarmloco runs` lists them)")
    p.add_argument("--coordinator-key", metavar="FINGERPRINT",
                   help="pin the run's coordinator key (the fingerprint the coordinator prints): refuse any endpoint that signs with another")
    p.add_argument("--identity-path", help="Ed25519 key file (created with mode 0600 if missing); needed for --resume")
    p.add_argument("--data", help="your own training text: a file or a directory (default: the Python standard library's sources)")
    p.add_argument("--client-mode", action="store_true", help="no inbound port (behind NAT): push updates to the coordinator instead of serving them")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--host", default="0.0.0.0", help="interface for this peer's gRPC server")
    p.add_argument("--port", type=int, default=0, help="gRPC port to serve updates on (0 = any free port)")
    p.add_argument("--announce-host", default="127.0.0.1", help="address other peers should dial (your public IP on the internet)")
    p.add_argument("--host-maddrs", nargs="+", default=["/ip4/0.0.0.0/tcp/0"], help="DHT listen multiaddrs")
    p.add_argument("--announce-maddrs", nargs="+", default=[], help="DHT multiaddrs to advertise")
    p.add_argument("--shard", type=_shard, help="data shard I/N (default: chosen from the peer id)")
    p.add_argument("--threads", type=int, help="CPU threads for training (1 when several peers share a machine)")
    p.add_argument("--train-priority", choices=PRIORITY_MODES, default="auto",
                   help="overlapped rounds: the training thread's CPU priority beside the exchange in flight "
                        "(idle: SCHED_IDLE, it runs only where nothing else wants a core; low: its nice + 5; both "
                        "Linux only; auto, the default: idle on Linux, normal elsewhere)")
    p.add_argument("--resume", action="store_true", help="continue from this identity's saved local state")
    p.add_argument("--state-dir", help="where --resume state is kept (default: beside --identity-path)")
    p.add_argument("--log-every", type=int, default=5, help="print a progress line every N inner steps")
    p.add_argument("--max-rounds", type=int, help="leave after this many rounds")
    p.add_argument("--summary-json", help="write this peer's per-round record here at exit")
    p.add_argument("--connect-timeout", type=float, default=120.0,
                   help="seconds to keep trying to join (DHT bootstrap, the run's record, the coordinator's first answer), with backoff")
    p.add_argument("--nproc", type=int, default=1, help="ranks of this peer (GPUs, or CPU processes with gloo): runs itself under torchrun, one peer to the swarm")
    _add_tls_flags(p, serves=True)
    _add_metrics_flags(p)

    # demo
    d = sub.add_parser("demo", help="a coordinator and N peers as separate processes on loopback")
    d.add_argument("--peers", type=int, default=4, help="number of peer processes")
    d.add_argument("--json", metavar="PATH", help="write the results (losses, measured bytes, config) here")
    d.add_argument("--workdir", help="keep identities, checkpoints and logs here (default: a temporary folder)")
    d.add_argument("--tls", action="store_true", help="run the loopback swarm over TLS, with a throwaway CA made in the workdir")
    d.add_argument("--exec-processes", action="store_true",
                   help="start every coordinator and peer as a fresh Python (each with its own hash seed and a readable "
                        "command line, but each imports torch itself: ~5.5 CPU-seconds and ~130 MB more per peer) instead of "
                        "forking them from one process that imported it once")
    add_run_flags(d, "demo")

    # simulate
    s = sub.add_parser("simulate", help="N virtual peers in one process (same math, no network) for fast experiments")
    s.add_argument("--peers", type=int, default=4, help="virtual peers")
    s.add_argument("--attack", metavar="NAME", help=f"the first --num-byzantine peers attack: {', '.join(ATTACKS)} (optim/attacks.py); "
                   "or lying-owner: as slice owners they sign false aggregated slices (sliced exchange)")
    s.add_argument("--attack-option", action="append", default=[], metavar="KEY=VALUE",
                   help="attack option, repeatable, e.g. --attack-option scale=4 (values parsed as JSON when possible); "
                        "min-max, min-sum: perturbation=unit-vector|std|sign; agr-tailored: rule=NAME (default median)")
    s.add_argument("--baseline", choices=("diloco", "ddp"), default="diloco", help="diloco, or ddp: synchronous data-parallel on the same peers")
    s.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: robust when other processes share the cores)")
    s.add_argument("--overlap-arrival", type=float, default=1.0, metavar="SHARE",
                   help="with --overlap: share of the next phase's inner steps run before the average in flight lands "
                        "(1.0: at the phase's end, an exchange as long as a phase; 0.5: half as long)")
    s.add_argument("--peer-speeds", metavar="S,S,...", help="each virtual peer's speed (1 = full speed), e.g. 1,1,0.5,0.25: "
                   "with a fixed H the round waits for the slowest (in simulated time); with --window-s each peer "
                   "takes the steps its speed fits and counts by its work")
    s.add_argument("--claim-work", type=float, default=1.0, metavar="X",
                   help="with --attack and --window-s: the attackers sign X times the work they did into their headers "
                        "(the owners cap every claim)")
    s.add_argument("--json", metavar="PATH", help="write the results (losses, measured bytes, config) here")
    add_run_flags(s, "simulate")

    # status
    st = sub.add_parser("status", help="ask a coordinator for the round, hashes and every peer's state")
    st.add_argument("--coordinator", required=True, metavar="HOST:PORT", help="the coordinator's gRPC port")
    st.add_argument("--json", action="store_true", help="print the raw JSON")
    st.add_argument("--connect-timeout", type=float, help="seconds to wait for the coordinator (default: the gRPC client's connect timeout)")
    _add_tls_flags(st, serves=False)
    add_model_verbs(sub)  # prepare-data, export, sample, models (peer/cli/model_verbs.py)
    st.add_argument("--watch", nargs="?", type=float, const=2.0, metavar="SECONDS", help="redraw in place every SECONDS (default 2) until ^C")

    # preflight
    pf = sub.add_parser("preflight", help="before joining: measure RTT, bandwidth, dial-back and step time; recommend --client-mode, H and codec")
    pf_where = pf.add_argument_group("which coordinator (one of)")
    pf_where.add_argument("--initial-peers", nargs="+", default=[], metavar="MULTIADDR", help="DHT multiaddr(s) printed by the coordinator")
    pf_where.add_argument("--coordinator", metavar="HOST:PORT", help="the coordinator's gRPC port, directly (no DHT)")
    pf.add_argument("--run-id", "--run", dest="run_id", help="which run, when the DHT hosts several")
    pf.add_argument("--port", type=int, default=31340, help="the port this machine would announce as a peer (the dial-back check listens on it)")
    pf.add_argument("--host", default="0.0.0.0", help="interface the dial-back check listens on")
    pf.add_argument("--skip-dial-back", action="store_true", help="do not check whether the coordinator can reach this machine")
    pf.add_argument("--device", default="cpu", help="cpu or cuda: where the inner steps would run")
    pf.add_argument("--threads", type=int, help="CPU threads for the step-time measurement")
    pf.add_argument("--seconds", type=float, default=3.0, help="about how long each throughput transfer runs")
    pf.add_argument("--json", metavar="PATH", help="also write the measurements and the recommendation here")
    pf.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to wait for the DHT / coordinator")

    # runs
    ru = sub.add_parser("runs", help="list the runs a DHT announces (run id, model, codec, round, peers, coordinator)")
    ru.add_argument("--initial-peers", nargs="+", required=True, metavar="MULTIADDR", help="DHT multiaddr(s) of any node of the swarm")
    ru.add_argument("--json", action="store_true", help="print the raw JSON")
    ru.add_argument("--wait", type=float, default=5.0, help="seconds to wait for run records to show up")
    ru.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to wait for the DHT / each coordinator")
    for verb_parser in sub.choices.values():  # -v after the verb too (not set there: the top level's stays)
        verb_parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")
    CliParser.link_verbs(sub)
    return parser


def quiet_grpc_logging(verbose: bool) -> None:
    """Keep gRPC's C++ log (`E1201 ... add_port.cc:83] Failed to add port ...`) off the terminal:
    the errors it logs reach the user as our own messages. GRPC_VERBOSITY=ERROR still prints
    those lines; NONE does not. Read once, when grpc is imported, so this runs before any verb
    imports it; -v, or the user's own GRPC_VERBOSITY / GRPC_TRACE, leaves gRPC's default."""
    if verbose or "GRPC_VERBOSITY" in os.environ or "GRPC_TRACE" in os.environ or "grpc" in sys.modules:
        return
    os.environ["GRPC_VERBOSITY"] = "NONE"  # inherited by the processes this one starts (demo, --nproc)


def refuse_lone_standby(args: argparse.Namespace) -> None:
    """A standby finds the run's active coordinator through the run's DHT: without --initial-peers
    its DHT is its own, and it would wait forever. Refused; its key is made first (when
    --identity-path names one) so that its fingerprint can be listed on the active coordinator."""
    if not args.standby or args.initial_peers:
        return
    from peer.run.config import ConfigError
    from protocol.identity import Identity

    if args.identity_path:
        fingerprint = Identity.load_or_create(args.identity_path).peer_id
        key = (f"This standby's key is {args.identity_path}, fingerprint {fingerprint}: start the active coordinator with "
               f"--coordinators {fingerprint}, then this one again with its --initial-peers.")
    else:
        key = "Pass --identity-path too, so that its key, and the fingerprint the active coordinator's --coordinators lists, persist."
    raise ConfigError("--standby needs --initial-peers: the run's DHT multiaddr(s), the `--initial-peers /ip4/...` lines the "
                      f"active coordinator prints; without them it can never find the coordinator to follow. {key}")


def cmd_coordinator(args: argparse.Namespace) -> int:
    refuse_lone_standby(args)  # before the imports that load torch
    from peer.cli import interrupts
    from peer.coordinator.main import CoordinatorOptions, run_coordinator
    from peer.coordinator.operations import OperationsOptions

    from peer.run.config import ConfigError
    from protocol.keys import check_fingerprint

    cfg = load_run_config(args)
    if args.coordinators:
        keys = [check_fingerprint(k) for k in args.coordinators]
        if any(len(k) != 32 for k in keys):
            raise ConfigError("--coordinators: give each key's full fingerprint (32 hex characters, as the coordinator prints it)")
        cfg = dataclasses.replace(cfg, control=dataclasses.replace(cfg.control, coordinators=sorted(set(keys))))
    stop = threading.Event()
    interrupts.install(stop.set)
    run_coordinator(
        CoordinatorOptions(
            config=cfg,
            host=args.host,
            port=args.port,
            announce_host=args.announce_host,
            host_maddrs=args.host_maddrs,
            announce_maddrs=args.announce_maddrs,
            identity_path=args.identity_path,
            checkpoint_path=args.checkpoint,
            summary_json=args.summary_json,
            initial_peers=args.initial_peers,
            standby=args.standby,
            coordinator_key=check_fingerprint(args.coordinator_key) if args.coordinator_key else None,
            operations=OperationsOptions(metrics_port=args.metrics_port, metrics_host=args.metrics_host, dashboard_port=args.dashboard_port,
                                         dashboard_host=args.dashboard_host, run_log=args.run_log),
        ),
        stop,
    )
    if interrupts.received() is not None:
        print("interrupted: stopped cleanly", file=sys.stderr)
    return interrupts.exit_status()  # 0 when the run ended; 130 / 143 when Ctrl+C / SIGTERM stopped it


def cmd_peer(args: argparse.Namespace, make_node=None) -> int:
    """`make_node(options)` builds the node (default PeerNode; tests/byzantine_peer.py passes a subclass)."""
    from peer.run.process_memory import one_arena

    one_arena()  # first thing, before any thread allocates (peer/run/process_memory.py)
    from peer.node.node import PeerNode, PeerOptions
    from peer.node import ranks

    if (follower_exit := ranks.before_peer(args)) is not None:  # --nproc / torchrun: ranks 1.. only train
        return follower_exit
    from protocol import ports
    from protocol.keys import check_fingerprint

    if not args.client_mode:  # refused before anything starts (the DHT port: protocol/discovery.py)
        ports.check_grpc_port(args.host, args.port)
    options = PeerOptions(
        coordinator=args.coordinator,
        initial_peers=args.initial_peers,
        run_id=args.run_id,
        coordinator_key=check_fingerprint(args.coordinator_key) if args.coordinator_key else None,
        identity_path=args.identity_path,
        data=args.data,
        client_mode=args.client_mode,
        device=args.device,
        host=args.host,
        port=args.port,
        announce_host=args.announce_host,
        host_maddrs=args.host_maddrs,
        announce_maddrs=args.announce_maddrs,
        shard=args.shard[0] if args.shard else None,
        num_shards=args.shard[1] if args.shard else None,
        threads=args.threads,
        state_dir=args.state_dir,
        resume=args.resume,
        log_every=args.log_every,
        connect_timeout_s=args.connect_timeout,
        train_priority=args.train_priority,
    )
    node = (make_node or PeerNode)(options)
    from peer.cli import interrupts
    from peer.node.node import PeerExit

    if threading.current_thread() is threading.main_thread():  # scripts/scale_lab.py runs several nodes, one per thread
        interrupts.install()
    metrics = None
    try:
        if args.metrics_port is not None:
            from peer.node.metrics import serve_node_metrics

            metrics = serve_node_metrics(node, host=args.metrics_host, port=args.metrics_port)
        node.connect()
        result = node.run(max_rounds=args.max_rounds)
        node.quiesce()
        if args.summary_json:
            total = node.counter.total()
            result.update(peer_id=node.identity.peer_id, bytes_sent=total.sent, bytes_received=total.received,
                          compute_s=node.snapshot.compute_s, traffic=node.counter.snapshot(),
                          traffic_by_method=node.counter.by_method())
            with open(args.summary_json, "w") as f:
                json.dump(result, f, indent=2)
        print(f"peer {node.short} | finished at round {node.round} | hash {node.current_hash[:12]}", flush=True)
        return 0
    except PeerExit as exc:
        print(f"swarmloco peer: {exc}", file=sys.stderr)
        return 1
    finally:
        node.close()
        if metrics is not None:
            metrics.close()


def cmd_demo(args: argparse.Namespace) -> int:
    from peer.cli import demo

    return demo.main(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    from peer.cli import simulate

    return simulate.main(args)


def cmd_status(args: argparse.Namespace) -> int:
    from peer.cli.status import print_status

    return print_status(args.coordinator, as_json=args.json, connect_timeout_s=args.connect_timeout, watch_s=args.watch)


def cmd_preflight(args: argparse.Namespace) -> int:
    from peer.cli import preflight

    return preflight.main(args)


def cmd_runs(args: argparse.Namespace) -> int:
    from peer.cli import runs

    return runs.main(args)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the CLI process: once main returns and every exit handler ran, it ends at once
        from peer.cli import interrupts

        interrupts.skip_finalization()
        return interrupts.returning(_main(argv))
    return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if argv is None:  # this process is the CLI (not a test calling main): its environment is ours to set
        quiet_grpc_logging(args.verbose)
        quicken_handoffs()  # exchange threads beside training, RPC handlers beside background work (peer/run/gil_handoff.py)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    handlers = {
        "coordinator": cmd_coordinator,
        "peer": cmd_peer,
        "demo": cmd_demo,
        "simulate": cmd_simulate,
        "status": cmd_status,
        "preflight": cmd_preflight,
        "runs": cmd_runs,
        **MODEL_HANDLERS,
    }
    try:
        check_outputs(args)  # a read-only folder is refused now, not at the first write
        _configure_tls(args)  # before any channel or server exists
        return handlers[args.verb](args)
    except KeyboardInterrupt:
        from peer.cli import interrupts

        print("interrupted: stopped cleanly", file=sys.stderr)
        return interrupts.exit_status(default=130)
    except ValueError as exc:  # bad input: ConfigError, IdentityError, a bad flag value
        print(f"swarmloco {args.verb}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # cannot reach or use something: DiscoveryError, CoordinatorUnavailable, files
        print(f"swarmloco {args.verb}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
