"""A learning run's report, from the `RoundRecord`s its nodes wrote: one builder for the
simulator and the learning testnet, so both produce one schema (docs/architecture.md, "Reports").

    header ─► assemble(header, records, truth, ...) ─► check(report, thresholds)
           ─► attach_baselines(report, {name: report of the same nodes})   (optional)
           ─► write_report: report.json, report.md (summary.py), PNGs (plots.py)

Per round, a node's latest record so far stands for it (a node that skipped a round keeps its
last one; a node with none yet talks to no one and has no accuracy). The final figures are each
node's last record.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.catalog import GRAPH_LEARNING
from algorithms.graphs.graph import adjusted_rand_index, communities, l1_to_truth, within_cluster_mass
from p2pnode.files import write_atomically
from p2pnode.learning.rounds import RoundRecord, right_from_bits, served_because

from .intervals import paired_difference, wilson
from .plots import write_plots
from .summary import difference_text, write_summary

__all__ = [
    "REQUIRED_KEYS",
    "Truth",
    "CheckThresholds",
    "run_header",
    "assemble",
    "judge",
    "attach_baselines",
    "check",
    "write_report",
    "summary_line",
    "time_to_accuracy",
]

REQUIRED_KEYS = (
    "algorithm",
    "dataset",
    "scenario",
    "nodes",
    "rounds",
    "seed",
    "accuracy",
    "graph",
    "comm",
    "rejections",
    "wall_s",
    "check",
    "provenance",
    "baselines",
)


# Only real daemons have them: per node (where it ran, how it ended, its log, resumes and
# catch-ups, its memory and its ingress processes', whether it was reachable at its address), and
# per run what `--churn` did, which daemons died and `--restart` started again, which exited on
# their own and stayed down (testnet/launch/churn.py), and the run's timeout and whether it ran out.
PROCESS_KEYS = (
    *("engine", "addresses", "exit_codes", "logs", "resumed_from", "catch_ups", "rss_mb", "peak_rss_mb"),
    *("ingress_rss_mb", "ingress_restarts", "reachability", "relay"),
    *("churn", "restarts", "restarted_after", "exits", "timeout_s", "timed_out"),
)


@dataclass(frozen=True)
class Truth:
    """What a run is measured against: the true collaboration matrix W* and cluster of each node."""

    w: np.ndarray
    clusters: np.ndarray

    @classmethod
    def of(cls, partition) -> Truth:
        return cls(partition.w_true, np.array([shard.cluster for shard in partition.shards]))


@dataclass(frozen=True)
class CheckThresholds:
    """What `--check` asserts, each overridable on the command line."""

    accuracy: float = 0.6  # mean final accuracy on the nodes' own test splits
    within_cluster_mass: float = 0.9  # for algorithms that learn a graph
    rounds_completed: bool = True  # every node ran up to the last round (skipping some is allowed)


def run_header(
    kind: str,
    spec,
    partition,
    ids: list[str],
    backbones: list[str],
    config: dict,
    placement: tuple[Any, bool],
    provenance: Mapping[str, Any],
) -> dict[str, Any]:
    """The fields that say what was run, and where and with what (testnet/reporting/provenance.py);
    `placement` is (device, mixed precision) as the nodes resolved `spec.device`
    (algorithms/models/device.py)."""
    device, mixed_precision = placement
    clusters = sorted({shard.cluster for shard in partition.shards})
    return {
        "kind": kind,
        "algorithm": spec.algorithm,
        "dataset": spec.dataset_label,
        "scenario": spec.scenario_label,
        "clusters": len(clusters),
        "nodes": spec.nodes,
        "rounds": spec.rounds,
        "seed": spec.seed,
        "samples_per_class": partition.samples_per_class,
        "test_per_class": partition.test_per_class,
        "partition_notes": list(partition.notes),
        "node_ids": ids,
        "backbones": backbones,
        # `[model].weights` every backbone started from (None: a fresh initialisation)
        "weights": getattr(spec, "weights_label", None),
        "node_classes": [list(shard.classes) for shard in partition.shards],
        "class_names": getattr(spec, "class_names", None),  # the ids' names, where the data is one's own
        "config": config,
        "device": str(device),
        "mixed_precision": mixed_precision,
        "poisoners": list(getattr(spec, "poisoners", ())),
        "slow": _slow(spec),
        "pace": getattr(spec, "pace", 1.0),  # testnet: `--pace` (the simulator's clock ignores it)
        # `[algorithm].schedule` and what goes with it (p2pnode/learning/rounds.py `Schedule`)
        "schedule": asdict(spec.schedule) if hasattr(spec, "schedule") else None,
        "attack": {"kind": spec.attack, "factor": spec.attack_factor} if getattr(spec, "poisoners", ()) else None,
        "provenance": dict(provenance),
    }


def _slow(spec) -> dict[str, Any] | None:
    """`--slow`: which nodes stepped slower (drawn by the seed), and by what factor."""
    slow = getattr(spec, "slow", None)
    return (
        None if slow is None else {"fraction": slow.fraction, "factor": slow.factor, "nodes": list(spec.slow_nodes())}
    )


def time_to_accuracy(
    curves: Sequence[Sequence[tuple[float | None, float]]], targets: Sequence[float | None] | None = None
) -> list[float | None]:
    """Per node, the first `ended_at` at which its accuracy reached its target; `curves[i]` is
    node i's (ended_at, accuracy) per round in order, `targets[i]` its target (default: its own
    final accuracy in that run); None where it never did or the times are unknown."""
    reached = []
    for i, curve in enumerate(curves):
        target = (curve[-1][1] if curve else None) if targets is None else targets[i]
        first = next((at for at, accuracy in curve if target is not None and accuracy >= target), None)
        reached.append(first)
    return reached


def _timed(by_node: list[dict[int, RoundRecord]]) -> dict[str, Any]:
    """When each node's rounds ended (simulated seconds in a simulation, real ones since the
    daemon's first round in a testnet) and how it did then; and its time to accuracy, the target
    being its own final accuracy (the bench of docs/benchmarks "Stragglers" gives other targets:
    `time_to_accuracy`)."""
    curves = [[(history[r].ended_at, history[r].accuracy) for r in sorted(history)] for history in by_node]
    reached = time_to_accuracy(curves)
    return {
        "target": "each node's own final accuracy",
        "per_node": reached,
        "max": max((at for at in reached if at is not None), default=None),
        "ended_at_per_node": [[at for at, _ in curve] for curve in curves],
        "accuracy_per_node": [[accuracy for _, accuracy in curve] for curve in curves],
    }


def assemble(
    header: Mapping[str, Any],
    records: Iterable[RoundRecord],
    truth: Truth | None,
    *,
    rejections: Mapping[str, int],
    wall_s: float,
    discovery: Mapping[str, Any] | None = None,
    processes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report of a run. `discovery` is the traffic outside learning (the testnet's daemons;
    none in a simulation), `processes` what only real daemons have (PROCESS_KEYS: where they ran,
    exit codes, logs, resumes, catch-ups, memory, churn, restarts, exits; null in a simulation).
    `truth` None: W* and the clusters are unknown (a deployment on its own data), and every
    figure measured against them is null rather than made up."""
    ids = list(header["node_ids"])
    by_node: list[dict[int, RoundRecord]] = [{} for _ in ids]
    index = {node_id: i for i, node_id in enumerate(ids)}
    for record in records:
        by_node[index[record.node]][record.round] = record
    series = _per_round(by_node, int(header["rounds"]), ids, truth)
    finals = [history[max(history)] if history else None for history in by_node]
    w = _matrix([None if f is None else f.weights for f in finals], ids)
    found = communities(w)
    accuracy = np.array([np.nan if f is None else f.accuracy for f in finals])
    own_class = np.array([np.nan if f is None else f.own_class_accuracy for f in finals])
    every = [record for history in by_node for record in history.values()]
    return {
        **header,
        "accuracy": {**_spread(accuracy), **_series(series, "accuracy", "per_round"), **_tested(finals)},
        "accuracy_own_classes": {**_spread(own_class), "per_round": series["accuracy_own_classes"]},
        "accuracy_by_predictor": _by_predictor(finals),
        "loss": {**_series(series, "loss", "train_per_round"), "test_per_round": series["test_loss"]},
        "graph": {
            "W": w.tolist(),
            **_against_truth(w, truth, series),
            "communities": found,
            "community_agreement": None if truth is None else adjusted_rand_index(found, truth.clusters),
        },
        "poisoning": _poisoning(by_node, int(header["rounds"]), ids, header.get("poisoners") or [], truth),
        "comm": _communication(finals, series, discovery),
        "baselines": {},
        "rejections": dict(sorted(rejections.items())),
        "missing_payloads": sum(len(record.missing) for record in every),
        "rounds_completed_per_node": [len(history) for history in by_node],
        "last_round_per_node": [max(history) if history else None for history in by_node],
        "timing": {
            "local_step_s_mean": _mean_of(every, "step_s"),
            "gather_s_mean": _mean_of(every, "gather_s"),
            "round_s_mean": _mean_of(every, "round_s"),
        },
        "time_to_accuracy": _timed(by_node),
        "wall_s": wall_s,
        "processes": dict.fromkeys(PROCESS_KEYS) | dict(processes or {}),
        "check": None,
    }


