"""`make demo`: ten daemons learn over TCP on real MNIST digits with the default algorithm, beside Local (and Oracle).

    python -m tools.demo --out demo-out [--nodes 10] [--rounds 80] [--baselines [local] [oracle]] [--quick]

The daemons run the default algorithm, the one `p2pnode init` writes (MAPL-Auto: MAPL-Dual's small
shared model with every neighbour, MAPL+'s own-model averaging with those that run the same
backbone), on Scenario 1: two clusters with disjoint classes, 10 training and 80 test samples per
class per node, the four CPU backbones (so each backbone runs on two or three nodes). The same
nodes then run the baselines
in the simulator: Local (each node alone) and Oracle (each node on its true cluster's pooled
data, the ceiling). It prints one row per node, each accuracy with its 95 % Wilson interval, and
the methods compared with paired bootstrap intervals (the gain over Local and its 95 % interval);
report.md and the plots (the baselines on the same axes) are in OUT/mapl-auto-testnet/.
`--quick` (with small --nodes and --rounds) is a smoke test, not for numbers: a warm-up of one
round and no accuracy or within-cluster mass to reach. `--save NAME` writes the methods, the wall
times and the traffic to tools/bench/results/NAME.json, which BENCHMARKS.md's `make demo` table
is drawn from (render()).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from algorithms.catalog import BASELINES, DEFAULT_ALGORITHM
from algorithms.data.setup import ScenarioSpec
from testnet.launch.learning import run_learning_testnet
from testnet.reporting.report import CheckThresholds, attach_baselines, summary_line, write_report
from testnet.reporting.summary import difference_text, methods_table, per_node_table
from testnet.simulation.hosting import default_engine
from testnet.simulation.progress import RoundProgress
from testnet.simulation.simulator import SimulationSpec, run_baselines
from tools.bench.results import capture, save

# The demo's figures come from a seed nothing was chosen on (issue #44): seed 0 chose MAPL-Dual's
# defaults, and seed 6, the demo's until 2026-12-07, MAPL-Auto's choice rule was looked into on
# (docs/learning.md); 19 was never run before it became the demo's.
SEED = 19


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo-out")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=80)
    # Local by default (36 s in BENCHMARKS.md's `make demo`); Oracle, the ceiling, on request: it took
    # 160 s more in the learning benchmark's Scenario 1.
    parser.add_argument("--baselines", nargs="*", choices=BASELINES, default=["local"])
    parser.add_argument("--quick", action="store_true", help="warm-up 1 round, no thresholds: a smoke test")
    parser.add_argument("--save", metavar="NAME", help="write the figures to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    out = Path(args.out) / f"{DEFAULT_ALGORITHM}-testnet"
    spec = SimulationSpec(
        algorithm=DEFAULT_ALGORITHM,
        data=ScenarioSpec(
            dataset="mnist5k", scenario="1", nodes=args.nodes, seed=SEED, samples_per_class=10, test_per_class=80
        ),
        rounds=args.rounds,
        overrides={"warmup_rounds": "1"} if args.quick else {},
    )
    print(
        f"{DEFAULT_ALGORITHM} testnet: {args.nodes} daemons, mnist5k, Scenario 1, 10 training and 80 test samples "
        f"per class, {args.rounds} rounds",
        file=sys.stderr,
    )
    check = CheckThresholds(accuracy=0.0, within_cluster_mass=0.0) if args.quick else CheckThresholds()
    words = ["python", "-m", "tools.demo", *(sys.argv[1:] if argv is None else argv)]
    settings = {"algorithm.warmup_rounds": 1} if args.quick else {}
    with capture(words, settings=settings, seeds=[SEED], threads=1, runs=1 + len(args.baselines)) as provenance:
        started = time.monotonic()
        code, mapl = run_learning_testnet(spec, out, check=check)
        if args.baselines and code != 130:
            print(f"Baselines on the same nodes, simulated: {', '.join(args.baselines)}", file=sys.stderr)
            from algorithms.models.device import set_cpu_threads

            set_cpu_threads(1)
            baselines = run_baselines(spec, args.baselines, progress=RoundProgress, engine=default_engine(spec.nodes))
            attach_baselines(mapl, baselines)
        wall_s = time.monotonic() - started
    if args.save:
        print(f"wrote {save(args.save, 'tools.demo', provenance, figures(mapl, wall_s))}", file=sys.stderr)
    written = write_report(mapl, out)
    print(per_node_table(mapl))
    print()
    print(methods_table(mapl))
    print(summary_line(mapl))
    gain = mapl["baselines"].get("local", {}).get("difference")
    if gain is not None:
        verdict = "above 0: collaboration helped" if (gain["low"] or 0) > 0 else "not above 0"
        print(f"{mapl['algorithm']} − Local: {difference_text(gain)}; {verdict}")
    for failure in mapl.get("check", {}).get("failures", []):
        print(f"check failed: {failure}")
    print(f"report and plots: {', '.join(str(path) for path in written[1:])}; daemon logs: {out}/node*/node.log")
    return code


def figures(report: dict, wall_s: float) -> dict:
    """What BENCHMARKS.md shows of a demo: each method's accuracy and interval, the gain over
    each baseline, the wall times, the graph and the traffic."""
    methods = [{"name": report["algorithm"], "where": "daemons", "wall_s": report["wall_s"], **report["accuracy"]}]
    for name, run in report["baselines"].items():
        methods.append({"name": name, "where": "simulated", "wall_s": run["wall_s"], **run["accuracy"]})
    return {
        "nodes": report["nodes"],
        "rounds": report["rounds"],
        "methods": [
            {key: m[key] for key in ("name", "where", "wall_s", "mean", "std", "per_node", "pooled")} for m in methods
        ],
        "differences": {name: run["difference"] for name, run in report["baselines"].items()},
        "within_cluster_mass": report["graph"]["within_cluster_mass"],
        "l1_to_truth": report["graph"]["l1_to_truth"],
        "messages": report["comm"]["messages"],
        "bytes": report["comm"]["bytes"],
        "wall_s": wall_s,
        "check": report["check"],
    }


def render(result: dict) -> str:
    """The methods with their intervals and wall times, then the graph, the traffic, how many
    nodes gained over Local and the whole demo's wall time."""
    data = result["data"]
    first = data["methods"][0]
    rows = [
        f"| method | mean ± std over nodes | all test images [95 % Wilson] | {first['name']} − method "
        "[95 % paired bootstrap over nodes] | wall s |",
        "|---|---|---|---|---|",
    ]
    for method in data["methods"]:
        pooled, difference = method["pooled"], data["differences"].get(method["name"])
        versus = "—" if difference is None or method is first else _points(difference)
        if method["name"] == "local" and difference is not None:
            versus = f"**{versus}**"
        counted = "—"
        if pooled is not None:
            interval = f"[{pooled['low'] * 100:.1f}, {pooled['high'] * 100:.1f}]"
            counted = f"{pooled['accuracy'] * 100:.1f} % {interval} of {pooled['n']:,}"
        rows.append(
            f"| {method['name']} ({method['where']}) | {method['mean'] * 100:.1f} ± {method['std'] * 100:.1f} % | "
            f"{counted} | {versus} | {method['wall_s']:.0f} |"
        )
    local = next((m for m in data["methods"] if m["name"] == "local"), None)
    gained = ""
    if local is not None:
        gains = [(a - b) * 100 for a, b in zip(first["per_node"], local["per_node"], strict=True)]
        who = "every node" if min(gains) > 0 else f"{sum(g > 0 for g in gains)} of {len(gains)} nodes"
        gained = f"; {who} gained ({min(gains):+.1f} to {max(gains):+.1f} points)"
    beside = f", Local {local['wall_s']:.0f} s" if local else ""
    rows += [
        "",
        f"Within-cluster mass {data['within_cluster_mass']:.3f}, L1 to truth {data['l1_to_truth']:.3f}, "
        f"{data['messages']:,} messages, {data['bytes'] / 2**20:.0f} MiB{gained}. Wall time "
        f"{data['wall_s'] / 60:.0f} min (the testnet {first['wall_s']:.0f} s{beside}).",
    ]
    return "\n".join(rows)


def _points(difference: dict) -> str:
    if difference.get("low") is None:  # a small fleet whose nodes did not keep their images' outcomes
        return f"{difference['mean'] * 100:+.1f} points (no interval)"
    over = " over images" if difference.get("unit") == "images" else ""  # below SMALL_FLEET nodes
    low, high = difference["low"] * 100, difference["high"] * 100
    return f"{difference['mean'] * 100:+.1f} points [{low:+.1f}, {high:+.1f}]{over}"


if __name__ == "__main__":
    sys.exit(main())
