"""The simulator: every node of a scenario, exchanging real frames without sockets.

It drives the same algorithm interface the daemon drives, through the network of testnet/simulation/exchange.py
on a simulated clock (testnet/simulation/clock.py: step costs, latency, `--slow` nodes, the daemon's gather
rule), and builds its report from the same per-node-round records as the
learning testnet (testnet/reporting/report.py). `p2pnode simulate` is its command line. The nodes run on
an engine (testnet/simulation/hosting.py): all in this process (`inline`, the default), spread over worker
processes, or over Ray actors; the report is the same on each.

`poisoners` turns some nodes Byzantine (algorithms/methods/poison.py): they learn as the others do but
poison every learning payload they send, and the report measures their weight in the honest
rows of W and the honest nodes' accuracy.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from algorithms.catalog import BASELINES
from algorithms.data.setup import load_scenario
from algorithms.graphs.graph import within_cluster_mass
from algorithms.registry import applicable_overrides
from p2pnode.learning.rounds import RoundRecord

from ..reporting.provenance import provenance
from ..reporting.report import CheckThresholds, Truth, assemble, judge, run_header
from .clock import end_costs, step_costs
from .exchange import GatherRule, Hosts, Timeline, simulation_identity
from .hosting import INLINE, Engine, open_hosts
from .spec import SimulationSpec

__all__ = [
    "SimulationSpec",
    "RoundResult",
    "Engine",
    "run_simulation",
    "run_baselines",
    "simulation_identity",
    "timeline",
]


@dataclass(frozen=True)
class RoundResult:
    round: int
    rounds: int
    accuracy: float  # mean over nodes
    within_cluster_mass: float
    bytes: int  # cumulative
    elapsed_s: float


def run_simulation(
    spec: SimulationSpec,
    progress: Callable[[RoundResult], None] | None = None,
    thresholds: CheckThresholds | None = None,
    engine: Engine = INLINE,
) -> dict[str, Any]:
    """Run every round of `spec` on `engine` (testnet/simulation/hosting.py: the same report on each);
    returns the report (testnet/reporting/report.py), judged against `thresholds` if given."""
    started = time.perf_counter()
    config = spec.config_dict()  # a bad override fails here, before any host starts
    _, partition = load_scenario(spec.data)
    backbones = spec.node_backbones()
    ids = spec.node_ids()
    truth = Truth.of(partition)
    records: list[RoundRecord] = []
    with open_hosts(spec, engine) as hosts:
        device, mixed_precision = _placement(hosts.call("where", [()] * len(hosts.blocks)))
        made = {**provenance(spec.seed, device), "engine": engine.describe(len(hosts.blocks))}
        latest: dict[str, RoundRecord] = {}  # each node's latest record; progress is the slowest node's
        shown = -1
        for ended in timeline(spec, hosts, ids).run():
            records.extend(ended)
            latest.update((record.node, record) for record in ended)
            if progress is not None and len(latest) == len(ids) and min(r.round for r in latest.values()) > shown:
                shown = min(r.round for r in latest.values())
                progress(_progress([latest[node] for node in ids], truth, spec.rounds, time.perf_counter() - started))
        rejections = sum((Counter(part) for part in hosts.call("rejected", [()] * len(hosts.blocks))), Counter())
        made["engine"]["hosts"] = hosts.call("usage", [()] * len(hosts.blocks))
    header = run_header("simulation", spec, partition, ids, backbones, config, (device, mixed_precision), made)
    report = assemble(header, records, truth, rejections=rejections, wall_s=time.perf_counter() - started)
    report["check"] = judge(report, thresholds)
    return report


def timeline(spec: SimulationSpec, hosts: Hosts, ids: list[str]) -> Timeline:
    """`spec`'s nodes on the simulated clock: each one's step and end-of-round costs
    (testnet/simulation/clock.py) at its speed."""
    sizes = {i: size for part in hosts.call("sizes", [()] * len(hosts.blocks)) for i, size in part.items()}
    train, test = zip(*(sizes[i] for i in range(spec.nodes)), strict=True)
    backbones, factors = spec.node_backbones(), spec.speed_factors()
    rule = GatherRule(spec.quorum, spec.round_deadline_s, spec.straggler_grace_s)
    return Timeline(
        hosts,
        ids,
        step_costs(backbones, train, factors, spec.step_s),
        spec.latency_s,
        rule,
        end_costs(backbones, test, factors, spec.end_s),
    )


def _placement(where: list[tuple[str, bool]]) -> tuple[str, bool]:
    """Where the hosts' nodes train: one device, or every one of them where hosts differ."""
    devices = sorted({device for device, _ in where})
    return ", ".join(devices), all(mixed for _, mixed in where)


def run_baselines(
    spec: SimulationSpec,
    names: Sequence[str],
    progress: Callable[[str], Callable[[RoundResult], None]] | None = None,
    engine: Engine = INLINE,
) -> dict[str, dict[str, Any]]:
    """Simulate each baseline on `spec`'s nodes, each node on the backbone it had there, with those
    of `spec`'s overrides the baseline's configuration has; returns the reports by name
    (testnet/reporting/report.py:attach_baselines puts them beside `spec`'s own). The run's own algorithm
    is no baseline of itself: it is skipped."""
    reports = {}
    for name in (name for name in names if name != spec.algorithm):
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
        baseline = dataclasses.replace(
            spec,
            algorithm=name,
            backbones=tuple(spec.node_backbones()),
            overrides=applicable_overrides(name, spec.overrides),
            poisoners=(),
        )
        reports[name] = run_simulation(baseline, progress=progress(name) if progress else None, engine=engine)
    return reports


def _progress(latest: list[RoundRecord], truth: Truth, rounds: int, elapsed_s: float) -> RoundResult:
    ids = [record.node for record in latest]
    w = [[record.weights.get(peer, 0.0) for peer in ids] for record in latest]
    return RoundResult(
        round=min(record.round for record in latest) + 1,
        rounds=rounds,
        accuracy=sum(record.accuracy for record in latest) / len(latest),
        within_cluster_mass=within_cluster_mass(w, truth.clusters),
        bytes=sum(record.bytes_out for record in latest),
        elapsed_s=elapsed_s,
    )
