"""The simulator's clock: simulated seconds, an event queue, and what each thing costs in them.

No wall clock enters a decision: a node's local step takes `step_costs` (its backbone's fixed
cost per training sample × its samples × its speed factor), its end of round (graph step and
evaluation, after its gather) `end_costs` (its backbone's fixed cost per test sample × its test
samples × its speed factor: a slower device evaluates slower too), a frame takes `latency_s` from its
sender to its addressees, and a node's gather ends by the daemon's own rule (p2pnode/learning/rounds.py's
`Gather`: quorum, grace, deadline) read at simulated times. Events are ordered by (time, kind,
sender, sequence), so a run repeats exactly, whatever the engine and however long the real
computation took. testnet/simulation/exchange.py runs the nodes on this clock.

Why a fixed cost table rather than each step's measured wall time: a measured time would make the
schedule, and with it who waits for whom and every accuracy that follows, depend on the machine
and on its load at that moment; a fixed table makes a run a function of its spec. The costs were
measured once, by `python -m tools.bench.clock_costs` (BENCHMARKS.md, "The simulator's cost
table"): MAPL-Dual (its defaults, one torch thread) on mnist5k with 10 training and 80 test images
per class, 80 rounds, median of rounds 1-79, the local step divided by the node's training images
and the end of round by its test images, on the project's 2-core development machine, quiet
(2026-11-27; the table before, steps only, was 3-5× higher: measured on 2026-11-26 beside other
work). Only their ratios, and their size against `latency_s` and the gather's
deadline, shape a schedule; `SimulationSpec.step_s` and `end_s` replace them with one cost for
every node.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from typing import Any

__all__ = [
    "EventQueue",
    "STEP",
    "ARRIVAL",
    "CLOSE",
    "BEGIN",
    "STEP_S_PER_SAMPLE",
    "END_S_PER_TEST_SAMPLE",
    "step_costs",
    "end_costs",
]

# A local step's simulated seconds per training image, by backbone (see above).
STEP_S_PER_SAMPLE = {"convnet": 0.00100, "resnet": 0.00112, "mobilenet": 0.00109, "mlp": 0.00066}
OTHER_BACKBONE_S_PER_SAMPLE = 0.00100  # the GPU family, which has not been measured on a CPU: as convnet
# An end of round's (graph step and evaluation) simulated seconds per test image, by backbone.
END_S_PER_TEST_SAMPLE = {"convnet": 0.00029, "resnet": 0.00023, "mobilenet": 0.00022, "mlp": 0.00016}
OTHER_BACKBONE_END_S_PER_TEST_SAMPLE = 0.00029  # as convnet

# What happens at one instant, in this order: local steps end (their payloads go out), frames
# arrive (answers to them go out), then the open gathers are looked at, then the nodes whose end
# of round is over begin their next. So a frame that arrives exactly at a gather's deadline still
# counts, as the daemon delivers before it checks.
STEP, ARRIVAL, CLOSE, BEGIN = 0, 1, 2, 3


def step_costs(
    backbones: Sequence[str], samples: Sequence[int], factors: Sequence[float], fixed_s: float | None = None
) -> list[float]:
    """Each node's local step in simulated seconds: `fixed_s` or its backbone's cost per image ×
    its training images, times its speed factor (`--slow`)."""
    return [
        (fixed_s if fixed_s is not None else STEP_S_PER_SAMPLE.get(backbone, OTHER_BACKBONE_S_PER_SAMPLE) * count)
        * factor
        for backbone, count, factor in zip(backbones, samples, factors, strict=True)
    ]


def end_costs(
    backbones: Sequence[str], test_samples: Sequence[int], factors: Sequence[float], fixed_s: float | None = None
) -> list[float]:
    """Each node's end of round in simulated seconds: `fixed_s` or its backbone's cost per test
    image × its test images, times its speed factor."""
    return [
        (
            fixed_s
            if fixed_s is not None
            else END_S_PER_TEST_SAMPLE.get(backbone, OTHER_BACKBONE_END_S_PER_TEST_SAMPLE) * count
        )
        * factor
        for backbone, count, factor in zip(backbones, test_samples, factors, strict=True)
    ]


class EventQueue:
    """Events keyed (time, kind, sender, sequence): `pop` hands out all those of the earliest
    (time, kind) at once, in sender order and, for one sender, in the order they were pushed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, Any]] = []
        self._sequence = itertools.count()

    def push(self, time: float, kind: int, sender: int, item: Any) -> None:
        heapq.heappush(self._heap, (time, kind, sender, next(self._sequence), item))

    def pop(self) -> tuple[float, int, list[Any]]:
        """The earliest (time, kind) and its events' items; raises IndexError when empty."""
        time, kind = self._heap[0][:2]
        items = []
        while self._heap and self._heap[0][:2] == (time, kind):
            items.append(heapq.heappop(self._heap)[4])
        return time, kind, items

    def __len__(self) -> int:
        return len(self._heap)
