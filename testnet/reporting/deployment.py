"""`p2pnode report`: the report of a real deployment, from its nodes' history files
(p2pnode/learning/history.py), drawn by the renderer of `simulate` and `testnet` (report.py).

    configs ─► node ids (their keys), data directories ─► history.jsonl of each
            ─► assemble(header, records, truth=None)   (+ the local baseline, if the nodes trained one)
            ─► write_report: report.json, report.md, PNGs

What a deployment does not know stays null rather than made up: W* and the true clusters (so
no within-cluster mass, L1 to the truth or community agreement), a scenario and shard sizes for
nodes on their own data, the refusals the daemons counted (their `status` has them, not the
history). The local baseline (`[algorithm].local_baseline`) comes in as a baseline named
`local`, built from the same records, so the page and the plots show it as a simulation's
`--baselines local`, with what collaboration gained per node and overall.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from p2pnode.config import Config
from p2pnode.learning.history import HISTORY_NAME, History, read_history
from p2pnode.learning.rounds import RoundRecord

from .provenance import provenance
from .report import assemble, attach_baselines

__all__ = ["NodeHistory", "DeploymentReportError", "load_histories", "deployment_report"]

LOCAL_BASELINE = "local"
BASELINE_FIGURES = {"accuracy", "own_class_accuracy", "loss", "test_loss"}  # of a record's `local_baseline`


class DeploymentReportError(Exception):
    """The histories cannot make one report; the message says which node and why."""


@dataclass(frozen=True)
class NodeHistory:
    config: Config
    node_id: str
    history: History
    records: tuple[RoundRecord, ...]  # this node's, by round
    foreign: int  # records of another node id in its data directory (a key replaced since)

    @property
    def start(self) -> dict[str, Any]:
        """The last start line: what the node ran with (empty if none was written)."""
        return self.history.starts[-1] if self.history.starts else {}


def load_histories(configs: Sequence[Config]) -> list[NodeHistory]:
    """Each node's history, read from `[node].data_dir`; its node id is its key's."""
    nodes, seen = [], {}
    for config in configs:
        node_id = config.identity.node_id
        if node_id in seen:
            raise DeploymentReportError(f"{config.source}: same node (key) as {seen[node_id]}")
        seen[node_id] = config.source
        path = config.node.data_dir / HISTORY_NAME
        try:
            history = read_history(path)
        except FileNotFoundError as exc:
            raise DeploymentReportError(f"{config.source}: {exc}") from None
        except OSError as exc:
            raise DeploymentReportError(f"{config.source}: cannot read {path}: {exc.strerror or exc}") from None
        own = tuple(record for record in history.records if record.node == node_id)
        nodes.append(NodeHistory(config, node_id, history, own, len(history.records) - len(own)))
    return nodes


def _common(values: Sequence[Any]) -> Any:
    """The value every node has, or None where they differ."""
    return values[0] if values and all(value == values[0] for value in values) else None


def _header(nodes: Sequence[NodeHistory], algorithm: str) -> dict[str, Any]:
    data = [node.config.data for node in nodes]
    own = [settings.path is not None for settings in data]
    benchmark = not any(own)
    devices = sorted({str(node.start.get("device")) for node in nodes if node.start.get("device")})
    seed = _common([settings.seed for settings in data])
    return {
        "kind": "deployment",
        "algorithm": algorithm,
        "dataset": _common([settings.dataset for settings in data]) if benchmark else "own data",
        "scenario": _common([settings.scenario for settings in data]) if benchmark else None,
        "clusters": None,  # unknown: no ground truth on a deployment
        "nodes": len(nodes),
        "rounds": max(node.config.algorithm.rounds for node in nodes),
        "seed": seed,
        "samples_per_class": _common([settings.samples_per_class for settings in data]) if benchmark else None,
        "test_per_class": _common([settings.test_per_class for settings in data]) if benchmark else None,
        "partition_notes": [],
        "node_ids": [node.node_id for node in nodes],
        "backbones": [node.config.model.backbone for node in nodes],
        "node_classes": [list(node.start.get("classes") or []) for node in nodes],
        "class_names": list(names) if (names := _common([settings.class_names for settings in data])) else None,
        "config": {
            "configs": [str(node.config.source) for node in nodes],
            "settings": [dict(node.config.algorithm.settings) for node in nodes],
            "local_baseline": [node.config.algorithm.local_baseline for node in nodes],
        },
        "device": ", ".join(devices) or None,
        "mixed_precision": all(node.config.model.mixed_precision for node in nodes),
        "poisoners": [],
        "attack": None,
        "provenance": provenance(seed if seed is not None else 0, ", ".join(devices) or "unknown"),
    }


def deployment_report(nodes: Sequence[NodeHistory]) -> dict[str, Any]:
    """The report of the nodes' histories, with the local baseline beside it where they trained one."""
    algorithms = sorted({node.config.algorithm.name for node in nodes})
    if len(algorithms) > 1:
        raise DeploymentReportError(f"the nodes run different algorithms ({', '.join(algorithms)}): one report each")
    if algorithms == ["none"]:
        raise DeploymentReportError("[algorithm].name is none: these nodes do not learn, there is nothing to report")
    header = _header(nodes, algorithms[0])
    carried = [across_restarts(node.records) for node in nodes]
    records = [record for node in carried for record in node]
    processes = {
        "engine": "daemons",
        "resumed_from": [node.start.get("resumed_from") for node in nodes],
        # Each start after a node's first: the round it resumed after (None: from the beginning).
        "restarted_after": [[start.get("resumed_from") for start in node.history.starts[1:]] for node in nodes],
    }
    finals = [node[-1] for node in carried if node]
    report = assemble(
        header,
        records,
        None,
        rejections={},
        wall_s=_wall_s(nodes),
        processes=processes,
        discovery=_discovery(finals),
    )
    baseline = [_as_local(record) for record in records if record.local_baseline.keys() >= BASELINE_FIGURES]
    if baseline:
        local = assemble({**header, "algorithm": LOCAL_BASELINE}, baseline, None, rejections={}, wall_s=0.0)
        attach_baselines(report, {LOCAL_BASELINE: local})
    report["local_baseline_gain"] = _gain(report, nodes) if baseline else None
    report["accuracy_per_node_per_round"] = _per_node_rounds(nodes, bool(baseline))
    report["histories"] = [
        {
            "path": str(node.config.node.data_dir / HISTORY_NAME),
            "records": len(node.records),
            "unreadable_lines": node.history.unreadable,
            "superseded": node.history.replaced,
            "other_nodes": node.foreign,
        }
        for node in nodes
    ]
    return report


