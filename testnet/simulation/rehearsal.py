"""`simulate --fleet DIR` and `testnet --fleet DIR`: rehearse the fleet that `p2pnode init` wrote,
from its configs alone, so what is rehearsed is what is deployed.

Each `DIR/*/node.toml` is loaded as `p2pnode start` loads it (a config the daemon would refuse is
refused here with the daemon's message), and the run is put together from what they say: the
algorithm, its rounds and settings, each node's backbone (a user backbone's code and weights too),
data (its own folder or `.npz`, or its shard of a benchmark), seed and device, and the gather rule.
Node i of the rehearsal is the config whose `[data].node_index` is i, which is what seeds its
model on the device too, so simulated node i and daemon i start from the same weights and data;
it signs with daemon i's key, so it has its id too, and sums its neighbours' payloads in the
daemon's order (algorithms/interface.py `NeighbourView`): the two agree to the bit. A
setting that must be the same on every node for one run to describe them (the algorithm, its
settings, the seed, the classes) and is not, is
an error naming the two configs that differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from algorithms.catalog import DATASET_FROM_PATH
from algorithms.data.setup import ScenarioSpec
from p2pnode.config import Config, ConfigError, load_config
from p2pnode.fleet import fleet_configs
from p2pnode.learning.algorithm import backbone_files
from p2pnode.learning.rounds import Schedule

from .spec import SimulationSpec

__all__ = ["FleetRehearsalError", "Rehearsal", "read_fleet"]


class FleetRehearsalError(ValueError):
    """The fleet's configs cannot be rehearsed as one run; the message says which and why."""


@dataclass(frozen=True)
class Rehearsal:
    spec: SimulationSpec
    local_baseline: bool  # some node trains `[algorithm].local_baseline`: the rehearsal runs Local beside it
    configs: tuple[Path, ...]  # in node order


# What every node of one run shares, with how the error names it.
SHARED: dict[str, Callable[[Config], Any]] = {
    "[algorithm].name": lambda c: c.algorithm.name,
    "[algorithm].rounds": lambda c: c.algorithm.rounds,
    "[algorithm].settings": lambda c: dict(c.algorithm.settings),
    "[algorithm] schedule": lambda c: Schedule.of(c.algorithm),
    "[algorithm] gather (quorum, round_deadline_s, straggler_grace_s)": lambda c: (
        c.algorithm.quorum,
        c.algorithm.round_deadline_s,
        c.algorithm.straggler_grace_s,
    ),
    "[data].seed": lambda c: c.data.seed,
    "[data].class_names": lambda c: c.data.class_names,
    "[data] source (dataset, path or not)": lambda c: (c.data.dataset, c.data.path is None),
    "[data] partition (scenario, nodes, clusters, samples_per_class, test_per_class, root)": lambda c: (
        None
        if c.data.path is not None and c.data.dataset != DATASET_FROM_PATH
        else (
            c.data.scenario,
            c.data.nodes,
            c.data.clusters,
            c.data.samples_per_class,
            c.data.test_per_class,
            c.data.root,
        )
    ),
    "[model].code": lambda c: c.model.code,
    "[model].weights": lambda c: c.model.weights,
    "[model].device": lambda c: c.model.device,
    "[model].mixed_precision": lambda c: c.model.mixed_precision,
}


def read_fleet(directory: Path) -> Rehearsal:
    """The run that rehearses the fleet in `directory`; raises FleetRehearsalError."""
    paths = fleet_configs(directory)
    if not paths:
        raise FleetRehearsalError(f"{directory}: no */node.toml there (p2pnode init writes DIR/node<i>/node.toml)")
    configs = [_load(path) for path in paths]
    order = _node_order(configs, paths)
    configs, paths = [configs[i] for i in order], [paths[i] for i in order]
    _same_everywhere(configs, paths)
    first = configs[0]
    if first.algorithm.name == "none":
        raise FleetRehearsalError(f"{paths[0]}: [algorithm].name is none: the fleet learns nothing to rehearse")
    try:
        spec = SimulationSpec(
            algorithm=first.algorithm.name,
            data=_scenario(configs),
            rounds=first.algorithm.rounds,
            backbones=tuple(config.model.backbone for config in configs),
            backbone_files=backbone_files(first),
            overrides=dict(first.algorithm.settings),
            device=first.model.device,
            mixed_precision=first.model.mixed_precision,
            quorum=first.algorithm.quorum,
            round_deadline_s=first.algorithm.round_deadline_s,
            straggler_grace_s=first.algorithm.straggler_grace_s,
            schedule=Schedule.of(first.algorithm),
            key_files=tuple(config.node.key for config in configs),
        )
        spec.node_backbones()  # one backbone for an algorithm that averages whole models
    except ValueError as exc:
        raise FleetRehearsalError(f"--fleet {directory}: {exc}") from None
    return Rehearsal(spec, any(config.algorithm.local_baseline for config in configs), tuple(paths))


def _load(path: Path) -> Config:
    try:
        return load_config(path)
    except ConfigError as exc:
        raise FleetRehearsalError(str(exc)) from None


def _node_order(configs: list[Config], paths: list[Path]) -> list[int]:
    """Positions of the configs in node order: by `[data].node_index`, which must number them
    0 to N-1 (init writes it); with none set, the directories' order."""
    indices = [config.data.node_index for config in configs]
    if all(index is None for index in indices):
        return list(range(len(configs)))
    if sorted(i for i in indices if i is not None) != list(range(len(configs))):
        listed = ", ".join(f"{path.parent.name}: {index}" for path, index in zip(paths, indices, strict=True))
        raise FleetRehearsalError(
            f"the configs' [data].node_index ({listed}) must number the {len(configs)} nodes 0 to {len(configs) - 1}, "
            "each once"
        )
    return sorted(range(len(configs)), key=lambda i: indices[i])


def _same_everywhere(configs: list[Config], paths: list[Path]) -> None:
    for what, value in SHARED.items():
        first = value(configs[0])
        for config, path in zip(configs[1:], paths[1:], strict=True):
            if value(config) != first:
                raise FleetRehearsalError(
                    f"{what} differs between {paths[0]} and {path}: one run rehearses a fleet whose nodes agree on it"
                )


def _scenario(configs: list[Config]) -> ScenarioSpec:
    """The run's data as the configs give it: the daemons' own reading of their `[data]`
    (`DataSettings.scenario_spec`), or each node's own data in node order."""
    data = configs[0].data
    shared = data.scenario_spec()
    if shared is None:
        # As `simulate --data-per-node` makes them: the node's number is its place in the run.
        per_node = tuple(dataclasses.replace(c.data.own_data(), node=None) for c in configs)
        return ScenarioSpec(nodes=len(configs), seed=data.seed, per_node=per_node)
    if data.nodes != len(configs):
        raise FleetRehearsalError(
            f"[data].nodes is {data.nodes}, but the fleet has {len(configs)} configs: the partition is cut for "
            f"{data.nodes} nodes"
        )
    return shared
