"""The async schedule under churn (issue #29): daemons killed while they learn, restarted, and
the testnet's `--check` still passing; prints one markdown table.

    python -m tools.bench.churn [--out DIR] [--seed 0] [--schedule async] [--save churn-async]

MAPL-Dual on mnist5k Scenario 1, 10 daemons on the four CPU backbones, 10 training and 80 test
images per class, 80 rounds, the stragglers setting (tools/bench/stragglers.py); `--churn
every=30,down=10,count=2`: 20 % of the daemons are killed (SIGKILL: no BYE, nothing saved on the
way out), 30 s apart, and started again 10 s later from their checkpoints. The row says who went
down when, the round each resumed from, how long it was gone, and the run's verdict with the
default `--check` thresholds (every node finishes, mean accuracy ≥ 0.6, within-cluster mass ≥ 0.9).
The exit code is the verdict's.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from p2pnode.learning.rounds import ASYNC, SYNC, Schedule
from testnet.launch.churn import ChurnSpec
from testnet.launch.learning import run_learning_testnet
from testnet.reporting.report import CheckThresholds

from .results import capture, save
from .stragglers import spec_of

CHURN = "every=30,down=10,count=2"  # 2 of 10 daemons: the 20 %
KEYS = (
    "seed",
    "nodes",
    "rounds",
    "samples_per_class",
    "test_per_class",
    "schedule",
    "accuracy",
    "graph",
    "last_round_per_node",
    "check",
    "wall_s",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/churn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--samples", type=int, default=10, help="training images per class and node")
    parser.add_argument("--test", type=int, default=80, help="test images per own class and node")
    parser.add_argument("--check-accuracy", type=float, default=CheckThresholds.accuracy, metavar="FRACTION")
    parser.add_argument("--check-mass", type=float, default=CheckThresholds.within_cluster_mass, metavar="FRACTION")
    parser.add_argument("--schedule", choices=(SYNC, ASYNC), default=ASYNC)
    parser.add_argument("--churn", default=CHURN, metavar="SPEC", help="as the testnet's --churn")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as the testnet's --set")
    parser.add_argument("--save", metavar="NAME", help="write the run to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    overrides = dict(item.split("=", 1) for item in args.set)
    # The stragglers benchmark's setting (its argument names are these), under the schedule asked for.
    spec = dataclasses.replace(spec_of(args, args.seed), schedule=Schedule(schedule=args.schedule), overrides=overrides)
    words = ["python", "-m", "tools.bench.churn", *(sys.argv[1:] if argv is None else argv)]
    settings = {"algorithm.schedule": args.schedule} if args.schedule != SYNC else {}
    settings |= {f"algorithm.settings.{key}": value for key, value in overrides.items()}
    thresholds = CheckThresholds(accuracy=args.check_accuracy, within_cluster_mass=args.check_mass)
    with capture(words, settings=settings, seeds=[args.seed], threads=1, runs=1) as provenance:
        code, report = run_learning_testnet(spec, Path(args.out), check=thresholds, churn=ChurnSpec.parse(args.churn))
    data = {
        **{key: report[key] for key in KEYS},
        "churn": report["processes"]["churn"],
        "exit_code": code,
    }
    print(render({"data": data}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.churn', provenance, data)}")
    return code


def render(result: dict) -> str:
    data = result["data"]
    check, events = data["check"], data["churn"]["events"]
    gone = "; ".join(
        f"node {e['node']} at {e['killed_s']:.0f} s, back after {e['back_after_s']:.0f} s, "
        f"resumed from round {e['resumed_from']}"
        for e in events
    )
    last = data["last_round_per_node"]
    finished = sum(r is not None and r >= data["rounds"] - 1 for r in last)  # async: overtime runs past it
    verdict = "**passed**" if check["passed"] else f"**failed**: {'; '.join(check['failures'])}"
    schedule = data["schedule"]["schedule"]  # a testnet's report.json: its [algorithm] schedule settings
    rows = [
        "| schedule | killed (SIGKILL) and restarted | nodes finished | accuracy, % (mean ± sd) "
        "| within-cluster mass | `--check` | wall, s |",
        "|---|---|---|---|---|---|---|",
        f"| {schedule} | {gone or 'none'} | {finished}/{len(last)} "
        f"| {data['accuracy']['mean'] * 100:.1f} ± {data['accuracy']['std'] * 100:.1f} "
        f"| {data['graph']['within_cluster_mass']:.3f} | {verdict} | {data['wall_s']:.0f} |",
        "",
        f"MAPL-Dual, mnist5k Scenario 1, {data['nodes']} daemons on the four CPU backbones, "
        f"{data['samples_per_class']} training and {data['test_per_class']} test images per class, {data['rounds']} "
        f"rounds, seed {data['seed']}; `--churn {_spec(data['churn']['spec'])}`; `--check`: every node finishes, "
        f"accuracy ≥ {check['thresholds']['accuracy']:.0%}, within-cluster mass ≥ "
        f"{check['thresholds']['within_cluster_mass']:g}.",
    ]
    return "\n".join(rows)


def _spec(spec: dict) -> str:
    count = "" if spec["count"] is None else f",count={spec['count']}"
    return f"every={spec['every_s']:g},down={spec['down_s']:g}{count}"


if __name__ == "__main__":
    sys.exit(main())
