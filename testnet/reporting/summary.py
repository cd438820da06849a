"""`report.md`: one page a researcher can read at a glance and paste, drawn from report.json
alone (docs/learning.md, "Report"): the run, the final accuracy of each method with its interval,
every node, the learned graph, the traffic, the daemons that went down (a testnet's: churn,
restarts, exits), the plots and where the run came from.

Intervals (testnet/reporting/intervals.py): an accuracy carries its 95 % Wilson interval on the node's (or
all nodes') test images; a difference between methods its paired bootstrap interval over nodes.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .intervals import CONFIDENCE, SMALL_FLEET, wilson

__all__ = [
    "SUMMARY_NAME",
    "difference_text",
    "gap_share",
    "write_summary",
    "summary_page",
    "per_node_table",
    "methods_table",
]

SUMMARY_NAME = "report.md"
MAX_LISTED_NEIGHBOURS = 6  # more than this and the per-node table gives a count
INTERVALS_SAID = (
    'Intervals (docs/learning.md, "Intervals"): the Wilson interval covers the luck of the test '
    "images (all nodes' together here, each node's own in the table below), not that of training: "
    "another seed can move a figure further. A difference between methods is a paired bootstrap: "
    f"over the nodes, each with its pair of accuracies, from {SMALL_FLEET} nodes on; below that, over "
    "the test images, each with its pair of outcomes (the images' luck, not training's)."
)


def difference_text(difference: dict[str, Any] | None) -> str:
    """A paired difference (testnet/reporting/intervals.py `paired_difference`) in points, with its interval
    and what that interval rests on."""
    if difference is None:
        return "—"
    if difference.get("low") is None:
        return f"{difference['mean'] * 100:+.1f} points ({difference['method']})"
    interval = _interval(difference["low"], difference["high"], "+")
    return f"{difference['mean'] * 100:+.1f} points {interval} ({CONFIDENCE * 100:.0f} % {difference['method']})"


def gap_share(method: float, local: float, oracle: float) -> float | None:
    """How much of the Local→Oracle gap a method realises: (method − local) / (oracle − local)."""
    gap = oracle - local
    return None if abs(gap) < 1e-9 else (method - local) / gap


def write_summary(report: dict[str, Any], out: Path, plots: Sequence[str]) -> Path:
    path = out / SUMMARY_NAME
    path.write_text(summary_page(report, plots))
    return path


def summary_page(report: dict[str, Any], plots: Sequence[str] = ()) -> str:
    sections = [
        f"# {_title(report)}",
        _run(report),
        "## Final accuracy\n\n" + methods_table(report) + _gap(report) + "\n\n" + INTERVALS_SAID,
        *filter(None, [_gain(report)]),
        "## Per node\n\n" + per_node_table(report),
        *filter(None, [_per_node_rounds(report)]),
        _graph(report),
        _traffic(report),
        *filter(None, [_daemons(report), _restarted(report)]),
        "## Plots\n\n" + "\n".join(f"![{Path(name).stem}]({name})" for name in plots),
        _provenance(report),
    ]
    return "\n\n".join(sections) + "\n"


def _title(report: dict[str, Any]) -> str:
    scenario = "" if report["scenario"] is None else f" · scenario {report['scenario']}"
    return (
        f"{report['algorithm']} · {report['dataset']}{scenario} · {report['nodes']} nodes · {report['rounds']} rounds"
    )


def _known(value: Any) -> str:
    """A header figure, or a dash where the run does not know it (a deployment on its own data)."""
    return "—" if value is None else str(value)


def _verdict(check: dict[str, Any] | None) -> str:
    """What was judged and how it came out: `--check`'s thresholds only where they were asked
    for (without them a run is judged on every node finishing, and says so)."""
    if not check:
        return "not judged"
    if not check["passed"]:
        return "; ".join(check["failures"])
    thresholds = check.get("thresholds") or {}
    if not check.get("asked", any(thresholds.get(key) for key in ("accuracy", "within_cluster_mass"))):
        return "every node ran every round (no `--check`)"
    return (
        f"passed (`--check`: mean accuracy ≥ {thresholds['accuracy']:g}, "
        f"within-cluster mass ≥ {thresholds['within_cluster_mass']:g})"
    )


def _run(report: dict[str, Any]) -> str:
    rows = {
        "kind": report["kind"],
        "algorithm": report["algorithm"],
        "dataset · scenario · clusters": " · ".join(_known(report[key]) for key in ("dataset", "scenario", "clusters")),
        "nodes · rounds · seed": " · ".join(_known(report[key]) for key in ("nodes", "rounds", "seed")),
        "training / test images per class per node": " / ".join(
            _known(report[key]) for key in ("samples_per_class", "test_per_class")
        ),
        "backbones": ", ".join(sorted(set(report["backbones"]))),
        "poisoners": ", ".join(map(str, report.get("poisoners") or [])) or "none",
        "check": _verdict(report.get("check")),
        "wall time": f"{report['wall_s']:.0f} s",
    }
    slow = report.get("slow")
    if slow:  # `--slow`
        rows["slow nodes (local step ×)"] = f"{', '.join(map(str, slow['nodes']))} (×{slow['factor']:g})"
    reached = (report.get("time_to_accuracy") or {}).get("max")
    if reached is not None:
        clock = "simulated s" if report["kind"] == "simulation" else "s since its first round"
        rows["every node at its final accuracy by"] = f"{reached:.1f} {clock}"
    memory = _memory_spread(report)
    if memory:
        rows["daemon memory, MiB (after the run · peak)"] = memory
    notes = "".join(f"\n\nNote: {note}" for note in report.get("partition_notes") or [])
    return "## Run\n\n| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows.items()) + notes


def _memory_spread(report: dict[str, Any]) -> str:
    """The daemons' resident memory after the run and at its peak, median and max over daemons
    (empty for a simulation, which has no daemons)."""
    processes = report.get("processes") or {}
    spreads = []
    for key in ("rss_mb", "peak_rss_mb"):
        known = sorted(value for value in processes.get(key) or [] if value is not None)
        if not known:
            return ""
        spreads.append(f"median {statistics.median(known):.0f}, max {known[-1]:.0f}")
    return " · ".join(spreads)


def _daemon_memory(report: dict[str, Any], i: int) -> str | None:
    """Node i's resident memory after the run / at its peak, or None in a simulation."""
    processes = report.get("processes") or {}
    rss, peak = processes.get("rss_mb"), processes.get("peak_rss_mb")
    if rss is None or peak is None:
        return None
    return " / ".join("—" if value is None else f"{value:.0f}" for value in (rss[i], peak[i]))


