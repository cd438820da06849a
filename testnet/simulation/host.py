"""A host: the shard of a simulation's nodes one process owns, built from the run's spec alone.

Every engine (testnet/simulation/hosting.py) runs the same hosts: one in the simulator's own process, one
per worker process, one per Ray actor. A host builds its nodes itself (the dataset is loaded
once per process and each node cuts its shard from it), so only the spec and the node indices
travel to it, and only signed frames and records come back.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from algorithms.data.setup import build_setup, forget_scenarios
from algorithms.methods.poison import Attack, PoisoningNode
from algorithms.models.device import placement, set_cpu_threads
from algorithms.registry import ALGORITHMS, make_algorithm
from p2pnode.memory import process_memory, trim_now
from protocol import Limits

from .shard import Shard
from .spec import SimulationSpec

__all__ = ["Host", "blocks"]


class Host(Shard):
    def __init__(
        self, spec: SimulationSpec, block: Sequence[int], threads: int | None = None, *, worker: bool = False
    ) -> None:
        """Nodes `block` of `spec`; `threads`: torch's and BLAS's CPU threads in this process (None: as
        they are); `worker`: this process is the host's alone, so the dataset the shards were
        cut from is dropped once they are (as a daemon does: p2pnode/memory.py)."""
        self._cpu_started = time.process_time()
        if threads is not None:
            set_cpu_threads(threads)
        self.device, self.mixed_precision = placement(spec.device, spec.mixed_precision)
        info = ALGORITHMS[spec.algorithm]
        config = spec.algorithm_config()
        backbones = spec.node_backbones()
        identities = {i: spec.identity(i) for i in range(spec.nodes)}
        ids = [identities[i].node_id for i in range(spec.nodes)]
        attack = Attack(spec.attack, spec.attack_factor)
        nodes = {}
        for i in block:
            setup = build_setup(
                spec.data,
                i,
                ids[i],
                backbone=backbones[i],
                pooled=info.pooled_training_data,
                device=self.device,
                mixed_precision=self.mixed_precision,
            )
            setup = dataclasses.replace(setup, backbone_files=spec.backbone_files)
            node = make_algorithm(spec.algorithm, setup, config)
            nodes[i] = PoisoningNode(node, attack, seed=spec.seed * 1000 + i) if i in spec.poisoners else node
        # An attacker signs whatever it likes; the honest decoders keep the real norm bound.
        loose = {i: Limits(max_tensor_norm=math.inf) for i in spec.poisoners if i in nodes}
        super().__init__(nodes, {i: identities[i] for i in nodes}, ids, loose, spec.schedule, spec.rounds)
        if worker:
            forget_scenarios()
            trim_now()

    def where(self) -> tuple[str, bool]:
        """The device this host's nodes train on, and whether under mixed precision."""
        return str(self.device), self.mixed_precision

    def usage(self) -> dict[str, float | None]:
        """Its nodes; its process's resident memory now and at its peak, MiB (inline: the
        simulator's own process, dataset and all), and the CPU seconds it used since it began to
        build its nodes."""
        cpu_s = time.process_time() - self._cpu_started
        return {"nodes": len(self.nodes), **process_memory(), "cpu_s": round(cpu_s, 2)}


def blocks(nodes: int, workers: int) -> list[tuple[int, ...]]:
    """Nodes 0..nodes-1 dealt to `workers` hosts (fewer if there are fewer nodes): contiguous
    blocks whose sizes differ by one at most, so the cycling backbones spread evenly."""
    count = max(1, min(workers, nodes))
    size, extra = divmod(nodes, count)
    starts = [h * size + min(h, extra) for h in range(count + 1)]
    return [tuple(range(starts[h], starts[h + 1])) for h in range(count)]
