"""`make demo`: ten MAPL-Dual daemons learn over TCP on real MNIST digits, beside Local (and Oracle).

    python -m tools.demo --out demo-out [--nodes 10] [--rounds 80] [--baselines [local] [oracle]] [--quick]

The daemons run the MAPL-Dual testnet (Scenario 1: two clusters with disjoint classes, 10
training and 80 test samples per class per node, the four CPU backbones): the setting where
collaboration pays, +5 points over Local in BENCHMARKS.md. The same nodes then run the baselines
in the simulator: Local (each node alone) and Oracle (each node on its true cluster's pooled
data, the ceiling). It prints one row per node, each accuracy with its 95 % Wilson interval, and
the methods compared with paired bootstrap intervals (the gain over Local and its 95 % interval);
report.md and the plots (the baselines on the same axes) are in OUT/mapl-dual-testnet/.
`--quick` (with small --nodes and --rounds) is a smoke test, not for numbers: a warm-up of one
round and no accuracy or within-cluster mass to reach.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from algorithms.catalog import BASELINES
from testnet.learning import run_learning_testnet
from testnet.progress import RoundProgress
from testnet.report import CheckThresholds, attach_baselines, summary_line, write_report
from testnet.simulator import SimulationSpec, run_baselines
from testnet.summary import methods_table, per_node_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo-out")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=80)
    # Local by default (92 s in BENCHMARKS.md's `make demo`); Oracle, the ceiling, on request: it took
    # 160 s more in the learning benchmark's Scenario 1.
    parser.add_argument("--baselines", nargs="*", choices=BASELINES, default=["local"])
    parser.add_argument("--quick", action="store_true", help="warm-up 1 round, no thresholds: a smoke test")
    args = parser.parse_args(argv)
    out = Path(args.out) / "mapl-dual-testnet"
    spec = SimulationSpec(
        algorithm="mapl-dual",
        dataset="mnist5k",
        scenario="1",
        nodes=args.nodes,
        rounds=args.rounds,
        samples_per_class=10,
        test_per_class=80,
        overrides={"warmup_rounds": "1"} if args.quick else {},
    )
    print(
        f"MAPL-Dual testnet: {args.nodes} daemons, mnist5k, Scenario 1, 10 training and 80 test samples per class, "
        f"{args.rounds} rounds",
        file=sys.stderr,
    )
    check = CheckThresholds(accuracy=0.0, within_cluster_mass=0.0) if args.quick else CheckThresholds()
    code, mapl = run_learning_testnet(spec, out, check=check)
    if args.baselines and code != 130:
        print(f"Baselines on the same nodes, simulated: {', '.join(args.baselines)}", file=sys.stderr)
        import torch

        torch.set_num_threads(1)
        attach_baselines(mapl, run_baselines(spec, args.baselines, progress=RoundProgress))
    written = write_report(mapl, out)
    print(per_node_table(mapl))
    print()
    print(methods_table(mapl))
    print(summary_line(mapl))
    gain = mapl["baselines"].get("local", {}).get("difference")
    if gain is not None:
        verdict = "above 0: collaboration helped" if gain["low"] > 0 else "not above 0"
        print(
            f"MAPL-Dual − Local: {gain['mean'] * 100:+.1f} points, 95 % paired interval "
            f"[{gain['low'] * 100:+.1f}, {gain['high'] * 100:+.1f}] ({verdict})"
        )
    for failure in mapl.get("check", {}).get("failures", []):
        print(f"check failed: {failure}")
    print(f"report and plots: {', '.join(str(path) for path in written[1:])}; daemon logs: {out}/node*/node.log")
    return code


if __name__ == "__main__":
    sys.exit(main())