def _methods(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, run) of the report's method and each baseline beside it."""
    return [(report["algorithm"], report), *report.get("baselines", {}).items()]


def methods_table(report: dict[str, Any]) -> str:
    """One row per method: the mean over nodes, the pooled accuracy with its Wilson interval, and
    the report's method minus each baseline with its paired bootstrap interval."""
    level = f"{CONFIDENCE * 100:.0f} %"
    rows = [
        f"| method | mean ± std over nodes | all test images | {level} Wilson | "
        f"{report['algorithm']} − method [{level} interval] |",
        "|---|---|---|---|---|",
    ]
    for name, run in _methods(report):
        accuracy = run["accuracy"]
        pooled = accuracy.get("pooled")
        mean = "—" if accuracy["mean"] is None else f"{accuracy['mean'] * 100:.1f} ± {accuracy['std'] * 100:.1f} %"
        counted = "—" if pooled is None else f"{pooled['correct']}/{pooled['n']} = {pooled['accuracy'] * 100:.1f} %"
        interval = "—" if pooled is None else _interval(pooled["low"], pooled["high"])
        delta = "—" if run is report else difference_text(run.get("difference"))
        rows.append(f"| {name} | {mean} | {counted} | {interval} | {delta} |")
    return "\n".join(rows)


def _gap(report: dict[str, Any]) -> str:
    baselines = report.get("baselines", {})
    if not {"local", "oracle"} <= set(baselines) or report["accuracy"]["mean"] is None:
        return ""
    share = gap_share(
        report["accuracy"]["mean"], baselines["local"]["accuracy"]["mean"], baselines["oracle"]["accuracy"]["mean"]
    )
    said = "Local and Oracle are level" if share is None else f"{share * 100:.0f} %"
    return f"\n\nShare of the Local → Oracle gap that {report['algorithm']} realises: {said}."


