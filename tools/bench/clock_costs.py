"""Measures the simulator's cost table (testnet/simulation/clock.py): what a node's local step and its end
of round (graph step and evaluation) take on this machine, per backbone, in the stragglers
setting of BENCHMARKS.md; prints the table and how each cost compares with the clock's.

    python -m tools.bench.clock_costs [--rounds 80] [--save clock-costs]

MAPL-Dual on mnist5k Scenario 1, 10 nodes on the four CPU backbones, 10 training and 80 test
images per class, one process, one torch thread, the nodes' rounds run in lock-step in this
process (testnet/simulation/exchange.py's inline engine). Per node the median over rounds 1..N-1 (round 0
warms up), divided by its training images (step) or its test images (end of round); per backbone
the median over its nodes. The clock's table is a fixed copy of one such run, so the simulated
seconds do not move with the machine or its load; this script is how it was made and how to
check it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence

from algorithms.data.setup import ScenarioSpec
from p2pnode.learning.rounds import RoundRecord
from testnet.simulation.clock import END_S_PER_TEST_SAMPLE, STEP_S_PER_SAMPLE
from testnet.simulation.exchange import InlineHosts, Timeline
from testnet.simulation.host import Host
from testnet.simulation.shard import GatherRule
from testnet.simulation.simulator import SimulationSpec

from .results import capture, save

THREADS = 1


class TimedHost(Host):
    """A host that times each node's local step and end of round, in wall seconds."""

    def __init__(self, spec: SimulationSpec) -> None:
        super().__init__(spec, range(spec.nodes), threads=THREADS)
        self.step_s: dict[int, list[float]] = defaultdict(list)
        self.end_s: dict[int, list[float]] = defaultdict(list)

    def begin(self, nodes: Sequence[int]) -> None:
        for i in nodes:  # one at a time, so each node's step is timed alone
            started = time.perf_counter()
            super().begin([i])
            self.step_s[i].append(time.perf_counter() - started)

    def _end_round(self, i: int, now: float, end_s: float = 0.0) -> RoundRecord:
        """The shard's end of round (graph step, evaluation, record), timed."""
        started = time.perf_counter()
        record = super()._end_round(i, now, end_s)
        self.end_s[i].append(time.perf_counter() - started)
        return record


def measure(rounds: int) -> dict[str, dict[str, float]]:
    """Per backbone: seconds per training image of a local step, per test image of an end of round."""
    spec = SimulationSpec(
        algorithm="mapl-dual",
        data=ScenarioSpec(dataset="mnist5k", nodes=10, samples_per_class=10, test_per_class=80),
        rounds=rounds,
    )
    host = TimedHost(spec)
    ids = list(host.ids)
    rule = GatherRule(spec.quorum, spec.round_deadline_s, spec.straggler_grace_s)
    for _ in Timeline(InlineHosts([host]), ids, [1.0] * len(ids), 0.0, rule).run():
        pass
    per_backbone: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"step": [], "end": []})
    for i, backbone in enumerate(spec.node_backbones()):
        data = host.nodes[i].setup.data
        per_backbone[backbone]["step"].append(statistics.median(host.step_s[i][1:]) / len(data.train_labels))
        per_backbone[backbone]["end"].append(statistics.median(host.end_s[i][1:]) / len(data.test_labels))
    return {
        backbone: {kind: round(statistics.median(values), 5) for kind, values in costs.items()}
        for backbone, costs in sorted(per_backbone.items())
    }


def render(result: dict) -> str:
    costs = result["data"]["costs"]
    rows = [
        "| backbone | local step, s per training image (clock → measured) | end of round, s per test image "
        "(clock → measured) |",
        "|---|---|---|",
    ]
    for backbone, measured in costs.items():
        step, end = STEP_S_PER_SAMPLE[backbone], END_S_PER_TEST_SAMPLE[backbone]
        rows.append(
            f"| {backbone} | {step:.5f} → {measured['step']:.5f} ({measured['step'] / step:.2f}×) | "
            f"{end:.5f} → {measured['end']:.5f} ({measured['end'] / end:.2f}×) |"
        )
    rows.append("")
    rows.append(
        "MAPL-Dual, mnist5k Scenario 1, 10 nodes on the four CPU backbones, 10 training and 80 test images per "
        f"class; one process, one torch thread; median over rounds 1–{result['data']['rounds'] - 1} and over "
        "a backbone's nodes; clock: testnet/simulation/clock.py's fixed table."
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=80, help="rounds to run (the stragglers runs'); round 0 is left out"
    )
    parser.add_argument("--save", metavar="NAME", help="write the result to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be ≥ 2: round 0 only warms up")
    words = ["python", "-m", "tools.bench.clock_costs", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, seeds=[0], threads=THREADS) as provenance:
        costs = measure(args.rounds)
    data = {"rounds": args.rounds, "costs": costs}
    print(render({"data": data}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.clock_costs', provenance, data)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