def across_restarts(records: Sequence[RoundRecord]) -> list[RoundRecord]:
    """One node's records (by round) with what it sent counted from its first start: a daemon
    counts its frames from its own process's start, so after a restart the totals fell back
    (the curve dropped at that round, and the report's totals left out what went before). A
    count lower than the round before's is a restart: what was counted until then is added to
    every record after."""
    carried, before = [], {"sent": {}, "discovery_sent": {}}
    offsets: dict[str, dict] = {"sent": {}, "discovery_sent": {}}
    for record in records:
        raw = {"sent": record.sent, "discovery_sent": record.discovery_sent}
        if any(_total(raw[key]) < _total(before[key]) for key in raw):
            for key in raw:
                offsets[key] = _added(offsets[key], before[key])
        before = raw
        carried.append(
            dataclasses.replace(
                record,
                sent=_added(record.sent, offsets["sent"]),
                discovery_sent=_added(record.discovery_sent, offsets["discovery_sent"]),
            )
        )
    return carried


def _total(counts) -> int:
    return sum(messages for messages, _, _ in counts.values())


def _added(a, b) -> dict:
    """Counts by type, (messages, bytes, payload bytes) each, added."""
    return {
        kind: tuple(x + y for x, y in zip(a.get(kind, (0, 0, 0)), b.get(kind, (0, 0, 0)), strict=True))
        for kind in a.keys() | b.keys()
    }


