"""`p2pnode testnet --algorithm none`: launch daemons, watch them find each other, report.

t = 0 is when the first daemon is spawned, so `full_mesh_s` and `target_s` include process
start-up. A node's target is its active view, or all other nodes if there are fewer
(`[discovery].active_view`, docs/daemon.md): for N ≤ active_view + 1 that is the full mesh.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..reporting.overlay import at_target, resources, shape, steady_rates
from .churn import ChurnSpec, RestartPolicy, Supervisor
from .cluster import Cluster
from .placement import Placement

__all__ = ["run_discovery_testnet", "crowded_settings", "CROWDED", "CROWDED_PER_CORE"]

# Past this many daemons per core a testnet's daemons get CROWDED's settings, unless the caller
# sets them (issue #28: with the daemon's defaults, 100 daemons on 2 cores ended in 10 to 23
# components and 8 to 18 daemons without a peer, while the benchmark's settings held).
CROWDED_PER_CORE = 8
# Liveness every 5 s (timeout 15 s) rather than every second: on 2 cores each frame a daemon
# sends or receives costs it ~2 ms of CPU, and 100 daemons pinging 9 peers every second would
# need 3.6 cores for liveness alone. Unanswered challenges repeated from 0.5 s, not 0.05: on a
# saturated machine answers take seconds, and quick repeats only added load (47k HELLOs in one
# 100-daemon join). A bounded view of 8 (at most 10 peers) instead of 64. The process's size
# looked at every 200 ms, not 20: from 1 % of a core per idle daemon to 0.1 %.
CROWDED = {
    "discovery": {
        "active_view": 8,
        "max_peers": 10,
        "ping_interval_s": 5.0,
        "peer_timeout_s": 15.0,
        "dial_retry_initial_s": 0.5,
    },
    "transport": {"growth_check_ms": 200},
}


def crowded_settings(
    nodes: int, settings: dict[str, dict] | None, cores: int | None = None, progress=None
) -> tuple[dict[str, dict], dict[str, dict]]:
    """(the settings every daemon gets, the crowded defaults among them): `settings` as given,
    and for more than CROWDED_PER_CORE daemons per core CROWDED's under them (what `settings`
    names wins, key by key), said on `progress` if given."""
    settings = settings or {}
    cores = cores or os.cpu_count() or 1
    if nodes <= CROWDED_PER_CORE * cores:
        return settings, {}
    chosen = {
        section: {key: value for key, value in table.items() if key not in settings.get(section, {})}
        for section, table in CROWDED.items()
    }
    merged = {section: {**chosen.get(section, {}), **settings.get(section, {})} for section in {*settings, *chosen}}
    said = ", ".join(f"{section}.{key}={value}" for section, table in chosen.items() for key, value in table.items())
    if progress is not None and said:
        print(f"{nodes} daemons on {cores} cores: crowded settings {said} (--daemon overrides)", file=progress)
    return merged, {section: table for section, table in chosen.items() if table}


# Steady-state rates are measured from the first poll this long after every view reached its
# target (the last redirects and handshakes are over by then) to the end of the run.
STEADY_AFTER_S = 5.0


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


@dataclass
class _Watch:
    """What the launcher saw while the daemons found each other: a row per poll (elapsed s, nodes
    up, peers min / mean / max), when all were up, when every node knew every other, when every
    view was at its target, and the statuses the steady-state rates are measured from."""

    nodes: int
    timeline: list[list[float]] = field(default_factory=list)
    all_up_s: float | None = None
    full_mesh_s: float | None = None
    target_s: float | None = None
    steady_from: list[dict | None] | None = None
    _last_print: float = -1.0

    def poll(self, statuses: list[dict | None], elapsed: float, progress) -> bool:
        """Record one poll; returns whether every node's view is at its target now."""
        up = [s for s in statuses if s is not None]
        counts = [s["peer_count"] for s in up]
        if self.all_up_s is None and len(up) == self.nodes:
            self.all_up_s = elapsed
        full_mesh = len(up) == self.nodes and min(counts) == self.nodes - 1
        if self.full_mesh_s is None and full_mesh:
            self.full_mesh_s = elapsed
        targets = at_target(statuses)
        if self.target_s is None and targets:
            self.target_s = elapsed
        if self.steady_from is None and self.target_s is not None and elapsed >= self.target_s + STEADY_AFTER_S:
            self.steady_from = statuses
        mean = round(statistics.fmean(counts), 2) if counts else 0.0
        row = [round(elapsed, 2), len(up), min(counts, default=0), mean, max(counts, default=0)]
        self.timeline.append(row)
        if elapsed - self._last_print >= 1.0 or self.target_s == elapsed:
            self._last_print = elapsed
            mesh = "full mesh: not yet" if self.full_mesh_s is None else f"full mesh at {self.full_mesh_s:.1f} s"
            if self.nodes - 1 > max((s["active_view"] for s in up), default=self.nodes):
                mesh = (
                    "views at target: not yet" if self.target_s is None else f"views at target at {self.target_s:.1f} s"
                )
            peers = f"peers min {row[2]} mean {row[3]:.1f} max {row[4]}"
            print(f"[{elapsed:5.1f} s] {len(up):>3}/{self.nodes} up  {peers}  {mesh}", file=progress, flush=True)
        return targets


