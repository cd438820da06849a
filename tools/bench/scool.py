"""The SCooL benchmark of BENCHMARKS.md: Local, D-PSGD (SCooL-Dirac), SCooL-SBM and
SCooL-attention on mnist5k's non-IID SBM partition (groups of nodes with a disjoint pair of
classes each), 10 training samples per class per node, 10 and 20 nodes, 3 seeds, simulated.

    python -m tools.bench.scool --out bench-out/scool [--rounds 30] [--workers 2]

Prints mean ± std over seeds of the 10-way and own-class accuracy, the worst node, L1 to truth at
rounds 10 and 20 and at the end (worst seed), peers talked to after pruning, and bytes per node
per round. Each run is one process with one torch thread.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from testnet.simulator import SimulationSpec

from .runs import simulate_all, write_summary

METHODS = ("scool-local", "scool-dirac", "scool-sbm", "scool-attention")


def talked_to(report: dict) -> float:
    """Largest share of its peers any node sent to in the last round."""
    last = report["comm"].get("recipients_last_round")
    if last is None:
        return float("nan")
    return max(last) / (report["nodes"] - 1)


def format_table(reports: list[dict]) -> str:
    rows = [
        "| nodes | method | 10-way accuracy | own-class accuracy | worst node (own-class) | "
        "L1 @10 | L1 @20 | L1 final (worst seed) | most peers talked to, last round | KB / node / round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[int, str], list[dict]] = {}
    for r in reports:
        groups.setdefault((r["nodes"], r["algorithm"]), []).append(r)
    for (nodes, method), runs in groups.items():
        ten = np.array([r["accuracy"]["mean"] for r in runs]) * 100
        own = np.array([r["accuracy_own_classes"]["mean"] for r in runs]) * 100
        worst = min(min(r["accuracy_own_classes"]["per_node"]) for r in runs) * 100
        l1 = [r["graph"]["l1_to_truth_per_round"] for r in runs]
        at = lambda k, l1=l1: (  # noqa: E731
            f"{np.mean([x[k - 1] for x in l1]):.3f} (max {max(x[k - 1] for x in l1):.3f})"
            if all(len(x) >= k for x in l1)
            else "—"  # a run shorter than k rounds
        )
        final = max(x[-1] for x in l1)
        kb = np.mean([r["comm"]["bytes"] / (nodes * r["rounds"]) / 1024 for r in runs])
        talk = max(talked_to(r) for r in runs)
        rows.append(
            f"| {nodes} | {method} | {ten.mean():.1f} ± {ten.std():.1f} | {own.mean():.1f} ± {own.std():.1f} "
            f"| {worst:.0f} % | {at(10)} | {at(20)} | {final:.3f} | {talk:.0%} | {kb:,.0f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/scool")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 20])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    args = parser.parse_args(argv)

    def spec(method: str, nodes: int, seed: int) -> SimulationSpec:
        return SimulationSpec(
            algorithm=method,
            dataset="mnist5k",
            scenario="noniid-sbm",
            nodes=nodes,
            rounds=args.rounds,
            seed=seed,
            samples_per_class=10,
            test_per_class=15,
        )

    jobs = [
        (spec(m, n, s), f"{args.out}/n{n}-{m}-seed{s}")
        for n in args.nodes
        for m in args.methods
        for s in range(args.seeds)
    ]
    reports = simulate_all(jobs, args.workers)
    print(format_table(reports))
    keys = ("algorithm", "nodes", "seed", "accuracy", "accuracy_own_classes", "graph", "comm", "wall_s")
    write_summary(reports, keys, Path(args.out, "summary.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