def _discovery(finals: Sequence[RoundRecord]) -> dict[str, Any]:
    """The discovery and keep-alive frames the nodes sent, as their histories carry them."""
    by_type: dict[str, dict[str, int]] = {}
    for final in finals:
        for kind, (messages, size, _) in final.discovery_sent.items():
            entry = by_type.setdefault(str(kind), {"messages": 0, "bytes": 0})
            entry["messages"] += messages
            entry["bytes"] += size
    return {
        "messages": sum(entry["messages"] for entry in by_type.values()),
        "bytes": sum(entry["bytes"] for entry in by_type.values()),
        "by_type": by_type,
    }


def _wall_s(nodes: Sequence[NodeHistory]) -> float:
    """The slowest node's rounds, added up (restarts and time between rounds not counted)."""
    return max((sum(record.round_s or 0.0 for record in node.records) for node in nodes), default=0.0)


def _as_local(record: RoundRecord) -> RoundRecord:
    """The local baseline's figures of `record` as a record of its own: it talks to no one."""
    baseline = record.local_baseline
    return dataclasses.replace(
        record,
        accuracy=baseline["accuracy"],
        own_class_accuracy=baseline["own_class_accuracy"],
        loss=baseline["loss"],
        test_loss=baseline["test_loss"],
        weights={record.node: 1.0},
        expected=0,
        arrived=0,
        missing=(),
        recipients=0,
        sent={},
        discovery_sent={},
        accuracy_by_predictor={},
        test_right=str(baseline.get("test_right", "")),
        predictor="",
        validation_by_predictor={},
        validation_samples=0,
        local_baseline={},
    )


def _gain(report: dict[str, Any], nodes: Sequence[NodeHistory]) -> dict[str, Any]:
    """Per node, the collaborative model's final accuracy minus the local baseline's, and the
    paired interval of their mean over nodes (report.py's `attach_baselines` computed it)."""
    local = report["baselines"][LOCAL_BASELINE]["accuracy"]["per_node"]
    ours = report["accuracy"]["per_node"]
    sizes = report["accuracy"]["test_samples_per_node"]
    per_node = [
        {
            "node": i,
            "n": sizes[i],
            "collaborative": ours[i],
            "local": local[i],
            "gain": None if ours[i] is None or local[i] is None else ours[i] - local[i],
        }
        for i in range(len(nodes))
    ]
    notes = []
    for i, node in enumerate(nodes):
        with_baseline = [record for record in node.records if record.local_baseline]
        if not with_baseline:
            notes.append(f"node {i} trained no local baseline")
            continue
        since = int(with_baseline[-1].local_baseline.get("since", 0))
        if since:
            notes.append(f"node {i}'s local baseline trained from round {since} on only (switched on later)")
        if with_baseline[-1].round != node.records[-1].round:
            notes.append(
                f"node {i}'s local baseline was last evaluated in round {with_baseline[-1].round}, "
                f"its {report['algorithm']} model in round {node.records[-1].round}"
            )
    return {
        "per_node": per_node,
        "difference": report["baselines"][LOCAL_BASELINE]["difference"],
        "notes": notes,
    }


def _per_node_rounds(nodes: Sequence[NodeHistory], baseline: bool) -> dict[str, Any]:
    """Each node's accuracy (and its local baseline's) in every round some node recorded; None
    where a node has no record of that round."""
    rounds = sorted({record.round for node in nodes for record in node.records})
    by_round = [{record.round: record for record in node.records} for node in nodes]
    table: dict[str, Any] = {
        "rounds": rounds,
        "per_node": [[mine[r].accuracy if r in mine else None for r in rounds] for mine in by_round],
    }
    if baseline:
        table["local_baseline"] = [
            [mine[r].local_baseline.get("accuracy") if r in mine else None for r in rounds] for mine in by_round
        ]
    return table
