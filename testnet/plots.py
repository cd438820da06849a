"""The PNGs of a learning report (docs/architecture.md, "Reports"): the learned W beside W*,
accuracy per round, cumulative bytes. Drawn from report.json alone, so any report can be redrawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PLOTS", "write_plots"]

PLOTS = ("graph.png", "accuracy.png", "bytes.png")


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
