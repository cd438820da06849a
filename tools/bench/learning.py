"""The learning benchmark of BENCHMARKS.md: every method on mnist5k, 10 nodes, 25 samples per
class, heterogeneous CPU backbones, Scenarios 1 and 2, simulated; prints one markdown table.

    python -m tools.bench.learning --out bench-out/learning [--rounds 60] [--workers 2] [--methods local mapl]

Each run is one process with one torch thread; `--workers` runs that many at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testnet.simulator import SimulationSpec

from .runs import simulate_all, write_summary

METHODS = ("local", "oracle", "fedproto", "mapl-nocgl", "mapl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/learning")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scenarios", nargs="+", default=["1", "2"])
    parser.add_argument(
        "--methods", nargs="+", choices=METHODS, default=list(METHODS), help="only these (MAPL's seed 1 with mapl)"
    )
    args = parser.parse_args(argv)

    def spec(method: str, scenario: str, seed: int) -> SimulationSpec:
        return SimulationSpec(
            algorithm=method,
            dataset="mnist5k",
            scenario=scenario,
            nodes=10,
            rounds=args.rounds,
            seed=seed,
            samples_per_class=25,
        )

    jobs = [(spec(m, s, 0), f"{args.out}/sc{s}-{m}-seed0") for s in args.scenarios for m in args.methods]
    jobs += [(spec("mapl", s, 1), f"{args.out}/sc{s}-mapl-seed1") for s in args.scenarios if "mapl" in args.methods]
    reports = simulate_all(jobs, args.workers)
    print(format_table(reports))
    keys = ("algorithm", "scenario", "seed", "accuracy", "graph", "comm", "wall_s")
    write_summary(reports, keys, Path(args.out, "summary.json"))
    return 0


def format_table(reports: list[dict]) -> str:
    from testnet.summary import gap_share

    rows = [
        "| scenario | method | seed | accuracy (mean ± std) | − Local, points [95 % CI] | gap realised | "
        "within-cluster mass | L1 to truth | messages | MiB | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["scenario"], r["algorithm"], r["seed"]): r for r in reports}
    for r in reports:
        local = by.get((r["scenario"], "local", 0))
        oracle = by.get((r["scenario"], "oracle", 0))
        share = (
            gap_share(r["accuracy"]["mean"], local["accuracy"]["mean"], oracle["accuracy"]["mean"])
            if local and oracle
            else None
        )
        rows.append(
            f"| {r['scenario']} | {r['algorithm']} | {r['seed']} | {r['accuracy']['mean'] * 100:.1f} ± "
            f"{r['accuracy']['std'] * 100:.1f} | {_versus_local(r, by)} | "
            f"{'—' if share is None else f'{share * 100:.0f} %'} | "
            f"{r['graph']['within_cluster_mass']:.3f} | {r['graph']['l1_to_truth']:.3f} | {r['comm']['messages']} | "
            f"{r['comm']['bytes'] / 2**20:.1f} | {r['wall_s']:.0f} |"
        )
    return "\n".join(rows)


def _versus_local(report: dict, by: dict) -> str:
    """The method minus Local on the same nodes (same seed), with its paired bootstrap interval
    over nodes (testnet/intervals.py)."""
    from testnet.intervals import paired_difference

    local = by.get((report["scenario"], "local", report["seed"]))
    if local is None or report["algorithm"] == "local":
        return "—"
    d = paired_difference(report["accuracy"]["per_node"], local["accuracy"]["per_node"])
    return "—" if d is None else f"{d['mean'] * 100:+.1f} [{d['low'] * 100:+.1f}, {d['high'] * 100:+.1f}]"


if __name__ == "__main__":
    sys.exit(main())
