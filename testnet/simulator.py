"""The in-process simulator: every node of a scenario in one process, exchanging real frames.

It drives the same algorithm seam the daemon drives, through the perfect synchronous network
of testnet/exchange.py, and builds its report from the same per-node-round records as the
learning testnet (testnet/report.py). `p2pnode simulate` is its command line.

`poisoners` turns some nodes Byzantine (algorithms/poison.py): they learn as the others do but
poison every learning payload they send, and the report measures their weight in the honest
rows of W and the honest nodes' accuracy.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from algorithms.catalog import BASELINES, DEVICE_FORMS, DEVICE_PATTERN, FLOAT32_ONLY_DEVICES
from algorithms.device import placement
from algorithms.graph import within_cluster_mass
from algorithms.models import CPU_BACKBONES
from algorithms.partitions import PartitionSpec
from algorithms.poison import ATTACKS, Attack, PoisoningNode
from algorithms.registry import ALGORITHMS, apply_overrides, config_as_dict, default_config, make_algorithm
from algorithms.setup import ScenarioSpec, build_setup, load_scenario
from p2pnode.rounds import RoundRecord
from protocol import Limits

from .exchange import Exchange, simulation_identity
from .provenance import provenance
from .report import CheckThresholds, Truth, assemble, check, run_header

__all__ = ["SimulationSpec", "RoundResult", "run_simulation", "run_baselines", "simulation_identity"]

HOMOGENEOUS_DEFAULT = ("convnet",)


@dataclass(frozen=True)
class SimulationSpec:
    algorithm: str
    dataset: str = "mnist5k"
    scenario: str = "1"
    nodes: int = 10
    rounds: int = 60
    seed: int = 0
    clusters: int | None = None
    samples_per_class: int = 25
    test_per_class: int = 15
    backbones: tuple[str, ...] | None = None  # node i runs backbones[i % len]; None: the CPU family
    dataset_root: str | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)
    poisoners: tuple[int, ...] = ()  # indices of the nodes that poison what they send
    attack: str = "sign-flip"  # algorithms/poison.py: scale, sign-flip, random, none (the control)
    attack_factor: float = 10.0  # the factor of `scale`
    device: str = "auto"  # where every node trains (algorithms/device.py resolves it)
    mixed_precision: bool = False  # CUDA only

    def __post_init__(self) -> None:
        if not re.fullmatch(DEVICE_PATTERN, self.device):
            raise ValueError(f"device {self.device!r} is not {DEVICE_FORMS}")
        if self.mixed_precision and self.device in FLOAT32_ONLY_DEVICES:
            raise ValueError(f"mixed precision needs a CUDA device, not {self.device!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose from {', '.join(ALGORITHMS)}")
        if self.nodes < 1 or self.rounds < 1:
            raise ValueError("nodes and rounds must be ≥ 1")
        if any(not 0 <= i < self.nodes for i in self.poisoners) or len(set(self.poisoners)) != len(self.poisoners):
            raise ValueError(f"poisoners must be distinct node indices below {self.nodes}, got {self.poisoners}")
        if len(self.poisoners) >= self.nodes:
            raise ValueError("at least one node must be honest")
        if self.attack not in ATTACKS:
            raise ValueError(f"unknown attack {self.attack!r}; choose from {', '.join(ATTACKS)}")
        Attack(self.attack, self.attack_factor)

    @property
    def scenario_spec(self) -> ScenarioSpec:
        """The data of the run, as every node builds its share of it (algorithms/setup.py)."""
        partition = PartitionSpec(
            scenario=self.scenario,
            nodes=self.nodes,
            clusters=self.clusters,
            samples_per_class=self.samples_per_class,
            test_per_class=self.test_per_class,
            seed=self.seed,
        )
        return ScenarioSpec(self.dataset, partition, self.dataset_root)

    def algorithm_config(self) -> Any:
        """The algorithm's configuration: its defaults with the run's overrides."""
        return apply_overrides(default_config(self.algorithm), self.overrides)

    def config_dict(self) -> dict[str, Any]:
        return config_as_dict(self.algorithm_config())

    def node_backbones(self) -> list[str]:
        info = ALGORITHMS[self.algorithm]
        chosen = self.backbones or (HOMOGENEOUS_DEFAULT if info.homogeneous else CPU_BACKBONES)
        if info.homogeneous and len(set(chosen)) > 1:
            raise ValueError(f"{self.algorithm} averages whole models: give it one backbone, not {chosen}")
        return [chosen[i % len(chosen)] for i in range(self.nodes)]


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
) -> dict[str, Any]:
    """Run every round of `spec`; returns the report (testnet/report.py), judged against
    `thresholds` if given."""
    started = time.perf_counter()
    device, mixed_precision = placement(spec.device, spec.mixed_precision)
    made = provenance(spec.seed, str(device))
    info = ALGORITHMS[spec.algorithm]
    config = spec.algorithm_config()
    _, partition = load_scenario(spec.scenario_spec)
    backbones = spec.node_backbones()
    identities = [simulation_identity(spec.seed, i) for i in range(spec.nodes)]
    ids = [identity.node_id for identity in identities]
    nodes = [
        make_algorithm(
            spec.algorithm,
            build_setup(
                spec.scenario_spec,
                i,
                ids[i],
                backbone=backbones[i],
                pooled=info.pooled_training_data,
                device=device,
                mixed_precision=mixed_precision,
            ),
            config,
        )
        for i in range(spec.nodes)
    ]
    attack = Attack(spec.attack, spec.attack_factor)
    for i in spec.poisoners:
        nodes[i] = PoisoningNode(nodes[i], attack, seed=spec.seed * 1000 + i)
    # An attacker signs whatever it likes; the honest decoders keep the real norm bound.
    exchange = Exchange(nodes, identities, dict.fromkeys(spec.poisoners, Limits(max_tensor_norm=math.inf)))
    truth = Truth.of(partition)
    records: list[RoundRecord] = []
    for round in range(spec.rounds):
        latest = exchange.run_round(round)
        records.extend(latest)
        if progress is not None:
            progress(_progress(latest, truth, spec.rounds, time.perf_counter() - started))
    header = run_header(
        "simulation", spec, partition, ids, backbones, spec.config_dict(), (device, mixed_precision), made
    )
    report = assemble(header, records, truth, rejections=exchange.rejections, wall_s=time.perf_counter() - started)
    report["check"] = check(report, thresholds or CheckThresholds(accuracy=0.0, within_cluster_mass=0.0))
    return report


def run_baselines(
    spec: SimulationSpec, names: Sequence[str], progress: Callable[[str], Callable[[RoundResult], None]] | None = None
) -> dict[str, dict[str, Any]]:
    """Simulate each baseline on `spec`'s nodes, each node on the backbone it had there, with those
    of `spec`'s overrides the baseline's configuration has; returns the reports by name
    (testnet/report.py:attach_baselines puts them beside `spec`'s own). The run's own algorithm
    is no baseline of itself: it is skipped."""
    reports = {}
    for name in (name for name in names if name != spec.algorithm):
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
        baseline = dataclasses.replace(
            spec,
            algorithm=name,
            backbones=tuple(spec.node_backbones()),
            overrides=_applicable(name, spec.overrides),
            poisoners=(),
        )
        reports[name] = run_simulation(baseline, progress=progress(name) if progress else None)
    return reports


def _applicable(algorithm: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """The overrides `algorithm`'s configuration has (MAPL's `training.*` for Local, not SCooL's)."""
    kept = {}
    for key, value in overrides.items():
        try:
            apply_overrides(default_config(algorithm), {key: value})
        except ValueError:
            continue
        kept[key] = value
    return kept


def _progress(latest: list[RoundRecord], truth: Truth, rounds: int, elapsed_s: float) -> RoundResult:
    ids = [record.node for record in latest]
    w = [[record.weights.get(peer, 0.0) for peer in ids] for record in latest]
    return RoundResult(
        round=latest[0].round + 1,
        rounds=rounds,
        accuracy=sum(record.accuracy for record in latest) / len(latest),
        within_cluster_mass=within_cluster_mass(w, truth.clusters),
        bytes=sum(record.bytes_out for record in latest),
        elapsed_s=elapsed_s,
    )