def per_node_table(report: dict[str, Any]) -> str:
    """Each node's final accuracy under every method, with its Wilson interval on the node's test
    images; a last row with the mean over nodes."""
    methods = _methods(report)
    level = f"{CONFIDENCE * 100:.0f} %"
    daemons = _daemon_memory(report, 0) is not None  # a testnet: each node's memory, MiB
    # which of its predictors each node serves, where it has several (MAPL-Dual, MAPL-Auto)
    served = report["accuracy"].get("predictor_per_node") or []
    served = served if any(served) else []
    # ... and why, where it chose on images it held out (MAPL-Auto)
    reasons = report["accuracy"].get("predictor_why_per_node") or [None] * len(served)
    rows = [
        "| node | backbone | classes | neighbours (w > 0) | "
        + ("predicts with | " if served else "")
        + ("RSS / peak MiB | " if daemons else "")
        + " | ".join(f"{name} [{level} Wilson]" for name, _ in methods)
        + " |",
        "|---|---|---|---|" + "---|" * (len(methods) + daemons + bool(served)),
    ]
    sizes = [run["accuracy"].get("test_samples_per_node") or [None] * report["nodes"] for _, run in methods]
    for i in range(report["nodes"]):
        cells = [
            _node_accuracy(run["accuracy"]["per_node"][i], n[i]) for (_, run), n in zip(methods, sizes, strict=True)
        ]
        classes = _classes(report, i)
        memory = f"{_daemon_memory(report, i)} | " if daemons else ""
        predictor = f"{reasons[i] or served[i] or '—'} | " if served else ""
        rows.append(
            f"| {i} | {report['backbones'][i]} | {classes} | {_neighbours(report, i)} | {predictor}{memory}"
            f"{' | '.join(cells)} |"
        )
    means = ["—" if run["accuracy"]["mean"] is None else f"{run['accuracy']['mean'] * 100:.1f} %" for _, run in methods]
    rows.append(f"| mean | | | | {'| ' if served else ''}{'| ' if daemons else ''}{' | '.join(means)} |")
    return "\n".join(rows)


def _classes(report: dict[str, Any], node: int) -> str:
    """A node's classes: by name where the report has them (one's own data), else their ids."""
    names, ids = report.get("class_names"), report["node_classes"][node]
    if names:
        return ", ".join(names[k] if 0 <= k < len(names) else str(k) for k in ids)
    return "".join(map(str, ids))


def _node_accuracy(accuracy: float | None, n: int | None) -> str:
    if accuracy is None:
        return "—"
    if not n:
        return f"{accuracy * 100:.1f} %"
    return f"{accuracy * 100:.1f} % {_interval(*wilson(round(accuracy * n), n))}"


def _neighbours(report: dict[str, Any], i: int) -> str:
    listed = [str(j) for j, w in enumerate(report["graph"]["W"][i]) if w > 0 and j != i]
    return ", ".join(listed) if len(listed) <= MAX_LISTED_NEIGHBOURS else f"{len(listed)} nodes"


def _graph(report: dict[str, Any]) -> str:
    graph = report["graph"]
    if graph["W_true"] is None:
        return _graph_without_truth(report)
    return (
        "## Collaboration graph\n\n"
        f"- within-cluster mass (mean weight a row puts on its own true cluster, itself included): "
        f"{graph['within_cluster_mass']:.3f}\n"
        f"- L1 to the true W* (mean over rows): {graph['l1_to_truth']:.3f}\n"
        f"- Louvain communities of the learned W: {graph['communities']} against the true clusters "
        f"{graph['clusters']}: adjusted Rand index {graph['community_agreement']:.2f}"
    )


MAX_MATRIX_NODES = 12  # more than this and the learned W is left to graph.png


