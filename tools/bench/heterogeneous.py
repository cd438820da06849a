"""The heterogeneous-learning benchmark of BENCHMARKS.md (issue #13): mnist5k, 10 nodes,
Scenarios 1 and 2, 5 and 10 training samples per class, 80 test samples per class (so one test
image is 0.25 points, not 1.3), 80 rounds, seeds 0/1/2, every method on the same partitions and
compared with Local seed by seed (paired). Prints one markdown table.

    python -m tools.bench.heterogeneous --out bench-out/heterogeneous [--methods local mapl-dual]
        [--scenarios 1 2] [--samples 5 10] [--seeds 0 1 2] [--workers 2] [--set KEY=VALUE]

Heterogeneous methods run the four CPU backbones (node i the i-th modulo 4); the homogeneous
ones (mapl+, sfmtl, scool-attention) run the convnet everywhere and are paired with
`local@convnet` (Local with the convnet everywhere) when it is among the methods. Scenario 2's
classes 3–6 are on all 10 nodes and mnist5k has 500 images per class, so its test split is
capped at 50 − samples per class (40 at 10, 45 at 5): the training samples stay as asked.
A run whose report is already in its folder is read, not run again: delete the folder to re-run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from testnet.simulator import SimulationSpec

from .runs import simulate_all, write_summary

METHODS = ("local", "local@convnet", "oracle", "mapl", "mapl+", "mapl-dual", "fedmrl", "sfmtl", "scool-attention")
BASELINES = ("local", "local@convnet", "oracle")  # run with their defaults, whatever --set says


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/heterogeneous")
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--scenarios", nargs="+", default=["1", "2"])
    parser.add_argument("--samples", nargs="+", type=int, default=[10, 5])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--test-per-class", type=int, default=80)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every method but local")
    parser.add_argument("--tag", default="", help="suffix of the run folders (for runs with --set)")
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)

    def spec(label: str, scenario: str, samples: int, seed: int) -> SimulationSpec:
        method, _, backbone = label.partition("@")
        return SimulationSpec(
            algorithm=method,
            dataset="mnist5k",
            scenario=scenario,
            nodes=10,
            rounds=args.rounds,
            seed=seed,
            samples_per_class=samples,
            test_per_class=min(args.test_per_class, 50 - samples) if scenario == "2" else args.test_per_class,
            backbones=(backbone,) if backbone else None,
            overrides={} if method in BASELINES else overrides,
        )

    labels = ["local", *(m for m in args.methods if m != "local")]
    runs = [
        (label, sc, n, seed) for n in args.samples for sc in args.scenarios for label in labels for seed in args.seeds
    ]
    jobs = [
        (
            spec(*run),
            f"{args.out}/sc{run[1]}-spc{run[2]}-{run[0]}{'' if run[0] in BASELINES else args.tag}-seed{run[3]}",
        )
        for run in runs
    ]
    reports = simulate_all(jobs, args.workers, reuse=True)
    labelled = [(run[0], report) for run, report in zip(runs, reports, strict=True)]
    print(format_table(labelled))
    keys = ("algorithm", "scenario", "samples_per_class", "seed", "accuracy", "accuracy_by_predictor", "graph", "comm")
    write_summary(reports, keys, Path(args.out, f"summary{args.tag}.json"))
    return 0


def _kib_per_node_round(report: dict) -> float:
    return report["comm"]["bytes"] / report["nodes"] / report["rounds"] / 1024


def format_table(labelled: list[tuple[str, dict]]) -> str:
    """One row per (samples, scenario, method): accuracy per seed, the paired difference to
    Local per seed (to Local on the convnet for a one-backbone method, when it ran) and its
    mean, and the graph and traffic (means over the seeds)."""
    from algorithms.registry import ALGORITHMS

    groups: dict[tuple, list[dict]] = {}
    for label, r in labelled:
        groups.setdefault((r["samples_per_class"], r["scenario"], label), []).append(r)
    rows = [
        "| spc | scenario | method | accuracy per seed (mean ± std over nodes, %) | − baseline per seed | "
        "mean − baseline | mass | L1 | ARI | KiB / node / round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (samples, scenario, label), runs in groups.items():
        homogeneous = ALGORITHMS[runs[0]["algorithm"]].homogeneous
        base_label = "local@convnet" if homogeneous and (samples, scenario, "local@convnet") in groups else "local"
        base = {r["seed"]: r for r in groups.get((samples, scenario, base_label), [])}
        accuracy = " / ".join(f"{r['accuracy']['mean'] * 100:.1f} ± {r['accuracy']['std'] * 100:.1f}" for r in runs)
        paired = [
            (r["accuracy"]["mean"] - base[r["seed"]]["accuracy"]["mean"]) * 100 for r in runs if r["seed"] in base
        ]
        shown = paired and label not in BASELINES
        graph = [r["graph"] for r in runs]
        rows.append(
            f"| {samples} | {scenario} | {label} | {accuracy} | "
            f"{' / '.join(f'{d:+.1f}' for d in paired) + f' ({base_label})' if shown else '—'} | "
            f"{f'{statistics.mean(paired):+.1f}' if shown else '—'} | "
            f"{statistics.mean(g['within_cluster_mass'] for g in graph):.3f} | "
            f"{statistics.mean(g['l1_to_truth'] for g in graph):.3f} | "
            f"{statistics.mean(g['community_agreement'] for g in graph):.2f} | "
            f"{statistics.mean(_kib_per_node_round(r) for r in runs):,.0f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
