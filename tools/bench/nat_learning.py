"""Learning from behind NATs (issue #46): a MAPL-Dual testnet on the NAT testbed, every node
behind a NAT in client mode, beside the same nodes all on the internet bridge (the control).

    python -m tools.bench.nat_learning [--rounds 40] [--seed 10] [--relay] [--flush-after S]
        [--out bench-out/nat-learning] [--save NAME]

The layout is tools.bench.nat's (a bootstrap and two more public nodes; two nodes behind one
port-restricted home router, two behind one symmetric NAT, two behind a home router behind a
carrier-grade NAT, one behind a firewall), ten daemons on mnist5k Scenario 1 (two clusters of
five, node i in cluster i mod 2), 10 training and 80 test images per own class, CURVE on, the
learning testnet's settings (testnet/launch/learning.py). The control runs the same spec with
every host public. Per run: accuracy, within-cluster mass, payloads missing, `--check`; for the
NAT run also each node's site. With `--relay` the bootstrap node relays for the client nodes
(`[relay].enabled`), which then reach each other through it; the NAT run also reports what the
relay forwarded and its memory. With `--flush-after S`, S seconds into the NAT run every router's
mappings are expired (`conntrack -F`), mid-run; `--check` and the payloads missing say whether
delivery resumed. Needs root, `ip netns`, `iptables` and `conntrack`; it says what
is missing otherwise and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from .nat import LAYOUT, PORT, lab_hosts
from .results import capture, save


def run(out: Path, rounds: int, seed: int, natted: bool, relay: bool = False, flush_after: float | None = None) -> dict:
    """One learning testnet on a fresh testbed: NATed (client mode behind the NATs, with a relay
    or not) or all public."""
    from algorithms.data.setup import ScenarioSpec
    from testnet.launch.learning import run_learning_testnet
    from testnet.launch.nat import NatLab, NatPlacement
    from testnet.simulation.spec import SimulationSpec

    spec = SimulationSpec(
        algorithm="mapl-dual",
        data=ScenarioSpec(
            dataset="mnist5k", scenario="1", nodes=len(LAYOUT), seed=seed, samples_per_class=10, test_per_class=80
        ),
        rounds=rounds,
    )
    with NatLab() as lab:
        hosts = lab_hosts(lab, natted)
        placement = NatPlacement(hosts, PORT, client_mode=natted, relay=natted and relay)
        flush = threading.Timer(flush_after, lab.flush) if natted and flush_after is not None else None
        if flush is not None:
            flush.start()  # mid-run, from beside the launcher: every router forgets its connections
        try:
            code, report = run_learning_testnet(spec, out, placement=placement)
        finally:
            if flush is not None:
                flush.cancel()
    name = "behind NATs, client mode" + (", a relay" if relay else "") if natted else "all public (control)"
    if natted and flush_after is not None:
        name += f", conntrack -F at {flush_after:g} s"
    return {
        "run": name,
        "sites": [host.site for host in hosts],
        **learned(code, report),
        "messages": report["comm"]["messages"],
        **(_relaying(report["processes"]) if natted and relay else {}),
    }


def learned(code: int, report: dict) -> dict:
    """What a learning testnet's run on the testbed is judged by: its exit code and `--check`,
    accuracy, within-cluster mass, payloads missing, rounds completed, wall time."""
    return {
        "exit_code": code,
        "check": report["check"],
        "accuracy": report["accuracy"]["mean"],
        "accuracy_per_node": report["accuracy"]["per_node"],
        "within_cluster_mass": report["graph"]["within_cluster_mass"],
        "missing_payloads": report["missing_payloads"],
        "rounds_completed_per_node": report["rounds_completed_per_node"],
        "wall_s": round(report["wall_s"], 1),
    }


def _relaying(processes: dict) -> dict:
    """What the relay (node 0) forwarded and held, and what the hop cost its senders: RELAY bytes
    against the bytes of the frames inside, learning frames apart (p2pnode/relay/link.py)."""
    counts = [each or {} for each in processes["relay"]]

    def total(key: str) -> int:
        return sum(each.get(key, 0) for each in counts)

    learning, other = total("relay_out_learning_frame_bytes"), total("relay_out_other_frame_bytes")
    return {
        "relayed_frames": counts[0].get("relayed_frames", 0),
        "relayed_bytes": counts[0].get("relayed_bytes", 0),
        "unrelayed": {key: value for key, value in counts[0].items() if key.startswith("unrelayed_")},
        "relay_learning_ratio": total("relay_out_learning_bytes") / learning if learning else None,
        "relay_all_ratio": (total("relay_out_learning_bytes") + total("relay_out_other_bytes")) / (learning + other)
        if learning + other
        else None,
        "relay_rss_mb": processes["rss_mb"][0],
        "relay_peak_rss_mb": processes["peak_rss_mb"][0],
        "relay_ingress_rss_mb": processes["ingress_rss_mb"][0],
    }


def render(result: dict) -> str:
    data = result["data"]
    rows = [
        "| run | accuracy, % (mean over nodes) | behind a NAT / public nodes, % | within-cluster mass "
        "| payloads missing | rounds completed (min) | `--check` | wall, s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    natted_sites = next(run["sites"] for run in data["runs"] if "NAT" in run["run"])
    for run in data["runs"]:
        behind = [a for a, site in zip(run["accuracy_per_node"], natted_sites, strict=True) if site != "public"]
        public = [a for a, site in zip(run["accuracy_per_node"], natted_sites, strict=True) if site == "public"]
        verdict = "passed" if run["check"]["passed"] else "failed: " + "; ".join(run["check"]["failures"])
        rows.append(
            f"| {run['run']} | {100 * run['accuracy']:.1f} | {100 * _mean(behind):.1f} / {100 * _mean(public):.1f} "
            f"| {run['within_cluster_mass']:.3f} | {run['missing_payloads']} | {min(run['rounds_completed_per_node'])} "
            f"| {verdict} | {run['wall_s']:.0f} |"
        )
    relayed = next((run for run in data["runs"] if "relayed_frames" in run), None)
    if relayed is not None:
        rows.append(
            f"\nThe relay forwarded {relayed['relayed_frames']} frames, "
            f"{relayed['relayed_bytes'] / 2**20:.1f} MiB sealed "
            f"(refused: {relayed['unrelayed'] or 'none'}); its senders' RELAY bytes were "
            f"{relayed['relay_learning_ratio']:.3f}× the learning frames inside, {relayed['relay_all_ratio']:.3f}× all "
            f"frames (PINGs too); the relay daemon's memory {relayed['relay_rss_mb']:.0f} MB "
            f"(peak {relayed['relay_peak_rss_mb']:.0f} MB, a learning node's), its inbound processes "
            f"{relayed['relay_ingress_rss_mb']:.0f} MB."
        )
    return "\n".join(rows) + (
        f"\n\nmnist5k Scenario 1, {len(natted_sites)} MAPL-Dual daemons, {data['rounds']} rounds, seed {data['seed']};"
        " the second column splits the nodes by where they sit in the NAT run (the same nodes in the control).\n"
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    from testnet.launch.nat import missing

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--relay", action="store_true", help="the bootstrap node relays for the client nodes")
    parser.add_argument(
        "--flush-after", type=float, metavar="S", help="conntrack -F on every router S s into the NAT run"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out/nat-learning"))
    parser.add_argument("--save", metavar="NAME", help="write the result to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    if (why := missing()) is not None:
        print(f"the NAT testbed {why}", file=sys.stderr)
        return 2
    words = ["python", "-m", "tools.bench.nat_learning", *(sys.argv[1:] if argv is None else argv)]
    settings = {"node.client_mode": "true, behind a NAT (NAT run)"}
    if args.relay:
        settings["relay.enabled"] = "true on the bootstrap node (NAT run)"
    if args.flush_after is not None:
        settings["conntrack -F"] = f"on every router {args.flush_after:g} s into the NAT run"
    with capture(words, settings=settings, seeds=[args.seed], threads=1, runs=2) as provenance:
        runs = [
            run(args.out / name, args.rounds, args.seed, natted, args.relay, args.flush_after)
            for name, natted in (("nat", True), ("control", False))
        ]
    data = {
        "rounds": args.rounds,
        "seed": args.seed,
        "relay": args.relay,
        "flush_after": args.flush_after,
        "runs": runs,
    }
    print(render({"data": data}))
    if args.save:
        print(f"saved {save(args.save, 'tools.bench.nat_learning', provenance, data)}", file=sys.stderr)
    return 0 if all(run["exit_code"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
