"""The PNGs of a learning report (docs/learning.md, "Report"), drawn from report.json alone, so
any report can be redrawn:

- graph.png: the learned W beside W*, nodes ordered by true cluster, each cluster boxed (the
  learned W alone where the truth is unknown: a deployment's `p2pnode report`);
- accuracy.png: accuracy per round, the mean and the spread over nodes, with the baselines
  (Local, Oracle) on the same axes when the report has them;
- loss.png: training loss (each method's own objective) and test cross-entropy per round;
- accuracy_vs_bytes.png: accuracy against the learning bytes sent so far;
- bytes.png: bytes sent so far per round by message type, learning and discovery apart, and
  the totals by type.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["PLOTS", "write_plots"]

PLOTS = ("graph.png", "accuracy.png", "loss.png", "accuracy_vs_bytes.png", "bytes.png")
COLOURS = {"local": "tab:orange", "oracle": "tab:green"}  # the report's own method is blue
MIB = 2**20
MAX_TICKED_NODES = 30  # beyond this the heat-map names no node


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt

    scenario = "" if report["scenario"] is None else f" · scenario {report['scenario']}"
    title = f"{report['algorithm']} · {report['dataset']}{scenario} · {report['nodes']} nodes"
    drawers = (_graph, _accuracy, _loss, _accuracy_vs_bytes, _bytes)
    written = []
    for name, draw in zip(PLOTS, drawers, strict=True):
        fig = draw(report, title, plt)
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(out / name)
    return written


def _methods(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(name, run, colour) of the report's method and each baseline it carries."""
    baselines = report.get("baselines") or {}
    extra = [(name, run, COLOURS.get(name, f"C{i + 3}")) for i, (name, run) in enumerate(baselines.items())]
    return [(report["algorithm"], report, "tab:blue"), *extra]


def _graph(report: dict[str, Any], title: str, plt):
    graph = report["graph"]
    if graph["W_true"] is None:
        return _learned_graph(report, title, plt)
    clusters = np.asarray(graph["clusters"])
    order = np.argsort(clusters, kind="stable")
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 4.4), constrained_layout=True)
    top = max(1e-9, float(np.max(graph["W_true"])))
    for ax, key, name in ((axes[0], "W", "learned W"), (axes[1], "W_true", "W* (ground truth)")):
        w = np.asarray(graph[key])[np.ix_(order, order)]
        image = ax.imshow(w, vmin=0, vmax=top, cmap="viridis")
        _box_clusters(ax, clusters[order], plt)
        ax.set_title(name)
        ax.set_xlabel("node j (ordered by true cluster)")
        ax.set_ylabel("node i")
        if len(order) <= MAX_TICKED_NODES:
            ax.set_xticks(range(len(order)), [str(i) for i in order], fontsize=7)
            ax.set_yticks(range(len(order)), [str(i) for i in order], fontsize=7)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.colorbar(image, ax=axes, shrink=0.8, label="w_ij")
    fig.suptitle(
        f"{title}\nL1 to truth {graph['l1_to_truth']:.3f} · within-cluster mass {graph['within_cluster_mass']:.3f}"
        f" · true clusters boxed"
    )
    return fig


def _learned_graph(report: dict[str, Any], title: str, plt):
    """The learned W alone, where the truth is unknown (a deployment on its own data)."""
    w = np.asarray(report["graph"]["W"])
    fig, ax = plt.subplots(figsize=(5.5, 4.6), constrained_layout=True)
    image = ax.imshow(w, vmin=0, vmax=max(1e-9, float(w.max(initial=0))), cmap="viridis")
    ax.set_xlabel("node j")
    ax.set_ylabel("node i")
    if len(w) <= MAX_TICKED_NODES:
        ax.set_xticks(range(len(w)), [str(i) for i in range(len(w))], fontsize=7)
        ax.set_yticks(range(len(w)), [str(i) for i in range(len(w))], fontsize=7)
    fig.colorbar(image, ax=ax, shrink=0.8, label="w_ij")
    ax.set_title(f"{title}\nlearned W, last round (no ground truth: each node's own data)", fontsize=9)
    return fig


def _box_clusters(ax, ordered: np.ndarray, plt) -> None:
    """A red square around each true cluster's block on the diagonal."""
    starts = [0, *(i for i in range(1, len(ordered)) if ordered[i] != ordered[i - 1]), len(ordered)]
    for start, end in itertools.pairwise(starts):
        size = end - start
        ax.add_patch(plt.Rectangle((start - 0.5, start - 0.5), size, size, fill=False, edgecolor="red", lw=1.5))