def _against_truth(w: np.ndarray, truth: Truth | None, series: dict[str, list]) -> dict[str, Any]:
    """The learned W against W* and the true clusters; all null where they are unknown."""
    keys = ("W_true", "clusters", "l1_to_truth", "within_cluster_mass")
    if truth is None:
        return dict.fromkeys((*keys, "l1_to_truth_per_round", "within_cluster_mass_per_round"))
    return {
        "W_true": np.asarray(truth.w).tolist(),
        "clusters": np.asarray(truth.clusters).tolist(),
        "l1_to_truth": l1_to_truth(w, truth.w),
        "within_cluster_mass": within_cluster_mass(w, truth.clusters),
        "l1_to_truth_per_round": series["l1_to_truth"],
        "within_cluster_mass_per_round": series["within_cluster_mass"],
    }


# What a baseline brings into the report beside it, and what must be equal for the comparison to
# hold: the same nodes, shards and test splits.
BASELINE_KEYS = ("algorithm", "config", "backbones", "accuracy", "accuracy_own_classes", "loss", "wall_s")
SAME_NODES = ("dataset", "scenario", "nodes", "rounds", "seed", "samples_per_class", "test_per_class", "node_classes")


def attach_baselines(report: dict[str, Any], baselines: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Put the runs of other methods on the same nodes beside `report` (under `baselines`, by
    name), each with the paired bootstrap interval of `report`'s accuracy minus its own."""
    for name, other in baselines.items():
        differ = [key for key in SAME_NODES if other.get(key) != report.get(key)]
        if differ:
            raise ValueError(f"baseline {name} did not run the same nodes: {', '.join(differ)} differ")
        report["baselines"][name] = {
            **{key: other[key] for key in BASELINE_KEYS},
            "comm": {"messages": other["comm"]["messages"], "bytes": other["comm"]["bytes"]},
            "difference": paired_difference(
                report["accuracy"]["per_node"], other["accuracy"]["per_node"], _rights(report), _rights(other)
            ),
        }
    return report


def _rights(report: Mapping[str, Any]) -> list[np.ndarray | None]:
    """Each node's right/wrong per test image, as `_tested` recorded it (None where unknown)."""
    accuracy = report["accuracy"]
    bits = accuracy.get("test_right_per_node") or [None] * len(accuracy["per_node"])
    return rights_of(bits, accuracy.get("test_samples_per_node") or [None] * len(bits))


def rights_of(bits: Sequence[str | None], sizes: Sequence[int | None]) -> list[np.ndarray | None]:
    """Per node, its recorded right/wrong bits decoded for its test images (None where unknown)."""
    return [None if b is None or n is None else right_from_bits(b, n) for b, n in zip(bits, sizes, strict=True)]


def _by_predictor(finals: list[RoundRecord | None]) -> dict[str, dict[str, Any]]:
    """The final accuracy of each predictor of nodes that have several (empty otherwise)."""
    names = sorted({name for f in finals if f is not None for name in f.accuracy_by_predictor})
    return {
        name: _spread(np.array([np.nan if f is None else f.accuracy_by_predictor.get(name, np.nan) for f in finals]))
        for name in names
    }


def _latest_per_round(by_node: list[dict[int, RoundRecord]], rounds: int) -> Iterator[list[RoundRecord | None]]:
    """Each round's latest record so far of every node (None before its first), for rounds in
    which some node has one."""
    latest: list[RoundRecord | None] = [None] * len(by_node)
    for r in range(rounds):
        latest = [history.get(r, last) for history, last in zip(by_node, latest, strict=True)]
        if any(record is not None for record in latest):
            yield latest


def _per_round(
    by_node: list[dict[int, RoundRecord]], rounds: int, ids: list[str], truth: Truth | None
) -> dict[str, list]:
    keys = ("accuracy", "accuracy_own_classes", "loss", "test_loss", "l1_to_truth", "within_cluster_mass")
    series: dict[str, list] = {key: [] for key in (*keys, "accuracy_band", "loss_band", "messages", "bytes")}
    series["sent"], series["discovery_sent"] = [], []  # per round: type → bytes so far, summed over nodes
    for latest in _latest_per_round(by_node, rounds):
        present = [record for record in latest if record is not None]
        series["accuracy"].append(float(np.mean([e.accuracy for e in present])))
        series["accuracy_band"].append(_band([e.accuracy for e in present]))
        series["accuracy_own_classes"].append(float(np.mean([e.own_class_accuracy for e in present])))
        series["loss"].append(float(np.mean([e.loss for e in present])))
        series["loss_band"].append(_band([e.loss for e in present]))
        series["test_loss"].append(float(np.mean([e.test_loss for e in present])))
        if truth is not None:
            w = _matrix([None if e is None else e.weights for e in latest], ids)
            series["l1_to_truth"].append(l1_to_truth(w, truth.w))
            series["within_cluster_mass"].append(within_cluster_mass(w, truth.clusters))
        series["messages"].append(sum(e.messages_out for e in present))
        series["bytes"].append(sum(e.bytes_out for e in present))
        for key in ("sent", "discovery_sent"):
            series[key].append(_bytes_by_type(getattr(e, key) for e in present))
    return series


def _bytes_by_type(counts: Iterable[Mapping[str, tuple[int, int, int]]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for by_type in counts:
        for kind, (_, size, _) in by_type.items():
            total[str(kind)] += size
    return total


BAND = ("min", "q1", "median", "q3", "max")


def _band(values: Sequence[float]) -> dict[str, float]:
    """The spread over nodes drawn as a band: extremes and quartiles."""
    return dict(zip(BAND, (float(q) for q in np.quantile(values, [0, 0.25, 0.5, 0.75, 1])), strict=True))


def _series(series: dict[str, list], name: str, key: str) -> dict[str, Any]:
    """A per-round mean as `key`, and its band over nodes as `key`_band: {min, q1, median, q3, max}."""
    bands = series[f"{name}_band"]
    return {key: series[name], f"{key}_band": {q: [band[q] for band in bands] for q in BAND}}


def _tested(finals: list[RoundRecord | None]) -> dict[str, Any]:
    """Each node's test-split size and the accuracy over all their images together, with its
    Wilson interval (testnet/reporting/intervals.py); None where a node did not say how many it had. And
    which of its predictors each node serves, where it has several (MAPL-Dual, MAPL-Auto)."""
    served = {
        "predictor_per_node": [None if f is None or not f.predictor else f.predictor for f in finals],
        # why, where what its peers run or the images it chose on decided it (MAPL-Auto)
        "predictor_why_per_node": [
            None
            if f is None or not (f.validation_by_predictor or f.predictor_why)
            else served_because(f.predictor, f.validation_by_predictor, f.validation_samples, f.predictor_why)
            for f in finals
        ],
    }
    sizes = [f.test_samples if f is not None and f.test_samples > 0 else None for f in finals]
    # which test images each node's served predictor got right (rounds.right_bits; "" unknown):
    # what a small fleet's difference between methods is paired on
    served["test_right_per_node"] = [None if f is None or not f.test_right else f.test_right for f in finals]
    if any(size is None for size in sizes):
        return {"test_samples_per_node": sizes, "pooled": None, **served}
    correct = sum(round(f.accuracy * f.test_samples) for f in finals)  # accuracy is correct / test_samples
    n = sum(sizes)
    low, high = wilson(correct, n)
    return {
        "test_samples_per_node": sizes,
        "pooled": {"correct": correct, "n": n, "accuracy": correct / n, "low": low, "high": high},
        **served,
    }


def _poisoning(
    by_node: list[dict[int, RoundRecord]], rounds: int, ids: list[str], poisoners: Sequence[int], truth: Truth | None
) -> dict[str, Any] | None:
    """Per round, the weight the honest rows of W put on the poisoners (together), its max and
    mean over those rows, the honest nodes' mean accuracy, and how far the honest rows are from
    the truth among honest nodes (`honest_truth`); finals as the last round's."""
    if not poisoners or truth is None:
        return None
    honest = [i for i in range(len(ids)) if i not in set(poisoners)]
    target = honest_truth(truth.w, poisoners)[honest]
    weight_max, weight_mean, accuracy, off_mean, off_max, mass, true_mass = [], [], [], [], [], [], []
    for latest in _latest_per_round(by_node, rounds):
        w = _matrix([None if e is None else e.weights for e in latest], ids)
        on_poisoners = w[np.ix_(honest, list(poisoners))].sum(axis=1)
        weight_max.append(float(on_poisoners.max()))
        weight_mean.append(float(on_poisoners.mean()))
        present = [latest[i].accuracy for i in honest if latest[i] is not None]
        accuracy.append(float(np.mean(present)) if present else None)
        off = np.abs(w[honest] - target).sum(axis=1)
        off_mean.append(float(off.mean()))
        off_max.append(float(off.max()))
        mass.append(float((w[honest] * (target > 0)).sum(axis=1).mean()))
        true_mass.append(float((w[honest] * (truth.w[honest] > 0)).sum(axis=1).mean()))
    finals = [history[max(history)].accuracy if history else np.nan for history in by_node]
    return {
        "nodes": list(poisoners),
        "honest": honest,
        "honest_accuracy": {**_spread(np.array([finals[i] for i in honest])), "per_round": accuracy},
        "poisoner_weight": {
            "max": weight_max[-1] if weight_max else None,
            "mean": weight_mean[-1] if weight_mean else None,
            "max_per_round": weight_max,
            "mean_per_round": weight_mean,
        },
        "honest_l1_to_truth": {
            "mean": off_mean[-1] if off_mean else None,
            "max": off_max[-1] if off_max else None,
            "mean_per_round": off_mean,
            "max_per_round": off_max,
        },
        # The weight honest rows keep on the node and its honest cluster-mates (`--check`'s mass).
        "honest_within_cluster_mass": {"final": mass[-1] if mass else None, "per_round": mass},
        # The same rows' weight within their true clusters, the poisoners counted as mates: the
        # check's mass when the poisoners' payloads are honest (`--attack none`, a barrage alone).
        "honest_rows_true_mass": {"final": true_mass[-1] if true_mass else None, "per_round": true_mass},
    }


def honest_truth(w_true: np.ndarray, poisoners: Sequence[int]) -> np.ndarray:
    """W* with the poisoners counted as no one's cluster-mate: their columns emptied and each
    row renormalised over the honest nodes (a node whose only mate poisons: itself alone)."""
    w = np.array(w_true, dtype=np.float64)
    w[:, list(poisoners)] = 0.0
    for i in poisoners:
        w[i] = 0.0
        w[i, i] = 1.0  # a poisoner's own row: itself alone (it is no one's mate; no honest row is it)
    return w / w.sum(axis=1, keepdims=True)


def _matrix(rows: Sequence[Mapping[str, float] | None], ids: list[str]) -> np.ndarray:
    """W from each node's row; a node without one talks to no one (all its weight on itself)."""
    index = {node_id: i for i, node_id in enumerate(ids)}
    w = np.zeros((len(ids), len(ids)))
    for i, row in enumerate(rows):
        for peer, weight in (row or {ids[i]: 1.0}).items():
            if peer in index:
                w[i, index[peer]] = weight
    return w


def _communication(
    finals: list[RoundRecord | None], series: dict[str, list], discovery: Mapping[str, Any] | None
) -> dict[str, Any]:
    by_type: dict[str, dict[str, Any]] = {}
    payload = 0
    for final in finals:
        for kind, (messages, size, payload_bytes) in (final.sent if final else {}).items():
            entry = by_type.setdefault(str(kind), {"messages": 0, "bytes": 0})
            entry["messages"] += messages
            entry["bytes"] += size
            payload += payload_bytes
    total = sum(entry["bytes"] for entry in by_type.values())
    discovery = dict(discovery or {"messages": 0, "bytes": 0})
    discovery_by_type = {kind: dict(entry) for kind, entry in (discovery.get("by_type") or {}).items()}
    for family, key in ((by_type, "sent"), (discovery_by_type, "discovery_sent")):
        for kind, entry in family.items():
            entry["bytes_cumulative_per_round"] = [so_far[kind] for so_far in series[key]]
    return {
        "messages": sum(entry["messages"] for entry in by_type.values()),
        "bytes": total,
        "payload_bytes": payload,
        "envelope_overhead": total / payload if payload else None,
        "by_type": dict(sorted(by_type.items())),
        "messages_cumulative_per_round": series["messages"],
        "bytes_cumulative_per_round": series["bytes"],
        "recipients_last_round": [None if f is None else f.recipients for f in finals],
        "discovery": {
            "messages": discovery["messages"],
            "bytes": discovery["bytes"],
            "by_type": dict(sorted(discovery_by_type.items())),
            "bytes_cumulative_per_round": [sum(so_far.values()) for so_far in series["discovery_sent"]],
        },
    }


def _spread(values: np.ndarray) -> dict[str, Any]:
    """Mean, std and the per-node list of a per-node figure (NaN: the node reported none)."""
    if np.all(np.isnan(values)):
        return {"mean": None, "std": None, "per_node": [None] * len(values)}
    listed = [None if math.isnan(v) else float(v) for v in values]
    return {"mean": float(np.nanmean(values)), "std": float(np.nanstd(values)), "per_node": listed}


def _mean_of(records: list[RoundRecord], name: str) -> float | None:
    values = [getattr(record, name) for record in records if getattr(record, name) is not None]
    return float(np.mean(values)) if values else None


def check(report: dict[str, Any], thresholds: CheckThresholds) -> dict[str, Any]:
    """Judge a report against `thresholds`; returns {passed, failures (in words), thresholds}."""
    failures = []
    rounds = report["rounds"]
    if thresholds.rounds_completed:
        short = [i for i, count in enumerate(report["rounds_completed_per_node"]) if count == 0]
        if short:
            failures.append(f"nodes {short} recorded no round")
        # Rounds a node skipped (it was down, or caught up with its peers) are allowed; stopping
        # before the last one is not.
        unfinished = [
            i for i, last in enumerate(report["last_round_per_node"]) if last is not None and last < rounds - 1
        ]
        if unfinished:
            failures.append(f"nodes {unfinished} stopped before the last round ({rounds - 1})")
        if any(a is None for a in report["accuracy"]["per_node"]):
            failures.append("some nodes reported no accuracy")
        if len(report["accuracy"]["per_round"]) < rounds:
            failures.append(f"only {len(report['accuracy']['per_round'])} of {rounds} rounds reported")
    mean = report["accuracy"]["mean"]
    if mean is None or mean < thresholds.accuracy:
        failures.append(f"mean accuracy {mean} below {thresholds.accuracy}")
    # With poisoners, on the honest rows (the attackers' own rows are theirs): a poisoner counted
    # as no one's cluster-mate, or, where its payloads are honest (`--attack none`), as the mate it
    # is. Not in the control twin, where every node is honest.
    poisoning, kind = report.get("poisoning"), (report.get("attack") or {}).get("kind")
    if not poisoning:
        mass, which = report["graph"]["within_cluster_mass"], "within-cluster mass"
    elif kind == "none":
        mass, which = poisoning["honest_rows_true_mass"]["final"], "honest rows' within-cluster mass"
    else:
        mass, which = poisoning["honest_within_cluster_mass"]["final"], "honest within-cluster mass"
    if report["algorithm"] in GRAPH_LEARNING and mass is None:
        failures.append(f"no {which}: no round was recorded")
    elif report["algorithm"] in GRAPH_LEARNING and mass < thresholds.within_cluster_mass:
        failures.append(f"{which} {mass:.3f} below {thresholds.within_cluster_mass}")
    return {"passed": not failures, "failures": failures, "thresholds": asdict(thresholds)}


def judge(report: dict[str, Any], thresholds: CheckThresholds | None) -> dict[str, Any]:
    """`check` with `--check`'s `thresholds`, or, not asked (None), on every node finishing
    alone; the verdict says which (`asked`)."""
    verdict = check(report, thresholds or CheckThresholds(accuracy=0.0, within_cluster_mass=0.0))
    return {**verdict, "asked": thresholds is not None}


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    """Write report.json and the PNGs into `out` (created); returns the paths written."""
    missing = [key for key in REQUIRED_KEYS if key not in report]
    if missing:
        raise ValueError(f"report lacks {missing}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    write_atomically(path, (json.dumps(report, indent=1) + "\n").encode())
    plots = write_plots(report, out)
    return [path, write_summary(report, out, [plot.name for plot in plots]), *plots]


def summary_line(report: dict[str, Any]) -> str:
    acc = report["accuracy"]
    graph = report["graph"]
    if acc["mean"] is None:
        return f"{report['algorithm']}: no node reported an accuracy"
    against_truth = (
        ""
        if graph["within_cluster_mass"] is None
        else f"within-cluster mass {graph['within_cluster_mass']:.3f}, L1 to truth {graph['l1_to_truth']:.3f}, "
    )
    line = (
        f"{report['algorithm']}: accuracy {acc['mean'] * 100:.1f} ± {acc['std'] * 100:.1f} %, {against_truth}"
        f"{report['comm']['messages']} messages, {report['comm']['bytes'] / 2**20:.1f} MiB, "
        f"{report['wall_s']:.0f} s"
    )
    poisoning = report.get("poisoning")
    if poisoning and poisoning["honest_accuracy"]["mean"] is not None:
        line += (
            f"; poisoners {poisoning['nodes']} ({report['attack']['kind']}): honest accuracy "
            f"{poisoning['honest_accuracy']['mean'] * 100:.1f} %, their weight in honest rows "
            f"≤ {poisoning['poisoner_weight']['max']:.3f}, honest rows' L1 to the honest truth "
            f"{poisoning['honest_l1_to_truth']['mean']:.3f}"
        )
    local = report.get("baselines", {}).get("local")
    if local is not None and local["accuracy"]["mean"] is not None:  # the headline: what collaboration gained
        line += f"; Local {local['accuracy']['mean'] * 100:.1f} %, gain {difference_text(local['difference'])}"
    return line
