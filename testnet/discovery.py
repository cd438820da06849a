"""`p2pnode testnet --algorithm none`: launch daemons, watch them find each other, report.

t = 0 is when the first daemon is spawned, so `full_mesh_s` includes process start-up.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from .cluster import Cluster

__all__ = ["run_discovery_testnet"]


def _aggregate(statuses: list[dict | None]) -> dict:
    messages, byte_count, by_type = 0, 0, {}
    rejections: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    for status in statuses:
        if status is None:
            continue
        traffic = status["traffic"]
        messages += traffic["messages_out"]
        byte_count += traffic["bytes_out"]
        for kind, row in traffic["by_type"].items():
            entry = by_type.setdefault(kind, {"messages": 0, "bytes": 0})
            entry["messages"] += row["messages_out"]
            entry["bytes"] += row["bytes_out"]
        rejections.update(traffic["rejections"])
        dropped.update(traffic["send_dropped"])
    return {
        "comm": {"messages": messages, "bytes": byte_count, "by_type": dict(sorted(by_type.items()))},
        "rejections": dict(sorted(rejections.items())),
        "send_dropped": dict(sorted(dropped.items())),
    }


def run_discovery_testnet(
    out: Path,
    nodes: int,
    duration_s: float,
    *,
    exit_on_mesh: bool = False,
    poll_s: float = 0.5,
    progress=sys.stderr,
) -> tuple[int, dict]:
    """Returns (exit code, report). Exit code 0 iff every node knew all others within duration."""
    out.mkdir(parents=True, exist_ok=True)
    cluster = Cluster.prepare(out, nodes)
    report: dict = {"algorithm": "none", "nodes": nodes, "duration_s": duration_s, "out": str(out)}
    timeline = []
    full_mesh_s = all_up_s = None
    interrupted = False
    started = time.monotonic()
    with cluster:
        cluster.start_all()
        try:
            last_print = -1.0
            while (elapsed := time.monotonic() - started) < duration_s:
                statuses = cluster.statuses()
                up = [s for s in statuses if s is not None]
                counts = [s["peer_count"] for s in up]
                if all_up_s is None and len(up) == nodes:
                    all_up_s = elapsed
                if full_mesh_s is None and len(up) == nodes and min(counts) == nodes - 1:
                    full_mesh_s = elapsed
                row = [
                    round(elapsed, 2),
                    len(up),
                    min(counts, default=0),
                    round(statistics.fmean(counts), 2) if counts else 0.0,
                    max(counts, default=0),
                ]
                timeline.append(row)
                if elapsed - last_print >= 1.0 or full_mesh_s == elapsed:
                    last_print = elapsed
                    mesh = f"full mesh at {full_mesh_s:.1f} s" if full_mesh_s is not None else "full mesh: not yet"
                    print(
                        f"[{elapsed:5.1f} s] {len(up):>3}/{nodes} up  peers min {row[2]} mean {row[3]:.1f} max {row[4]}  {mesh}",
                        file=progress,
                        flush=True,
                    )
                if exit_on_mesh and full_mesh_s is not None:
                    break
                dead = [spec.index for spec in cluster.specs if not cluster.alive(spec)]
                if dead:
                    print(f"node(s) {dead} exited early; see their node.log", file=progress)
                    break
                time.sleep(max(0.0, poll_s - (time.monotonic() - started - elapsed)))
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: stopping every node", file=progress)
        final = cluster.statuses()
        exit_codes = cluster.stop()
    report.update(
        {
            "wall_time_s": round(time.monotonic() - started, 3),
            "discovery": {
                "full_mesh_s": None if full_mesh_s is None else round(full_mesh_s, 3),
                "all_up_s": None if all_up_s is None else round(all_up_s, 3),
                "peer_counts": [None if s is None else s["peer_count"] for s in final],
                "timeline": timeline,
            },
            **_aggregate(final),
            "node_exit_codes": [exit_codes.get(spec.index) for spec in cluster.specs],
            "nodes_detail": [
                {
                    "index": spec.index,
                    "node_id": spec.node_id,
                    "address": spec.address,
                    "log": str(spec.log_path),
                    "peer_count": None if s is None else s["peer_count"],
                    "messages_out": None if s is None else s["traffic"]["messages_out"],
                    "bytes_out": None if s is None else s["traffic"]["bytes_out"],
                    "rejections": None if s is None else s["traffic"]["rejections"],
                }
                for spec, s in zip(cluster.specs, final)
            ],
        }
    )
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    ok = full_mesh_s is not None and full_mesh_s <= duration_s and not interrupted
    verdict = (
        f"full mesh in {full_mesh_s:.1f} s" if full_mesh_s is not None else f"no full mesh within {duration_s:g} s"
    )
    print(f"{verdict}; report: {out / 'report.json'}", file=progress)
    return (130 if interrupted else 0 if ok else 1), report