def _accuracy(report: dict[str, Any], title: str, plt):
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for index, (name, run, colour) in enumerate(_methods(report)):
        accuracy = run["accuracy"]
        mean = np.array(accuracy["per_round"], dtype=float) * 100
        rounds = np.arange(1, len(mean) + 1)
        band = accuracy.get("per_round_band")
        if band:
            low, high = np.array(band["min"]) * 100, np.array(band["max"]) * 100
            ax.fill_between(rounds, low, high, color=colour, alpha=0.15 if index == 0 else 0.08)
            if index == 0:
                ax.fill_between(rounds, np.array(band["q1"]) * 100, np.array(band["q3"]) * 100, color=colour, alpha=0.3)
        ax.plot(rounds, mean, color=colour, ls="-" if index == 0 else "--", label=f"{name}: mean over nodes")
    _rounds_axis(ax)
    ax.set_ylabel("test accuracy on own split (%)")
    ax.set_title(f"{title}\nshaded: min–max over nodes (and quartiles for {report['algorithm']})", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def _loss(report: dict[str, Any], title: str, plt):
    fig, (train, test) = plt.subplots(1, 2, figsize=(10, 4.2), constrained_layout=True)
    for index, (name, run, colour) in enumerate(_methods(report)):
        loss = run["loss"]
        style = "-" if index == 0 else "--"
        mean = np.array(loss["train_per_round"], dtype=float)
        rounds = np.arange(1, len(mean) + 1)
        band = loss.get("train_per_round_band")
        if band:
            train.fill_between(rounds, band["min"], band["max"], color=colour, alpha=0.12)
        train.plot(rounds, mean, color=colour, ls=style, label=name)
        test.plot(
            np.arange(1, len(loss["test_per_round"]) + 1), loss["test_per_round"], color=colour, ls=style, label=name
        )
    train.set_title("training loss (each method's own objective)\nmean, min–max over nodes", fontsize=9)
    test.set_title("test cross-entropy, mean over nodes", fontsize=9)
    for ax in (train, test):
        _rounds_axis(ax)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    return fig


def _rounds_axis(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _accuracy_vs_bytes(report: dict[str, Any], title: str, plt):
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    mib = np.array(report["comm"]["bytes_cumulative_per_round"], dtype=float) / MIB
    accuracy = report["accuracy"]
    if mib.size and mib[-1] > 0:
        band = accuracy.get("per_round_band")
        if band:
            ax.fill_between(mib, np.array(band["q1"]) * 100, np.array(band["q3"]) * 100, color="tab:blue", alpha=0.3)
        ax.plot(mib, np.array(accuracy["per_round"]) * 100, "o-", ms=3, color="tab:blue", label=report["algorithm"])
    else:
        ax.text(0.5, 0.5, f"{report['algorithm']} sends no learning frames", ha="center", transform=ax.transAxes)
    for name, run, colour in _methods(report)[1:]:
        if run["accuracy"]["mean"] is not None:
            ax.axhline(run["accuracy"]["mean"] * 100, color=colour, ls="--", label=f"{name} (sends nothing), final")
    ax.set_xlabel("learning bytes sent so far, all nodes (MiB)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{title}\none point per round; shaded: quartiles over nodes", fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return fig


def _bytes(report: dict[str, Any], title: str, plt):
    comm = report["comm"]
    discovery = comm["discovery"]
    families = (("learning", "-", comm["by_type"]), ("discovery", ":", discovery.get("by_type") or {}))
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for family, style, by_type in families:
        for kind, entry in by_type.items():
            so_far = np.array(entry.get("bytes_cumulative_per_round") or [], dtype=float) / MIB
            if so_far.size:
                curves.plot(np.arange(1, so_far.size + 1), so_far, ls=style, label=f"{kind} ({family})")
    _rounds_axis(curves)
    curves.set_ylabel("bytes sent so far, all nodes (MiB)")
    curves.set_title("per round, by type (dotted: discovery, up to the last round)", fontsize=9)
    if curves.get_legend_handles_labels()[0]:
        curves.legend(fontsize=8)
    names, sizes, colours = [], [], []
    for (_, _, by_type), colour in zip(families, ("tab:blue", "tab:gray"), strict=True):
        for kind, entry in by_type.items():
            names.append(kind)
            sizes.append(entry["bytes"] / MIB)
            colours.append(colour)
    bars.bar(names, sizes, color=colours)
    bars.set_ylabel("MiB sent, whole run")
    bars.set_title(
        f"totals: learning {comm['bytes'] / MIB:.2f} MiB (blue), discovery {discovery['bytes'] / MIB:.2f} MiB (grey)",
        fontsize=9,
    )
    bars.grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=9)
    return fig