def _graph_without_truth(report: dict[str, Any]) -> str:
    """The learned graph where the truth is unknown: the communities found and, for a few nodes,
    the learned W itself (row i: the weights node i gave in its last round)."""
    w = report["graph"]["W"]
    lines = [
        "## Collaboration graph",
        "The true clusters and W* are unknown here (each node's own data): no within-cluster mass, "
        "L1 to the truth or community agreement is given.",
        f"- Louvain communities of the learned W: {report['graph']['communities']}",
    ]
    if len(w) <= MAX_MATRIX_NODES:
        header = "| node i · w_ij | " + " | ".join(str(j) for j in range(len(w))) + " |"
        rows = [f"| {i} | " + " | ".join(f"{v:.2f}" for v in row) + " |" for i, row in enumerate(w)]
        lines.append("\n".join([header, "|---|" + "---|" * len(w), *rows]))
    return "\n\n".join(lines)


def _gain(report: dict[str, Any]) -> str:
    """What collaboration gained over the local baseline each node trained beside it
    (`[algorithm].local_baseline`), per node and overall; empty without one."""
    gain = report.get("local_baseline_gain")
    if not gain:
        return ""
    rows = [
        f"| node | held-out images | {report['algorithm']} | local baseline | gained, points |",
        "|---|---|---|---|---|",
    ]
    for entry in gain["per_node"]:
        if entry["gain"] is None:
            rows.append(f"| {entry['node']} | {_known(entry['n'])} | — | — | — |")
            continue
        rows.append(
            f"| {entry['node']} | {_known(entry['n'])} | {_node_accuracy(entry['collaborative'], entry['n'])} | "
            f"{_node_accuracy(entry['local'], entry['n'])} | {entry['gain'] * 100:+.1f} |"
        )
    difference = gain["difference"]
    overall = (
        "no node has both accuracies"
        if difference is None
        else f"collaboration gained {difference_text(difference)}, the mean over {difference['nodes']} nodes"
    )
    per_node = [
        f"- node {e['node']}: collaboration gained {e['gain'] * 100:+.1f} points here"
        for e in gain["per_node"]
        if e["gain"] is not None
    ]
    notes = "".join(f"\n\nNote: {note}" for note in gain.get("notes") or [])
    return (
        "## What collaboration gained\n\n"
        f"Each node trained a local-only model beside {report['algorithm']} on the same data and split "
        "(`[algorithm].local_baseline`); both evaluated in the node's last round on its held-out images.\n\n"
        f"Overall: {overall}.\n\n" + "\n".join(per_node) + "\n\n" + "\n".join(rows) + notes
    )


MAX_ROUND_ROWS = 20  # a longer run shows every k-th round and the last


