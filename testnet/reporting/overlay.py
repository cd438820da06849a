"""The overlay the daemons of a discovery testnet built, from their statuses: whether every
view is at its target, the graph of their peer tables (networkx: connected, diameter, degrees),
and what each daemon spends in steady state (frames, bytes, CPU) between two polls."""

from __future__ import annotations

import statistics
from collections import Counter

__all__ = ["LIVENESS_TYPES", "at_target", "target_of", "shape", "steady_rates", "resources"]

LIVENESS_TYPES = ("PING", "PONG")  # what keeping the active view alive costs


def target_of(status: dict, nodes: int) -> int:
    """The peers a node can have: what it seeks (`active_view`), or everyone else if fewer."""
    return min(status["active_view"], nodes - 1)


def at_target(statuses: list[dict | None]) -> bool:
    """Every node answers and has at least as many peers as it seeks."""
    nodes = len(statuses)
    return all(s is not None and s["peer_count"] >= target_of(s, nodes) for s in statuses)


def shape(statuses: list[dict | None]) -> dict:
    """The overlay of the nodes' peer tables: an edge where either side lists the other (and
    how many are listed by both), whether it is connected, its diameter (null if not), and the
    distribution of the nodes' peer counts."""
    import networkx as nx  # only reports need it

    graph = nx.Graph()
    listed: Counter[frozenset] = Counter()
    for status in statuses:
        if status is None:
            continue
        graph.add_node(status["node_id"])
        for peer in status["peers"]:
            listed[frozenset((status["node_id"], peer["node_id"]))] += 1
            graph.add_edge(status["node_id"], peer["node_id"])
    connected = graph.number_of_nodes() > 0 and nx.is_connected(graph)
    degrees = [s["peer_count"] for s in statuses if s is not None]
    return {
        "nodes": graph.number_of_nodes(),
        "edges": graph.number_of_edges(),
        "mutual_edges": sum(count == 2 for count in listed.values()),
        "connected": connected,
        "components": nx.number_connected_components(graph) if graph.number_of_nodes() else 0,
        "diameter": nx.diameter(graph) if connected else None,
        "average_shortest_path": round(nx.average_shortest_path_length(graph), 3) if connected else None,
        "degree_distribution": {str(d): n for d, n in sorted(Counter(degrees).items())},
        "degree_min": min(degrees, default=None),
        "degree_mean": round(statistics.fmean(degrees), 2) if degrees else None,
        "degree_max": max(degrees, default=None),
    }


def _sent(status: dict, kinds: tuple[str, ...] | None) -> tuple[int, int]:
    rows = status["traffic"]["by_type"]
    chosen = [row for kind, row in rows.items() if kinds is None or kind in kinds]
    return sum(row["messages_out"] for row in chosen), sum(row["bytes_out"] for row in chosen)


def _summary(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def steady_rates(before: list[dict | None], after: list[dict | None]) -> dict | None:
    """Per node, per second of its own uptime between the two polls: liveness frames and bytes
    sent (PING, PONG), all discovery frames and bytes sent, and CPU seconds (a share of one
    core); mean, min and max over the nodes that answered both times. None if none did."""
    per_node: dict[str, list[float]] = {key: [] for key in ("liveness", "liveness_bytes", "frames", "bytes", "cpu")}
    for old, new in zip(before, after, strict=True):
        if old is None or new is None or new["pid"] != old["pid"]:
            continue
        seconds = new["uptime_s"] - old["uptime_s"]
        if seconds <= 0:
            continue
        for key, kinds in (("liveness", LIVENESS_TYPES), ("frames", None)):
            (frames_new, bytes_new), (frames_old, bytes_old) = _sent(new, kinds), _sent(old, kinds)
            per_node[key].append((frames_new - frames_old) / seconds)
            per_node["liveness_bytes" if key == "liveness" else "bytes"].append((bytes_new - bytes_old) / seconds)
        per_node["cpu"].append((new["cpu_s"] - old["cpu_s"]) / seconds)
    if not per_node["cpu"]:
        return None
    names = {
        "liveness": "liveness_frames_per_s",
        "liveness_bytes": "liveness_bytes_per_s",
        "frames": "frames_per_s",
        "bytes": "bytes_per_s",
        "cpu": "cpu_share",
    }
    return {"nodes": len(per_node["cpu"]), **{names[key]: _summary(values) for key, values in per_node.items()}}


def resources(statuses: list[dict | None]) -> dict:
    """Each daemon's CPU seconds since it started and its resident memory now and at its peak
    (MiB), as its last status gave them, with their mean and max."""
    out: dict = {}
    for key in ("cpu_s", "rss_mb", "peak_rss_mb"):
        values = [None if s is None else s.get(key) for s in statuses]
        known = [v for v in values if v is not None]
        out[key] = values
        out[f"{key}_mean"] = round(statistics.fmean(known), 2) if known else None
        out[f"{key}_max"] = max(known, default=None)
    out["ingress_rss_mb"] = [ingress_rss_mb(s) for s in statuses]
    out["ingress_restarts"] = [ingress_restarts(s) for s in statuses]
    return out


def ingress_rss_mb(status: dict | None) -> float | None:
    """The resident memory (MiB) of a daemon's inbound sockets' processes (p2pnode/wire/inbound/):
    beside the daemon's own, what it holds in all; None from a status without them."""
    processes = (status or {}).get("ingress") or {}
    sizes = [process.get("rss_mb") for process in processes.values()]
    return round(sum(size for size in sizes if size is not None), 1) if processes else None


def ingress_restarts(status: dict | None) -> int | None:
    """How often a daemon's inbound sockets' processes were started again (libzmq aborted them)."""
    processes = (status or {}).get("ingress") or {}
    return sum(process["restarts"] for process in processes.values()) if processes else None
