"""What a simulation runs: its data (algorithms/data/setup.py `ScenarioSpec`, the object a testnet
daemon's `[data]` is written from), the algorithm and its settings, the poisoners, the device, and
the pace of its simulated clock (testnet/simulation/clock.py: the latency, each node's step cost,
which nodes are slow, the gather rule). Every host of a run builds its nodes from this alone
(testnet/simulation/host.py), so nothing big travels to a worker."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from algorithms.catalog import DEVICE_FORMS, DEVICE_PATTERN, FLOAT32_ONLY_DEVICES
from algorithms.data.setup import ScenarioSpec
from algorithms.methods.poison import ATTACKS, Attack
from algorithms.models.personal import CPU_BACKBONES
from algorithms.models.user_backbone import NO_FILES, BackboneFiles
from algorithms.registry import ALGORITHMS, config_as_dict, run_config
from p2pnode.learning.rounds import Schedule
from p2pnode.learning.settings import AlgorithmSettings
from p2pnode.wire.keystore import load_key
from protocol import Identity

from .shard import simulation_identity

__all__ = ["SimulationSpec", "HOMOGENEOUS_DEFAULT", "Slow", "parse_slow"]

HOMOGENEOUS_DEFAULT = ("convnet",)
_GATHER = AlgorithmSettings()  # the daemon's defaults: the simulator's gather ends by its rule


@dataclass(frozen=True)
class Slow:
    """`--slow FRACTION:FACTOR`: round(fraction × nodes) nodes, drawn by the seed, take `factor`
    times as long per local step and end of round (emulated: testnet/simulation/clock.py in the simulator,
    the daemon's `[node].slowdown` in the testnet)."""

    fraction: float
    factor: float

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise ValueError(f"--slow: the fraction of slow nodes must be in [0, 1], got {self.fraction}")
        if not self.factor >= 1:
            raise ValueError(f"--slow: a slow node's factor must be ≥ 1, got {self.factor}")

    def nodes(self, nodes: int, seed: int) -> tuple[int, ...]:
        """The slow nodes' indices, drawn by `seed` (the same in the simulator and the testnet)."""
        count = round(self.fraction * nodes)
        return tuple(sorted(random.Random(f"slow:{seed}").sample(range(nodes), count)))


def parse_slow(text: str) -> Slow:
    """`FRACTION:FACTOR`, e.g. `0.3:5`; raises ValueError naming what is wrong."""
    fraction, sep, factor = text.partition(":")
    try:
        numbers = float(fraction), float(factor)
    except ValueError:
        sep = ""
    if not sep:
        raise ValueError(f"--slow wants FRACTION:FACTOR (e.g. 0.3:5), got {text!r}")
    return Slow(*numbers)


@dataclass(frozen=True)
class SimulationSpec:
    algorithm: str
    # The run's data, as every node builds its share of it, and as each testnet daemon's `[data]` says it
    data: ScenarioSpec = field(default_factory=ScenarioSpec)
    rounds: int = 60
    backbones: tuple[str, ...] | None = None  # node i runs backbones[i % len]; None: the CPU family
    backbone_files: BackboneFiles = NO_FILES  # a user backbone's code folder; weights every node starts from
    overrides: Mapping[str, str] = field(default_factory=dict)
    poisoners: tuple[int, ...] = ()  # indices of the nodes that poison what they send
    attack: str = "sign-flip"  # algorithms/methods/poison.py: scale, sign-flip, random, none (the control)
    attack_factor: float = 10.0  # the factor of `scale` and `rescale`
    device: str = "auto"  # where every node trains (algorithms/models/device.py resolves it)
    mixed_precision: bool = False  # CUDA only
    # The simulated clock (testnet/simulation/clock.py); the testnet's daemons keep real time.
    slow: Slow | None = None  # `--slow`: which nodes step slower, and how much
    latency_s: float = 0.005  # each frame's way from its sender to its addressees
    step_s: float | None = None  # every node's local step at speed 1; None: clock.STEP_S_PER_SAMPLE
    end_s: float | None = None  # every node's end of round at speed 1; None: clock.END_S_PER_TEST_SAMPLE
    # Testnet only: every daemon emulates a device `pace` × slower than one core (`[node].slowdown`,
    # × the factor on --slow's nodes), so daemons that share cores keep their emulated speeds; the
    # simulator's clock has no shared cores to undo, and ignores it.
    pace: float = 1.0
    quorum: float = _GATHER.quorum  # `[algorithm].quorum`, `round_deadline_s`, `straggler_grace_s`
    round_deadline_s: float = _GATHER.round_deadline_s
    straggler_grace_s: float = _GATHER.straggler_grace_s
    # `[algorithm].schedule` and what goes with it (p2pnode/learning/rounds.py): sync or async, the deadline
    schedule: Schedule = field(default_factory=Schedule)
    # `--fleet`: each node's `[node].key`, so the rehearsal's nodes are the daemons' (their ids, and
    # so the order each sums its neighbours' payloads in); empty: keys derived from the seed
    key_files: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(DEVICE_PATTERN, self.device):
            raise ValueError(f"device {self.device!r} is not {DEVICE_FORMS}")
        if self.mixed_precision and self.device in FLOAT32_ONLY_DEVICES:
            raise ValueError(f"mixed precision needs a CUDA device, not {self.device!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose from {', '.join(ALGORITHMS)}")
        if self.rounds < 1:
            raise ValueError("rounds must be ≥ 1")
        if any(not 0 <= i < self.nodes for i in self.poisoners) or len(set(self.poisoners)) != len(self.poisoners):
            raise ValueError(f"poisoners must be distinct node indices below {self.nodes}, got {self.poisoners}")
        if len(self.poisoners) >= self.nodes:
            raise ValueError("at least one node must be honest")
        if self.attack not in ATTACKS:
            raise ValueError(f"unknown attack {self.attack!r}; choose from {', '.join(ATTACKS)}")
        Attack(self.attack, self.attack_factor)
        if not self.latency_s >= 0 or (self.step_s is not None and not self.step_s > 0):
            raise ValueError(f"latency_s must be ≥ 0 and step_s > 0, got {self.latency_s} and {self.step_s}")
        if self.end_s is not None and not self.end_s >= 0:
            raise ValueError(f"end_s must be ≥ 0, got {self.end_s}")
        if not 1 <= self.pace <= 1000:
            raise ValueError(f"--pace must be in [1, 1000], got {self.pace}")
        if self.key_files and len(self.key_files) != self.nodes:
            raise ValueError(f"{len(self.key_files)} key files for {self.nodes} nodes")

    def identity(self, node: int) -> Identity:
        """Node `node`'s key: its daemon's (`key_files`), or one derived from the seed."""
        return load_key(self.key_files[node]) if self.key_files else simulation_identity(self.seed, node)

    def node_ids(self) -> list[str]:
        return [self.identity(i).node_id for i in range(self.nodes)]

    def speed_factors(self) -> list[float]:
        """Each node's compute (local step, end of round) as a multiple of its backbone's (1: full speed)."""
        slow = set(self.slow.nodes(self.nodes, self.seed)) if self.slow else set()
        return [self.slow.factor if i in slow else 1.0 for i in range(self.nodes)]

    def slow_nodes(self) -> tuple[int, ...]:
        return self.slow.nodes(self.nodes, self.seed) if self.slow else ()

    def slowdowns(self) -> list[float]:
        """Each testnet daemon's `[node].slowdown`: `pace` × its speed factor."""
        return [self.pace * factor for factor in self.speed_factors()]

    @property
    def nodes(self) -> int:
        return self.data.nodes

    @property
    def seed(self) -> int:
        """The run's seed: the partition's, and every node's model's (`data` holds it, as `[data].seed` does)."""
        return self.data.seed

    @property
    def dataset_label(self) -> str:
        """What the report names as the run's data: a benchmark's name, or where the own data is."""
        if self.data.per_node:
            return str(self.data.per_node[0].path.parent)
        return self.data.dataset if self.data.own is None else str(self.data.own.path)

    @property
    def class_names(self) -> list[str] | None:
        """The network's class names where the data is the user's own (None: a benchmark's ids)."""
        own = self.data.per_node[0] if self.data.per_node else self.data.own
        return None if own is None or not own.class_names else list(own.class_names)

    @property
    def weights_label(self) -> str | None:
        """The report's `weights`: the state dict every backbone started from (None: none)."""
        weights = self.backbone_files.weights
        return None if weights is None else str(weights)

    @property
    def scenario_label(self) -> str:
        """The report's scenario: the partition's, or "per-node" where each node brings its own data."""
        return "per-node" if self.data.per_node else self.data.scenario

    def algorithm_config(self) -> Any:
        """The algorithm's configuration for the run: its defaults with the run's overrides,
        its schedule fitted to the run's rounds (algorithms/registry.py `run_config`)."""
        return run_config(self.algorithm, self.overrides, self.rounds)

    def config_dict(self) -> dict[str, Any]:
        return config_as_dict(self.algorithm_config())

    def node_backbones(self) -> list[str]:
        info = ALGORITHMS[self.algorithm]
        chosen = self.backbones or (HOMOGENEOUS_DEFAULT if info.homogeneous else CPU_BACKBONES)
        if info.homogeneous and len(set(chosen)) > 1:
            raise ValueError(f"{self.algorithm} averages whole models: give it one backbone, not {chosen}")
        return [chosen[i % len(chosen)] for i in range(self.nodes)]
