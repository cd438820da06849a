"""`p2pnode testnet --algorithm A`: N real daemons learn over TCP; the report has the schema of
`p2pnode simulate` (testnet/simulator.py), built from what the daemons say in `status`.

Each daemon gets node index i of the same partition and seed as the simulator's node i, so the
two can be compared run for run. `comm.*` counts learning frames as the daemons' transports
sent them (discovery and keep-alives are reported apart, under `comm.discovery`).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from p2pnode.metrics import LEARNING_TYPES

from .cluster import Cluster
from .report import run_header
from .simulator import SimulationSpec

__all__ = ["CheckThresholds", "run_learning_testnet", "build_report", "check_report"]

# Daemons of one machine: quick failure detection, so a killed node stops being waited for.
DISCOVERY = {"ping_interval_s": 0.5, "peer_timeout_s": 3.0, "exchange_interval_s": 0.5, "dial_retry_max_s": 1.0}


@dataclass(frozen=True)
class CheckThresholds:
    """What `--check` asserts, each overridable on the command line."""

    accuracy: float = 0.6  # mean final accuracy on the nodes' own test splits
    within_cluster_mass: float = 0.9  # for algorithms that learn a graph
    rounds_completed: bool = True  # every node finished every round


def node_settings(spec: SimulationSpec, index: int, backbone: str, round_deadline_s: float) -> dict[str, Any]:
    data = {
        "dataset": spec.dataset,
        "scenario": spec.scenario,
        "nodes": spec.nodes,
        "node_index": index,
        "clusters": spec.clusters or 0,
        "samples_per_class": spec.samples_per_class,
        "test_per_class": spec.test_per_class,
        "seed": spec.seed,
    }
    if spec.dataset_root:
        data["root"] = str(Path(spec.dataset_root).resolve())
    return {
        "data": data,
        "model": {"backbone": backbone, "threads": 1},
        "algorithm": {
            "name": spec.algorithm,
            "rounds": spec.rounds,
            "start_peers": spec.nodes - 1,
            "start_timeout_s": 120.0,
            "round_deadline_s": round_deadline_s,
            "settings": dict(spec.overrides),
        },
        "log": {"format": "json"},
    }


def run_learning_testnet(
    spec: SimulationSpec,
    out: Path,
    *,
    round_deadline_s: float = 5.0,
    timeout_s: float | None = None,
    check: CheckThresholds | None = None,
    poll_s: float = 0.5,
    progress=sys.stderr,
) -> tuple[int, dict[str, Any]]:
    """Returns (exit code, report): 0 if every node finished (and `check` passed, if given),
    1 if not, 130 if interrupted."""
    from algorithms.datasets import load_dataset
    from algorithms.partitions import PartitionSpec, make_partition

    out.mkdir(parents=True, exist_ok=True)
    backbones = spec.node_backbones()
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
    cluster = Cluster.prepare(
        out, spec.nodes, discovery=DISCOVERY, extra=lambda i: node_settings(spec, i, backbones[i], round_deadline_s)
    )
    timeout_s = timeout_s if timeout_s is not None else 180 + spec.rounds * (round_deadline_s + 5)
    started = time.monotonic()
    interrupted = False
    finals: list[dict | None] = [None] * spec.nodes
    with cluster:
        cluster.start_all()
        try:
            last_line, last_print = "", 0.0
            while time.monotonic() - started < timeout_s:
                statuses = cluster.statuses()
                finals = [s if s is not None else f for s, f in zip(statuses, finals)]
                elapsed = time.monotonic() - started
                line = _progress_line(statuses, spec.rounds)
                if line != last_line or elapsed - last_print >= 10:
                    print(f"[{elapsed:6.1f} s] {line}", file=progress, flush=True)
                    last_line, last_print = line, elapsed
                if all(_done(s, spec.rounds) for s in statuses):
                    break
                if [spec_.index for spec_ in cluster.specs if not cluster.alive(spec_)]:
                    print("a daemon exited early; see its node.log", file=progress)
                    break
                time.sleep(poll_s)
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: stopping every node", file=progress)
        exit_codes = cluster.stop()
    report = build_report(spec, partition, backbones, cluster, finals, time.monotonic() - started)
    report["node_exit_codes"] = [exit_codes.get(s.index) for s in cluster.specs]
    code = 130 if interrupted else 0
    if not interrupted:
        failures = check_report(
            report, check or CheckThresholds(rounds_completed=True, accuracy=0.0, within_cluster_mass=0.0)
        )
        report["check"] = {
            "passed": not failures,
            "failures": failures,
            "thresholds": None if check is None else vars(check),
        }
        code = 1 if failures else 0
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return code, report


def _done(status: dict | None, rounds: int) -> bool:
    learning = status and status.get("learning")
    return bool(learning) and learning["completed"] >= rounds - 1


def _progress_line(statuses: list[dict | None], rounds: int) -> str:
    learning = [s["learning"] for s in statuses if s and s.get("learning") and s["learning"]["algorithm"]]
    if len(learning) < len(statuses):
        return f"{len(learning)}/{len(statuses)} daemons ready to learn (loading data and models)"
    completed = [entry["completed"] + 1 for entry in learning]
    accuracies = [entry["accuracy"] for entry in learning if entry["accuracy"] is not None]
    accuracy = f"mean accuracy {100 * np.mean(accuracies):5.1f} %" if len(accuracies) == len(learning) else ""
    return f"rounds done: min {min(completed)}/{rounds}, max {max(completed)}  {accuracy}"


def build_report(
    spec: SimulationSpec, partition, backbones: list[str], cluster: Cluster, statuses: list[dict | None], wall_s: float
) -> dict[str, Any]:
    from algorithms.graph import l1_to_truth, within_cluster_mass
    from algorithms.registry import apply_overrides, config_as_dict, default_config

    ids = [s.node_id for s in cluster.specs]
    index = {node_id: i for i, node_id in enumerate(ids)}
    n = spec.nodes
    histories = [((s or {}).get("learning") or {}).get("history", []) for s in statuses]
    clusters = np.array([shard.cluster for shard in partition.shards])

    def matrix(rows: list[dict[str, float] | None]) -> np.ndarray:
        w = np.zeros((n, n))
        for i, row in enumerate(rows):
            for peer, weight in (row or {ids[i]: 1.0}).items():  # no record yet: talks to no one
                if peer in index:
                    w[i, index[peer]] = weight
        return w

    by_round: list[dict[int, dict]] = [{entry["round"]: entry for entry in history} for history in histories]
    per_round: dict[str, list] = {
        k: [] for k in ("accuracy", "accuracy_own_classes", "l1_to_truth", "within_cluster_mass", "messages", "bytes")
    }
    latest: list[dict | None] = [None] * n
    for r in range(spec.rounds):
        for i in range(n):
            latest[i] = by_round[i].get(r, latest[i])  # a node that skipped a round keeps its last record
        present = [entry for entry in latest if entry is not None]
        if not present:
            continue
        per_round["accuracy"].append(float(np.mean([e["accuracy"] for e in present])))
        per_round["accuracy_own_classes"].append(float(np.mean([e["own_class_accuracy"] for e in present])))
        w = matrix([None if e is None else e["weights"] for e in latest])
        per_round["l1_to_truth"].append(l1_to_truth(w, partition.w_true))
        per_round["within_cluster_mass"].append(within_cluster_mass(w, clusters))
        per_round["messages"].append(int(sum(e["messages_out"] for e in present)))
        per_round["bytes"].append(int(sum(e["bytes_out"] for e in present)))

    finals = [history[-1] if history else None for history in histories]
    accuracies = np.array([np.nan if f is None else f["accuracy"] for f in finals])
    own_class = np.array([np.nan if f is None else f["own_class_accuracy"] for f in finals])
    w = matrix([None if f is None else f["weights"] for f in finals])
    by_type: dict[str, dict[str, int]] = {}
    discovery = {"messages": 0, "bytes": 0}
    rejections: Counter[str] = Counter()
    payload_bytes = 0
    for status in statuses:
        if status is None:
            continue
        rejections.update(status["traffic"]["rejections"])
        for kind, row in status["traffic"]["by_type"].items():
            if kind in LEARNING_TYPES:
                entry = by_type.setdefault(kind, {"messages": 0, "bytes": 0})
                entry["messages"] += row["messages_out"]
                entry["bytes"] += row["bytes_out"]
                payload_bytes += row.get("payload_bytes_out", 0)
            else:
                discovery["messages"] += row["messages_out"]
                discovery["bytes"] += row["bytes_out"]
    messages = sum(e["messages"] for e in by_type.values())
    byte_count = sum(e["bytes"] for e in by_type.values())
    rounds_run = [len(h) for h in histories]

    def mean_of(key: str) -> float | None:
        values = [e[key] for h in histories for e in h if key in e]
        return float(np.mean(values)) if values else None

    return {
        **run_header(
            "testnet",
            spec,
            partition,
            ids,
            backbones,
            config_as_dict(apply_overrides(default_config(spec.algorithm), spec.overrides)),
        ),
        "accuracy": {
            "mean": _nanmean(accuracies),
            "std": _nanstd(accuracies),
            "per_node": _listed(accuracies),
            "per_round": per_round["accuracy"],
        },
        "accuracy_own_classes": {
            "mean": _nanmean(own_class),
            "std": _nanstd(own_class),
            "per_node": _listed(own_class),
            "per_round": per_round["accuracy_own_classes"],
        },
        "graph": {
            "W": w.tolist(),
            "W_true": partition.w_true.tolist(),
            "clusters": clusters.tolist(),
            "l1_to_truth": l1_to_truth(w, partition.w_true),
            "within_cluster_mass": within_cluster_mass(w, clusters),
            "l1_to_truth_per_round": per_round["l1_to_truth"],
            "within_cluster_mass_per_round": per_round["within_cluster_mass"],
        },
        "comm": {
            "messages": messages,
            "bytes": byte_count,
            "payload_bytes": payload_bytes,
            "envelope_overhead": byte_count / payload_bytes if payload_bytes else None,
            "by_type": dict(sorted(by_type.items())),
            "messages_cumulative_per_round": per_round["messages"],
            "bytes_cumulative_per_round": per_round["bytes"],
            "discovery": discovery,
        },
        "rejections": dict(sorted(rejections.items())),
        "missing_payloads": int(sum(len(e["missing"]) for h in histories for e in h)),
        "rounds_completed_per_node": rounds_run,
        "resumed_from": [((s or {}).get("learning") or {}).get("resumed_from") for s in statuses],
        "catch_ups": [((s or {}).get("learning") or {}).get("catch_ups") for s in statuses],
        "round_s_mean": mean_of("round_s"),
        "local_step_s_mean": mean_of("step_s"),
        "gather_s_mean": mean_of("gather_s"),
        "wall_s": wall_s,
        "logs": [str(s.log_path) for s in cluster.specs],
    }


def check_report(report: dict[str, Any], thresholds: CheckThresholds) -> list[str]:
    """The failed checks, in words (empty: passed)."""
    failures = []
    rounds = report["rounds"]
    if thresholds.rounds_completed:
        short = [i for i, h in enumerate(report["rounds_completed_per_node"]) if h == 0]
        if short:
            failures.append(f"nodes {short} recorded no round")
        finals = report["accuracy"]["per_node"]
        if any(a is None for a in finals):
            failures.append("some nodes reported no accuracy")
        if len(report["accuracy"]["per_round"]) < rounds:
            failures.append(f"only {len(report['accuracy']['per_round'])} of {rounds} rounds reported")
    mean = report["accuracy"]["mean"]
    if mean is None or mean < thresholds.accuracy:
        failures.append(f"mean accuracy {mean} below {thresholds.accuracy}")
    from algorithms.catalog import GRAPH_LEARNING

    if (
        report["algorithm"] in GRAPH_LEARNING
        and report["graph"]["within_cluster_mass"] < thresholds.within_cluster_mass
    ):
        failures.append(
            f"within-cluster mass {report['graph']['within_cluster_mass']:.3f} below {thresholds.within_cluster_mass}"
        )
    return failures


def _nanmean(values: np.ndarray) -> float | None:
    return None if np.all(np.isnan(values)) else float(np.nanmean(values))


def _nanstd(values: np.ndarray) -> float | None:
    return None if np.all(np.isnan(values)) else float(np.nanstd(values))


def _listed(values: np.ndarray) -> list[float | None]:
    return [None if math.isnan(v) else float(v) for v in values]
