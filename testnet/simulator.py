"""The in-process simulator: every node of a scenario in one process, exchanging real frames.

It drives the same algorithm seam the daemon drives, with a perfect synchronous exchange: each
round every node steps, publishes, and every payload is encoded and signed exactly as the daemon
would put it on the wire, decoded once by the protocol decoder, and handed to its addressees
before anyone's graph step. So `comm.*` counts real frame bytes, and a payload an algorithm could
not send over the network fails here first.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from algorithms.datasets import load_dataset
from algorithms.graph import l1_to_truth, within_cluster_mass
from algorithms.models import CPU_BACKBONES
from algorithms.partitions import PartitionSpec, make_partition
from algorithms.registry import ALGORITHMS, apply_overrides, config_as_dict, default_config, make_algorithm
from algorithms.seam import Algorithm, Frame, PayloadRejected
from algorithms.setup import node_setup
from protocol.envelope import Decoder, Encoder
from protocol.identity import Identity

from .report import run_header

__all__ = ["SimulationSpec", "RoundResult", "run_simulation", "simulation_identity"]

NETWORK = "p2pnode-sim"
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

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; choose from {', '.join(ALGORITHMS)}")
        if self.nodes < 1 or self.rounds < 1:
            raise ValueError("nodes and rounds must be ≥ 1")

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


_MAX_ANSWER_PASSES = 4  # answers to answers to ...: a bound, so a faulty algorithm cannot loop


def simulation_identity(seed: int, node: int) -> Identity:
    secret = hashlib.sha256(f"p2pnode-sim/{seed}/{node}".encode()).digest()
    return Identity(Ed25519PrivateKey.from_private_bytes(secret))


def run_simulation(spec: SimulationSpec, progress: Callable[[RoundResult], None] | None = None) -> dict[str, Any]:
    """Run every round of `spec`; returns the report (see testnet/report.py for its schema)."""
    started = time.perf_counter()
    info = ALGORITHMS[spec.algorithm]
    config = apply_overrides(default_config(spec.algorithm), spec.overrides)
    dataset = load_dataset(spec.dataset, spec.dataset_root)
    partition = make_partition(
        dataset,
        PartitionSpec(
            scenario=spec.scenario,
            nodes=spec.nodes,
            clusters=spec.clusters,
            samples_per_class=spec.samples_per_class,
            test_per_class=spec.test_per_class,
            seed=spec.seed,
        ),
    )
    backbones = spec.node_backbones()
    identities = [simulation_identity(spec.seed, i) for i in range(spec.nodes)]
    ids = [identity.node_id for identity in identities]
    index = {node_id: i for i, node_id in enumerate(ids)}
    nodes: list[Algorithm] = []
    for i in range(spec.nodes):
        setup = node_setup(
            ids[i], dataset, partition, i, backbone=backbones[i], seed=spec.seed, pooled=info.pooled_training_data
        )
        node = make_algorithm(spec.algorithm, setup, config)
        node.set_peers(ids)
        nodes.append(node)
    encoders = [Encoder(identity, NETWORK) for identity in identities]
    decoder = Decoder(NETWORK)
    clusters = np.array([shard.cluster for shard in partition.shards])

    by_type: Counter[str] = Counter()
    bytes_by_type: Counter[str] = Counter()
    rejections: Counter[str] = Counter()
    per_round: dict[str, list[float]] = {
        k: [] for k in ("accuracy", "accuracy_own_classes", "l1_to_truth", "within_cluster_mass", "bytes", "messages")
    }
    step_seconds = 0.0
    total_bytes = total_messages = 0
    sequence = [0] * spec.nodes
    for round in range(spec.rounds):
        for node in nodes:
            t0 = time.perf_counter()
            node.local_step(round)
            step_seconds += time.perf_counter() - t0
        recipients: list[set[str]] = [set() for _ in nodes]  # whom each node sent anything this round
        outbox = [(i, out) for i, node in enumerate(nodes) for out in node.publish(round)]
        # Then answers (SCooL's scores, a model for a peer that kept this node), and answers to
        # those, until nobody owes anything; each kind of answer is owed once per round.
        for passes in range(_MAX_ANSWER_PASSES + 2):
            if not outbox:
                break
            if passes > _MAX_ANSWER_PASSES:
                raise RuntimeError(
                    f"{spec.algorithm} still answering after {_MAX_ANSWER_PASSES} passes in round {round}"
                )
            for i, out in outbox:
                sequence[i] += 1
                tag = round if out.round is None else out.round
                frame = encoders[i].encode(out.body, seq=sequence[i], timestamp_us=0, round=tag)
                envelope = decoder.decode(frame)
                nodes[i].published(tag, out, sequence[i])
                kind = out.body.TYPE.value
                by_type[kind] += len(out.to)
                bytes_by_type[kind] += len(frame) * len(out.to)
                total_messages += len(out.to)
                total_bytes += len(frame) * len(out.to)
                recipients[i].update(out.to)
                for peer in out.to:
                    try:
                        nodes[index[peer]].receive(ids[i], tag, envelope.body, Frame(envelope.seq, envelope.sender))
                    except PayloadRejected as rejected:
                        rejections[rejected.reason] += 1
            outbox = [(i, out) for i, node in enumerate(nodes) for out in node.respond()]
        for node in nodes:
            node.end_round(round)
        evaluations = [node.evaluate() for node in nodes]
        w = _weight_matrix(nodes, index)
        per_round["accuracy"].append(float(np.mean([e.accuracy for e in evaluations])))
        per_round["accuracy_own_classes"].append(float(np.mean([e.own_class_accuracy for e in evaluations])))
        per_round["l1_to_truth"].append(l1_to_truth(w, partition.w_true))
        per_round["within_cluster_mass"].append(within_cluster_mass(w, clusters))
        per_round["bytes"].append(total_bytes)
        per_round["messages"].append(total_messages)
        if progress is not None:
            progress(
                RoundResult(
                    round + 1,
                    spec.rounds,
                    per_round["accuracy"][-1],
                    per_round["within_cluster_mass"][-1],
                    total_bytes,
                    time.perf_counter() - started,
                )
            )

    accuracies = np.array([e.accuracy for e in evaluations])
    own_class = np.array([e.own_class_accuracy for e in evaluations])
    return {
        **run_header("simulation", spec, partition, ids, backbones, config_as_dict(config)),
        "accuracy": {
            "mean": float(accuracies.mean()),
            "std": float(accuracies.std()),
            "per_node": accuracies.tolist(),
            "per_round": per_round["accuracy"],
        },
        "accuracy_own_classes": {
            "mean": float(own_class.mean()),
            "std": float(own_class.std()),
            "per_node": own_class.tolist(),
            "per_round": per_round["accuracy_own_classes"],
        },
        "graph": {
            "W": w.tolist(),
            "W_true": partition.w_true.tolist(),
            "clusters": clusters.tolist(),
            "l1_to_truth": per_round["l1_to_truth"][-1],
            "within_cluster_mass": per_round["within_cluster_mass"][-1],
            "l1_to_truth_per_round": per_round["l1_to_truth"],
            "within_cluster_mass_per_round": per_round["within_cluster_mass"],
        },
        "comm": {
            "messages": total_messages,
            "bytes": total_bytes,
            "by_type": {kind: {"messages": by_type[kind], "bytes": bytes_by_type[kind]} for kind in sorted(by_type)},
            "messages_cumulative_per_round": per_round["messages"],
            "bytes_cumulative_per_round": per_round["bytes"],
            "recipients_last_round": [len(peers) for peers in recipients],
        },
        "rejections": dict(rejections),
        "missing_payloads": int(sum(sum(node.missing.values()) for node in nodes)),
        "wall_s": time.perf_counter() - started,
        "local_step_s_per_node_round": step_seconds / (spec.nodes * spec.rounds),
    }


def _weight_matrix(nodes: list[Algorithm], index: Mapping[str, int]) -> np.ndarray:
    w = np.zeros((len(nodes), len(nodes)))
    for i, node in enumerate(nodes):
        for peer, weight in node.weights().items():
            w[i, index[peer]] = weight
    return w