def run_discovery_testnet(
    out: Path,
    nodes: int,
    duration_s: float,
    *,
    exit_on_mesh: bool = False,
    hold_s: float = 0.0,
    churn: ChurnSpec | None = None,
    keep_going: bool = False,
    restart: RestartPolicy | None = None,
    seed: int = 0,
    poll_s: float | None = None,
    settings: dict[str, dict] | None = None,
    progress=None,
    placement: Placement | None = None,
) -> tuple[int, dict]:
    """Returns (exit code, report). Exit code 0 iff every node's view reached its target (for
    N ≤ active_view + 1: every node knew all others) within the duration, the overlay was
    connected at the end, no daemon exited on its own (and stayed down: `restart` starts one that
    died again, testnet/launch/churn.py), and every daemon stopped by `churn` or restarted was back with
    every view at target before the end (churn stops none in the last `every` seconds). With
    `exit_on_mesh` the run stops `hold_s` after every view reached its target (steady-state rates
    need more than STEADY_AFTER_S; a 100-daemon join under load took 30 s to 2 minutes after the
    last daemon was up). `settings`: config sections of every node (e.g. `{"discovery":
    {"active_view": 8}}`), over `crowded_settings`'; `placement` runs the daemons (default: here)."""
    progress = progress or sys.stderr  # the stream of the moment, not the one at import (tests swap it)
    # Each poll asks every daemon for its status: 0.5 s apart, or 1 s per 50 daemons.
    poll_s = poll_s if poll_s is not None else max(0.5, nodes / 50)
    out.mkdir(parents=True, exist_ok=True)
    settings, crowded = crowded_settings(nodes, settings, progress=progress)
    cluster = Cluster.prepare(out, nodes, extra=settings, placement=placement)
    cluster.place()  # before t = 0: a Ray cluster starts its launchers here
    watch = _Watch(nodes)
    started = time.monotonic()
    supervisor = Supervisor(
        cluster,
        churn,
        seed=seed,
        keep_going=keep_going,
        started=started,
        last_stop_s=duration_s - churn.every_s if churn else float("inf"),
        restart=restart,
        progress=progress,
    )
    with cluster:
        cluster.start_all()
        interrupted = _watch_run(cluster, watch, supervisor, duration_s, exit_on_mesh, hold_s, poll_s, progress)
        final = cluster.statuses()
        exit_codes = cluster.stop()
    report = _report(out, cluster, watch, final, exit_codes, duration_s, time.monotonic() - started)
    report.update(supervisor.report())
    report["crowded_settings"] = crowded
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    ok, verdict = _verdict(watch, supervisor, report["discovery"]["overlay"], duration_s)
    print(f"{verdict}; report: {out / 'report.json'}", file=progress)
    return (130 if interrupted else 0 if ok else 1), report


