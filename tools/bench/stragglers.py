"""The stragglers benchmark of BENCHMARKS.md (issue #29): what slow devices cost the fast ones
under today's synchronous rounds, on the simulator's clock; prints one markdown table.

    python -m tools.bench.stragglers --out bench-out/stragglers [--seeds 1 2] [--workers 2]
                                     [--slow 0.3:5] [--save stragglers]

MAPL-Dual on mnist5k Scenario 1, 10 nodes on the four CPU backbones, 10 training and 80 test
images per class, 80 rounds; per seed two runs on the same nodes: "equal" (every node at speed 1)
and "slow" (`--slow 0.3:5`: 3 nodes drawn by the seed step 5× slower). For each fast node the
figure is the simulated time at which it first reached its final accuracy of the equal run, in
either run (testnet/report.py:time_to_accuracy); the ratio slow/equal is what the slow nodes
cost it. Simulated seconds come from the fixed step costs of testnet/clock.py, so the figures do
not depend on the machine (its load only stretches how long the benchmark takes). Each run is
one process with one torch thread; a finished run of the same spec and commit is reused
(tools/bench/runs.py). Seed 0 tuned the hyper-parameters: the defaults evaluate on 1 and 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

from testnet.report import time_to_accuracy
from testnet.simulator import SimulationSpec
from testnet.spec import parse_slow

from .results import capture, save
from .runs import simulate_all

THREADS = 1  # runs.py: every run one torch thread
KEYS = ("seed", "backbones", "slow", "accuracy", "time_to_accuracy", "missing_payloads", "rejections", "timing")


def spec_of(args: argparse.Namespace, seed: int) -> SimulationSpec:
    return SimulationSpec(
        algorithm="mapl-dual",
        dataset="mnist5k",
        scenario="1",
        nodes=args.nodes,
        rounds=args.rounds,
        seed=seed,
        samples_per_class=args.samples,
        test_per_class=args.test,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/stragglers")
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--samples", type=int, default=10, help="training images per class and node")
    parser.add_argument("--test", type=int, default=80, help="test images per own class and node")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--slow", default="0.3:5", metavar="FRACTION:FACTOR")
    parser.add_argument("--save", metavar="NAME", help="write the runs to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    slow = parse_slow(args.slow)
    jobs = []
    for seed in args.seeds:
        equal = spec_of(args, seed)
        jobs += [
            (equal, f"{args.out}/equal-seed{seed}"),
            (dataclasses.replace(equal, slow=slow), f"{args.out}/slow-seed{seed}"),
        ]
    words = ["python", "-m", "tools.bench.stragglers", *(sys.argv[1:] if argv is None else argv)]
    settings = {"simulate.slow": args.slow} | ({} if args.rounds == 80 else {"rounds": args.rounds})
    with capture(words, settings=settings, seeds=args.seeds, threads=THREADS, runs=len(jobs)) as provenance:
        reports = simulate_all(jobs, args.workers, reuse=True)
    runs = [{key: report[key] for key in KEYS} for report in reports]
    data = {
        "algorithm": "mapl-dual",
        "scenario": "1",
        "nodes": args.nodes,
        "rounds": args.rounds,
        "samples_per_class": args.samples,
        "test_per_class": args.test,
        "runs": runs,
    }
    print(render({"data": data}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.stragglers', provenance, data)}")
    return 0


def fast_times(equal: dict, slow: dict) -> tuple[list[int], list[float | None], list[float | None]]:
    """The fast nodes of `slow`'s run, and the simulated time each took to reach its final
    accuracy of the equal run, in the equal run and in the slow one (None: never)."""
    fast = [i for i in range(len(equal["backbones"])) if i not in slow["slow"]["nodes"]]
    targets = equal["accuracy"]["per_node"]

    def curves(run: dict) -> list[list[tuple[float, float]]]:
        timed = run["time_to_accuracy"]
        return [
            list(zip(*pair, strict=True))
            for pair in zip(timed["ended_at_per_node"], timed["accuracy_per_node"], strict=True)
        ]

    in_equal = time_to_accuracy(curves(equal), targets)
    in_slow = time_to_accuracy(curves(slow), targets)
    return fast, [in_equal[i] for i in fast], [in_slow[i] for i in fast]


def render(result: dict) -> str:
    """One row per seed: the fast nodes' time to their equal-run final accuracy in both runs and
    its ratio, the runs' ends, and the final accuracy of the fast and the slow nodes in both."""
    data = result["data"]
    by = {(run["seed"], run["slow"] is not None): run for run in data["runs"]}
    rows = [
        "| seed | slow nodes (×factor) | fast nodes reaching it | time to equal-run final accuracy, fast nodes, "
        "s (equal → slow; mean) | slow / equal | last round ends, s (equal → slow) "
        "| final accuracy, %, fast nodes (equal → slow) | slow nodes (equal → slow) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed in sorted({seed for seed, _ in by}):
        equal, slow = by.get((seed, False)), by.get((seed, True))
        if equal is None or slow is None:
            continue
        fast, in_equal, in_slow = fast_times(equal, slow)
        reached = [t for t in in_slow if t is not None]
        mean_equal = statistics.fmean(t for t in in_equal if t is not None)
        mean_slow = statistics.fmean(reached) if reached else None
        slow_nodes = slow["slow"]["nodes"]

        def mean_accuracy(run: dict, nodes: list[int]) -> str:
            return f"{statistics.fmean(run['accuracy']['per_node'][i] for i in nodes) * 100:.1f}"

        def ends(run: dict) -> float:
            return max(times[-1] for times in run["time_to_accuracy"]["ended_at_per_node"])

        rows.append(
            f"| {seed} | {', '.join(map(str, slow_nodes))} (×{slow['slow']['factor']:g}) | {len(reached)}/{len(fast)} "
            f"| {mean_equal:.1f} → {'—' if mean_slow is None else f'{mean_slow:.1f}'} "
            f"| {'—' if mean_slow is None else f'**{mean_slow / mean_equal:.2f}**'} "
            f"| {ends(equal):.1f} → {ends(slow):.1f} "
            f"| {mean_accuracy(equal, fast)} → {mean_accuracy(slow, fast)} "
            f"| {mean_accuracy(equal, slow_nodes)} → {mean_accuracy(slow, slow_nodes)} |"
        )
    rows += [
        "",
        f"MAPL-Dual, mnist5k Scenario {data['scenario']}, {data['nodes']} nodes on the four CPU backbones, "
        f"{data['samples_per_class']} training and {data['test_per_class']} test images per class, {data['rounds']} "
        "rounds, today's sync schedule (quorum 1.0, round deadline 30 s), 5 ms latency; simulated seconds "
        "(testnet/clock.py's step costs). The time of a node is the first round end at which its accuracy reached its "
        "final accuracy of the equal run; the mean is over the fast nodes that reached it.",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
