"""Writing a learning run's report: `report.json` and the three PNGs of DESIGN.md §7.

The same writer serves the simulator and (next) the learning testnet, so both produce one schema:
algorithm, dataset, scenario, nodes, rounds, seed; accuracy {mean, std, per_node, per_round}
(fractions in [0, 1]); graph {W, W_true, l1_to_truth, within_cluster_mass, per-round series};
comm {messages, bytes, by_type}; rejections; wall_s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from p2pnode.files import write_atomically

__all__ = ["REQUIRED_KEYS", "write_report", "write_plots", "summary_line", "gap_share"]

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
)
PLOTS = ("graph.png", "accuracy.png", "bytes.png")


def gap_share(method: float, local: float, oracle: float) -> float | None:
    """How much of the Local→Oracle gap a method realises: (method − local) / (oracle − local)."""
    gap = oracle - local
    return None if abs(gap) < 1e-9 else (method - local) / gap


def run_header(kind: str, spec, partition, ids: list[str], backbones: list[str], config: dict) -> dict[str, Any]:
    """The fields that say what was run; the simulator and the learning testnet share them."""
    clusters = sorted({shard.cluster for shard in partition.shards})
    return {
        "kind": kind,
        "algorithm": spec.algorithm,
        "dataset": spec.dataset,
        "scenario": spec.scenario,
        "clusters": len(clusters),
        "nodes": spec.nodes,
        "rounds": spec.rounds,
        "seed": spec.seed,
        "samples_per_class": partition.samples_per_class,
        "test_per_class": partition.test_per_class,
        "partition_notes": list(partition.notes),
        "node_ids": ids,
        "backbones": backbones,
        "node_classes": [list(shard.classes) for shard in partition.shards],
        "config": config,
    }


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    """Write report.json and the PNGs into `out` (created); returns the paths written."""
    missing = [key for key in REQUIRED_KEYS if key not in report]
    if missing:
        raise ValueError(f"report lacks {missing}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    write_atomically(path, (json.dumps(report, indent=1) + "\n").encode())
    return [path, *write_plots(report, out)]


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    title = f"{report['algorithm']} · {report['dataset']} · scenario {report['scenario']} · {report['nodes']} nodes"
    written = []

    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), constrained_layout=True)
    for ax, key, name in ((axes[0], "W", "learned W"), (axes[1], "W_true", "W* (ground truth)")):
        image = ax.imshow(
            np.array(report["graph"][key]),
            vmin=0,
            vmax=max(1e-9, float(np.max(report["graph"]["W_true"]))),
            cmap="viridis",
        )
        ax.set_title(name)
        ax.set_xlabel("node j")
        ax.set_ylabel("node i")
    fig.colorbar(image, ax=axes, shrink=0.8, label="w_ij")
    fig.suptitle(
        f"{title}\nL1 to truth {report['graph']['l1_to_truth']:.3f} · "
        f"within-cluster mass {report['graph']['within_cluster_mass']:.3f}"
    )
    written.append(_save(fig, out / "graph.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    rounds = np.arange(1, len(report["accuracy"]["per_round"]) + 1)
    ax.plot(rounds, np.array(report["accuracy"]["per_round"]) * 100, label="mean over nodes")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, out / "accuracy.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    cumulative = np.array(report["comm"]["bytes_cumulative_per_round"], dtype=float)
    ax.plot(rounds[: len(cumulative)], cumulative / 2**20)
    ax.set_xlabel("round")
    ax.set_ylabel("cumulative bytes sent (MiB)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "bytes.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary_line(report: dict[str, Any]) -> str:
    acc = report["accuracy"]
    graph = report["graph"]
    if acc["mean"] is None:
        return f"{report['algorithm']}: no node reported an accuracy"
    return (
        f"{report['algorithm']}: accuracy {acc['mean'] * 100:.1f} ± {acc['std'] * 100:.1f} %, "
        f"within-cluster mass {graph['within_cluster_mass']:.3f}, L1 to truth {graph['l1_to_truth']:.3f}, "
        f"{report['comm']['messages']} messages, {report['comm']['bytes'] / 2**20:.1f} MiB, "
        f"{report['wall_s']:.0f} s"
    )