def _verdict(watch: _Watch, supervisor: Supervisor, overlay: dict, duration_s: float) -> tuple[bool, str]:
    """Whether the run passed (see run_discovery_testnet), and the line that says so."""
    target_s, connected = watch.target_s, overlay["connected"]
    unhealed = supervisor.unhealed("mesh_s")
    ok = target_s is not None and target_s <= duration_s and connected and not supervisor.exits and not unhealed
    if watch.full_mesh_s is not None:
        verdict = f"full mesh in {watch.full_mesh_s:.1f} s"
    elif target_s is not None:
        verdict = f"every view at target in {target_s:.1f} s"
    else:
        verdict = f"views not at target within {duration_s:g} s"
    verdict += "; overlay " + (f"connected, diameter {overlay['diameter']}" if connected else "NOT connected")
    churned = {event["node"] for event in supervisor.events}
    if churned:
        verdict += f"; {len(churned - set(unhealed))} of {len(churned)} churned nodes back in it"
    if supervisor.restarts:
        restarted = sorted({event["node"] for event in supervisor.restarts})
        back = "back in it" if not set(restarted) & set(unhealed) else "not all back in it"
        verdict += f"; {len(supervisor.restarts)} restart(s) of node(s) {restarted}, {back}"
    if supervisor.exits:
        verdict += f"; node(s) {[entry['node'] for entry in supervisor.exits]} exited on their own"
    return ok, verdict


def _watch_run(
    cluster: Cluster,
    watch: _Watch,
    supervisor: Supervisor,
    duration_s: float,
    exit_on_mesh: bool,
    hold_s: float,
    poll_s: float,
    progress,
) -> bool:
    """Poll until the duration is over (or every view is at target, with `exit_on_mesh`, and
    churn is over with every node back); returns whether the user interrupted."""
    started = supervisor.started
    try:
        while (elapsed := time.monotonic() - started) < duration_s:
            statuses = cluster.statuses()
            if watch.poll(statuses, elapsed, progress):
                supervisor.stamp("mesh_s")  # the restarted nodes are back, every view at target
            if watch.all_up_s is not None:
                supervisor.arm()
            healed = not supervisor.unhealed("mesh_s")
            held = watch.target_s is not None and elapsed >= watch.target_s + hold_s
            if exit_on_mesh and held and supervisor.done() and healed:
                break
            if not supervisor.poll(statuses):
                break
            time.sleep(max(0.0, poll_s - (time.monotonic() - started - elapsed)))
    except KeyboardInterrupt:
        print("interrupted: stopping every node", file=progress)
        return True
    return False


def _report(
    out: Path,
    cluster: Cluster,
    watch: _Watch,
    final: list[dict | None],
    exit_codes: dict[int, int | None],
    duration_s: float,
    wall_s: float,
) -> dict:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "algorithm": "none",
        "engine": cluster.placement.engine,
        "nodes": watch.nodes,
        "duration_s": duration_s,
        "out": str(out),
        "wall_time_s": round(wall_s, 3),
        "discovery": {
            "full_mesh_s": rounded(watch.full_mesh_s),
            "target_s": rounded(watch.target_s),
            "all_up_s": rounded(watch.all_up_s),
            "active_view": [None if s is None else s["active_view"] for s in final],
            "peer_counts": [None if s is None else s["peer_count"] for s in final],
            # What each node says of being reachable at its address (discovery/reachability.py).
            "reachability": [None if s is None else (s.get("reachability") or {}).get("state") for s in final],
            "overlay": shape(final),
            "steady": None if watch.steady_from is None else steady_rates(watch.steady_from, final),
            "timeline": watch.timeline,
        },
        "resources": resources(final),
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
            for spec, s in zip(cluster.specs, final, strict=True)
        ],
    }