def _per_node_rounds(report: dict[str, Any]) -> str:
    """Each node's accuracy over the rounds (a deployment's report has it), thinned to a table."""
    table = report.get("accuracy_per_node_per_round")
    if not table:
        return ""
    rounds = table["rounds"]
    step = max(1, -(-len(rounds) // MAX_ROUND_ROWS))
    shown = sorted({*range(0, len(rounds), step), len(rounds) - 1}) if rounds else []
    baseline = table.get("local_baseline")
    nodes = range(len(table["per_node"]))
    header = "| round | " + " | ".join(f"node {i}" + (" (local)" if baseline else "") for i in nodes) + " |"
    rows = [header, "|---|" + "---|" * len(nodes)]
    for k in shown:
        cells = []
        for i in nodes:
            accuracy = table["per_node"][i][k]
            cell = "—" if accuracy is None else f"{accuracy * 100:.1f} %"
            if baseline:
                local = baseline[i][k]
                cell += "" if local is None else f" ({local * 100:.1f} %)"
            cells.append(cell)
        rows.append(f"| {rounds[k]} | " + " | ".join(cells) + " |")
    said = "; in brackets the local baseline's" if baseline else ""
    names = ", ".join(f"{i} = `{node_id}`" for i, node_id in enumerate(report["node_ids"]))
    return f"## Accuracy per round, per node\n\nOn each node's held-out images{said}. Nodes: {names}.\n\n" + "\n".join(
        rows
    )


def _traffic(report: dict[str, Any]) -> str:
    comm = report["comm"]
    families = (("learning", comm["by_type"]), ("discovery", comm["discovery"].get("by_type") or {}))
    rows = ["| type | family | messages | MiB |", "|---|---|---|---|"]
    for family, by_type in families:
        for kind, entry in by_type.items():
            rows.append(f"| {kind} | {family} | {entry['messages']} | {entry['bytes'] / 2**20:.2f} |")
    rows.append(f"| all learning | | {comm['messages']} | {comm['bytes'] / 2**20:.2f} |")
    discovery = comm["discovery"]
    rows.append(f"| all discovery | | {discovery['messages']} | {discovery['bytes'] / 2**20:.2f} |")
    overhead = comm["envelope_overhead"]
    after = "" if overhead is None else f"\n\nLearning frames are {overhead:.3f} × the tensor bytes they carry."
    return "## Traffic (sent, all nodes)\n\n" + "\n".join(rows) + after


def _daemons(report: dict[str, Any]) -> str:
    """A testnet's daemons that went down during the run, in the order they did: stopped by
    `--churn`, died and started again by `--restart`, or died and stayed down (docs/daemon.md,
    "Churn" and "Restarts"). Empty if none did, and for a simulation."""
    processes = report.get("processes") or {}
    rows = []
    for event in (processes.get("churn") or {}).get("events") or []:
        rows.append((event["killed_s"], event, f"stopped by --churn ({event['signal']})"))
    for event in (processes.get("restarts") or {}).get("events") or []:
        rows.append((event["exited_s"], event, f"died ({_ended(event)}); restart {event['restart']}"))
    for entry in processes.get("exits") or []:
        after = f" after {entry['restarts']} restarts" if entry.get("restarts") else ""
        rows.append((entry["exited_s"], entry, f"died ({_ended(entry)}){after}; stayed down"))
    if not rows:
        return ""
    lines = ["| at, s | node | what | back after, s | resumed after round |", "|---|---|---|---|---|"]
    for at, event, what in sorted(rows, key=lambda row: row[0]):
        back = "—" if event.get("back_after_s") is None else f"{event['back_after_s']:.1f}"
        resumed = event.get("resumed_from")
        lines.append(f"| {at:.1f} | {event['node']} | {what} | {back} | {'—' if resumed is None else resumed} |")
    return "## Daemons down during the run\n\n" + "\n".join(lines)


def _restarted(report: dict[str, Any]) -> str:
    """A deployment's nodes that started again, from their histories' start lines: each time,
    the round it resumed after (its checkpoint's). Empty if none did."""
    restarted = (report.get("processes") or {}).get("restarted_after") or []
    rows = [
        f"| {node} | {', '.join('the beginning' if r is None else f'round {r}' for r in rounds)} |"
        for node, rounds in enumerate(restarted)
        if rounds
    ]
    if not rows:
        return ""
    head = "## Nodes restarted during the run\n\nWhat each sent before a restart is counted in the traffic.\n\n"
    return head + "| node | started again, resuming after |\n|---|---|\n" + "\n".join(rows)


def _ended(event: dict[str, Any]) -> str:
    return event.get("signal") or f"exit code {event['exit_code']}"


def _provenance(report: dict[str, Any]) -> str:
    made = report.get("provenance") or {}
    git = made.get("git")
    code = "not a git checkout" if git is None else f"{git['commit']}{' (uncommitted changes)' if git['dirty'] else ''}"
    packages = ", ".join(f"{name} {version}" for name, version in (made.get("packages") or {}).items() if version)
    lines = [
        f"- started {made.get('started_utc')} on {made.get('host')} ({made.get('platform')}, "
        f"{made.get('cpu_count')} CPUs), device {made.get('device')}",
        f"- command: `{' '.join(made.get('command') or [])}`",
        f"- code: {code}",
        f"- Python {made.get('python')}; {packages}",
    ]
    config = json.dumps(report.get("config"), indent=1)
    details = (
        f"<details><summary>configuration of {report['algorithm']}</summary>\n\n```json\n{config}\n```\n</details>"
    )
    return "## Provenance\n\n" + "\n".join(lines) + "\n\n" + details


def _interval(low: float, high: float, sign: str = "") -> str:
    """[low, high] in percent (points, with sign="+")."""
    return f"[{low * 100:{sign}.1f}, {high * 100:{sign}.1f}]"
