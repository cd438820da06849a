"""The learning benchmark of BENCHMARKS.md: every method on mnist5k, 10 nodes, 25 samples per
class, heterogeneous CPU backbones, Scenarios 1 and 2, simulated; prints one markdown table.

    python -m tools.bench.learning --out bench-out/learning [--rounds 60] [--workers 2]

Each run is one process with one torch thread; `--workers` runs that many at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

METHODS = ("local", "oracle", "fedproto", "mapl-nocgl", "mapl")


def _run(job: tuple[str, str, int, int, str]) -> dict:
    import torch

    from testnet.report import write_report
    from testnet.simulator import SimulationSpec, run_simulation

    algorithm, scenario, seed, rounds, out = job
    torch.set_num_threads(1)
    report = run_simulation(
        SimulationSpec(
            algorithm=algorithm,
            dataset="mnist5k",
            scenario=scenario,
            nodes=10,
            rounds=rounds,
            seed=seed,
            samples_per_class=25,
        )
    )
    write_report(report, Path(out))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/learning")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scenarios", nargs="+", default=["1", "2"])
    args = parser.parse_args(argv)
    jobs = [(m, s, 0, args.rounds, f"{args.out}/sc{s}-{m}-seed0") for s in args.scenarios for m in METHODS]
    jobs += [("mapl", s, 1, args.rounds, f"{args.out}/sc{s}-mapl-seed1") for s in args.scenarios]
    with ProcessPoolExecutor(args.workers) as pool:
        reports = list(pool.map(_run, jobs))
    print(format_table(reports))
    Path(args.out, "summary.json").write_text(
        json.dumps(
            [
                {k: r[k] for k in ("algorithm", "scenario", "seed", "accuracy", "graph", "comm", "wall_s")}
                for r in reports
            ],
            indent=1,
        )
    )
    return 0


def format_table(reports: list[dict]) -> str:
    from testnet.report import gap_share

    rows = [
        "| scenario | method | seed | accuracy (mean ± std) | gap realised | within-cluster mass | "
        "L1 to truth | messages | MiB | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
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
            f"{r['accuracy']['std'] * 100:.1f} | {'—' if share is None else f'{share * 100:.0f} %'} | "
            f"{r['graph']['within_cluster_mass']:.3f} | {r['graph']['l1_to_truth']:.3f} | {r['comm']['messages']} | "
            f"{r['comm']['bytes'] / 2**20:.1f} | {r['wall_s']:.0f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
