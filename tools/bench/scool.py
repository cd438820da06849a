"""The SCooL benchmark of BENCHMARKS.md: Local, D-PSGD (SCooL-Dirac), SCooL-SBM and
SCooL-attention on mnist5k's non-IID SBM partition (groups of nodes with a disjoint pair of
classes each), 10 training samples per class per node, 10 and 20 nodes, 3 seeds, simulated.

    python -m tools.bench.scool --out bench-out/scool [--rounds 30] [--seeds 13 14 15] [--workers 2]
                                [--save scool]

Prints mean ± std over seeds of the 10-way and own-class accuracy, the worst node, L1 to truth at
rounds 10 and 20 and at the end (worst seed), peers talked to after pruning, and bytes per node
per round. SCooL's defaults (T = 3, pruning at round 10, ...) were chosen on this benchmark's
seeds 0, 1 and 2, and the scale guard while looking at 3 and 4, so a saved table refuses 0 to 4:
its figures come from seeds the choices never saw. Each
run is one process with one torch thread, whatever `--workers`; a finished run of the same spec
and commit is reused (tools/bench/runs.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from algorithms.data.setup import ScenarioSpec
from testnet.simulation.simulator import SimulationSpec

from .results import capture, save
from .runs import simulate_all, write_summary

METHODS = ("scool-local", "scool-dirac", "scool-sbm", "scool-attention")
# T, the pruning round and the score batch were chosen on 0-2; the scale guard (outliers.py) was
# fitted while looking at 3 and 4, which turned their table from failing to passing (issue #44)
TUNING_SEEDS = (0, 1, 2, 3, 4)
THREADS = 1  # runs.py: every run one torch thread


def talked_to(run: dict) -> float:
    """Largest share of its peers any node sent to in the last round."""
    last = run["recipients_last_round"]
    if last is None or None in last:
        return float("nan")
    return max(last) / (run["nodes"] - 1)


def render(result: dict) -> str:
    """One row per node count and method: means ± std over the seeds, the worst node of any
    seed, L1 to truth at rounds 10 and 20 (mean and worst seed) and at the end (worst seed)."""
    data = result["data"]
    rows = [
        "| nodes | method | 10-way accuracy | own-class accuracy | worst node (own-class) | "
        "L1 @10 | L1 @20 | L1 final (worst seed) | most peers talked to, last round | KB / node / round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[int, str], list[dict]] = {}
    for run in data["runs"]:
        groups.setdefault((run["nodes"], run["algorithm"]), []).append(run)
    for (nodes, method), runs in groups.items():
        ten = np.array([run["accuracy"]["mean"] for run in runs]) * 100
        own = np.array([run["accuracy_own_classes"]["mean"] for run in runs]) * 100
        worst = min(min(run["accuracy_own_classes"]["per_node"]) for run in runs) * 100
        l1 = [run["l1_to_truth_per_round"] for run in runs]
        at = lambda k, l1=l1: (  # noqa: E731
            f"{np.mean([x[k - 1] for x in l1]):.3f} (max {max(x[k - 1] for x in l1):.3f})"
            if all(len(x) >= k for x in l1)
            else "—"  # a run shorter than k rounds
        )
        final = max(x[-1] for x in l1)
        kb = np.mean([run["bytes"] / (nodes * run["rounds"]) / 1024 for run in runs])
        talk = max(talked_to(run) for run in runs)
        rows.append(
            f"| {nodes} | {method} | {ten.mean():.1f} ± {ten.std():.1f} | {own.mean():.1f} ± {own.std():.1f} "
            f"| {worst:.0f} % | {at(10)} | {at(20)} | {final:.3f} | {talk:.0%} | {kb:,.0f} |"
        )
    seeds = sorted({run["seed"] for run in data["runs"]})
    rows += [
        "",
        f"{data['rounds']} rounds, {data['samples_per_class']} training and {data['test_per_class']} test samples "
        f"per class and node, seeds {', '.join(map(str, seeds))}; defaults chosen on seeds "
        f"{', '.join(map(str, data['tuning_seeds']))}, which the table leaves out.",
    ]
    return "\n".join(rows)


def _kept(report: dict) -> dict:
    """What the table needs of a run's report."""
    return {
        "algorithm": report["algorithm"],
        "nodes": report["nodes"],
        "seed": report["seed"],
        "rounds": report["rounds"],
        "accuracy": {key: report["accuracy"][key] for key in ("mean", "std", "per_node")},
        "accuracy_own_classes": {key: report["accuracy_own_classes"][key] for key in ("mean", "std", "per_node")},
        "l1_to_truth_per_round": report["graph"]["l1_to_truth_per_round"],
        "bytes": report["comm"]["bytes"],
        "recipients_last_round": report["comm"].get("recipients_last_round"),
        "wall_s": report["wall_s"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/scool")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 20])
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[13, 14, 15], help="evaluation seeds (a saved table: not 0 to 4)"
    )
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--save", metavar="NAME", help="write the table's runs to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    tuned = sorted(set(args.seeds) & set(TUNING_SEEDS))
    if tuned and args.save:
        parser.error(f"--save: seed {tuned[0]} tuned SCooL's defaults; a saved table comes from others (5 and up)")
    samples, test = 10, 15

    def spec(method: str, nodes: int, seed: int) -> SimulationSpec:
        return SimulationSpec(
            algorithm=method,
            data=ScenarioSpec(
                dataset="mnist5k",
                scenario="noniid-sbm",
                nodes=nodes,
                seed=seed,
                samples_per_class=samples,
                test_per_class=test,
            ),
            rounds=args.rounds,
        )

    jobs = [
        (spec(m, n, s), f"{args.out}/n{n}-{m}-seed{s}") for n in args.nodes for m in args.methods for s in args.seeds
    ]
    words = ["python", "-m", "tools.bench.scool", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, seeds=args.seeds, threads=THREADS, runs=len(jobs)) as provenance:
        reports = simulate_all(jobs, args.workers, reuse=True)
    keys = ("algorithm", "nodes", "seed", "accuracy", "accuracy_own_classes", "graph", "comm", "wall_s")
    write_summary(reports, keys, Path(args.out, "summary.json"))
    data = {
        "rounds": args.rounds,
        "samples_per_class": samples,
        "test_per_class": test,
        "tuning_seeds": list(TUNING_SEEDS),
        "runs": [_kept(report) for report in reports],
    }
    print(render({"data": data}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.scool', provenance, data)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
