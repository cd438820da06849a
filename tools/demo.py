"""`make demo`: ten MAPL daemons learn over TCP on real MNIST digits, next to a Local run.

    python -m tools.demo --out demo-out [--nodes 10] [--rounds 60]

The daemons run the MAPL testnet (Scenario 1: two clusters with disjoint classes, 25 training
samples per class per node, the four CPU backbones); the same nodes then train alone in the
simulator (Local, no communication). It prints one row per node and where the plots are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testnet.learning import run_learning_testnet
from testnet.report import CheckThresholds, summary_line, write_report
from testnet.simulator import SimulationSpec, run_simulation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo-out")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args(argv)
    out = Path(args.out)
    spec = SimulationSpec(
        algorithm="mapl", dataset="mnist5k", scenario="1", nodes=args.nodes, rounds=args.rounds, samples_per_class=25
    )
    print(
        f"MAPL testnet: {args.nodes} daemons, mnist5k, Scenario 1, 25 samples per class, {args.rounds} rounds",
        file=sys.stderr,
    )
    code, mapl = run_learning_testnet(spec, out / "mapl-testnet", check=CheckThresholds())
    write_report(mapl, out / "mapl-testnet")
    print("Local baseline (same shards, no communication), simulated:", file=sys.stderr)
    import torch

    torch.set_num_threads(1)
    local = run_simulation(SimulationSpec(**{**vars(spec), "algorithm": "local"}))
    write_report(local, out / "local")
    print(format_table(mapl, local))
    print(summary_line(mapl))
    for failure in mapl.get("check", {}).get("failures", []):
        print(f"check failed: {failure}")
    print(
        f"plots: {out / 'mapl-testnet'}/graph.png (learned W beside W*), accuracy.png, bytes.png; "
        f"daemon logs: {out / 'mapl-testnet'}/node*/node.log"
    )
    return code


def format_table(mapl: dict, local: dict) -> str:
    rows = [
        "| node | backbone | classes | neighbours (w > 0) | Local | MAPL over TCP | Δ |",
        "|---|---|---|---|---|---|---|",
    ]
    weights = mapl["graph"]["W"]
    for i, (m, lo) in enumerate(zip(mapl["accuracy"]["per_node"], local["accuracy"]["per_node"], strict=True)):
        neighbours = ", ".join(str(j) for j, w in enumerate(weights[i]) if w > 0 and j != i)
        classes = "".join(map(str, mapl["node_classes"][i]))
        acc = "—" if m is None else f"{100 * m:.1f} %"
        delta = "—" if m is None else f"{100 * (m - lo):+.1f}"
        rows.append(f"| {i} | {mapl['backbones'][i]} | {classes} | {neighbours} | {100 * lo:.1f} % | {acc} | {delta} |")
    m, lo = mapl["accuracy"]["mean"], local["accuracy"]["mean"]
    rows.append(
        f"| mean | | | | {100 * lo:.1f} % | {'—' if m is None else f'{100 * m:.1f} %'} | "
        f"{'—' if m is None else f'{100 * (m - lo):+.1f}'} |"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
