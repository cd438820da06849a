"""Discovery at scale (issue #16, BENCHMARKS.md "Scaling: discovery"): one discovery testnet of
real daemons per network size, every daemon with the same bounded view, and a table of what
each costs.

    python -m tools.bench.scale --out bench-out/scale [--nodes 10 30 100] [--active-view 8]
                                [--max-peers 10] [--duration S] [--hold S] [--save scale]

For each N (a testnet that stops `--hold` seconds after every view reached its target, or at
`--duration`): seconds until every view was at its target, the overlay's shape (connected,
diameter, degrees, from the daemons' peer tables with networkx), and per daemon in steady
state (from 5 s after the target was reached to the end) liveness frames/s (PING + PONG), all
discovery frames/s and bytes/s sent, CPU (share of one core); then CPU seconds since start and
resident memory (now, peak) from each daemon's last status. The load average is taken before
and after each run: on a shared machine it says what else was running. `--save NAME` writes the
rows to tools/bench/results/NAME.json; its provenance lists every setting the daemons get that a
user's do not: the bounded view and the crowded testnet's liveness and memory-poll settings, at
every N.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from testnet.launch.discovery import CROWDED

from .results import capture, save

RSS_LIMIT_MB = 60  # issue #16: no daemon above this without learning
# The crowded testnet's liveness and memory-poll settings (testnet/launch/discovery.py says why), at
# every N: the same, whether or not N is past the crowding a testnet chooses them at.
LIVENESS = {key: CROWDED["discovery"][key] for key in ("ping_interval_s", "peer_timeout_s", "dial_retry_initial_s")}
TRANSPORT = dict(CROWDED["transport"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/scale")
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 30, 100])
    parser.add_argument("--active-view", type=int, default=8)
    parser.add_argument("--max-peers", type=int, default=10)
    parser.add_argument("--duration", type=float, help="at most this many seconds per testnet (default: 60 + 5 N)")
    parser.add_argument("--hold", type=float, default=30.0, help="stop this long after every view reached its target")
    parser.add_argument("--save", metavar="NAME", help="write the rows to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    words = ["python", "-m", "tools.bench.scale", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, settings=settings(args.active_view, args.max_peers)) as provenance:
        rows = []
        for nodes in args.nodes:
            duration = args.duration or 60.0 + 5.0 * nodes
            out = Path(args.out, f"n{nodes}")
            rows.append(_run(nodes, args.active_view, args.max_peers, duration, args.hold, out))
            Path(args.out, "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(render({"data": {"hold_s": args.hold, "rows": rows}}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.scale', provenance, {'hold_s': args.hold, 'rows': rows})}")
    failed = [row["nodes"] for row in rows if not row["ok"]]
    if failed:
        print(f"not every view at target, or the overlay not connected, for N = {failed}", file=sys.stderr)
    heavy = [row["nodes"] for row in rows if row["peak_rss_mb_max"] > RSS_LIMIT_MB]
    if heavy:
        print(f"a daemon above {RSS_LIMIT_MB} MiB resident for N = {heavy}", file=sys.stderr)
    return 1 if failed or heavy else 0


def settings(active_view: int, max_peers: int) -> dict:
    """Every daemon setting the benchmark sets, as "section.key": value (a user's daemon has a
    view of 64, liveness every second and its own memory poll: docs/config.md)."""
    views = {"active_view": active_view, "max_peers": max_peers, **LIVENESS}
    return {
        **{f"discovery.{key}": value for key, value in views.items()},
        **{f"transport.{key}": value for key, value in TRANSPORT.items()},
    }


def _run(nodes: int, active_view: int, max_peers: int, duration: float, hold: float, out: Path) -> dict:
    from testnet.launch.discovery import run_discovery_testnet

    load_before = os.getloadavg()
    views = {"active_view": active_view, "max_peers": max_peers, **LIVENESS}
    settings = {"discovery": views, "transport": TRANSPORT}
    code, report = run_discovery_testnet(out, nodes, duration, exit_on_mesh=True, hold_s=hold, settings=settings)
    discovery, resources = report["discovery"], report["resources"]
    return {
        "nodes": nodes,
        "active_view": active_view,
        "max_peers": max_peers,
        **LIVENESS,
        **TRANSPORT,
        "duration_s": duration,
        "wall_time_s": report["wall_time_s"],
        "ok": code == 0,
        "all_up_s": discovery["all_up_s"],
        "target_s": discovery["target_s"],
        "overlay": discovery["overlay"],
        "steady": discovery["steady"],
        "cpu_s_mean": resources["cpu_s_mean"],
        "cpu_s_max": resources["cpu_s_max"],
        "rss_mb_mean": resources["rss_mb_mean"],
        "rss_mb_max": resources["rss_mb_max"],
        "peak_rss_mb_max": resources["peak_rss_mb_max"],
        "load_average": [round(x, 2) for x in (*load_before, *os.getloadavg())],
    }


def render(result: dict) -> str:
    """BENCHMARKS.md's table: one row per N."""
    rows = result["data"]["rows"]
    lines = [
        "| N | view (active / max) | all up, s | every view at target, s | connected, diameter | "
        "degrees min / mean / max | liveness frames/s per node | frames/s per node | bytes/s per node | "
        "CPU per daemon, steady | CPU s per daemon (mean / max) | RSS MiB (mean / max; peak max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        overlay, steady = row["overlay"], row["steady"] or {}

        target = "never" if row["target_s"] is None else f"{row['target_s']:.1f}"
        up = "not all" if row["all_up_s"] is None else f"{row['all_up_s']:.1f}"
        shape = f"{'yes' if overlay['connected'] else 'NO'}, {overlay['diameter']}"
        degrees = f"{overlay['degree_min']} / {overlay['degree_mean']} / {overlay['degree_max']}"
        cpu = f"{100 * steady['cpu_share']['mean']:.1f} %" if steady else "-"
        rss = f"{row['rss_mb_mean']:.1f} / {row['rss_mb_max']:.1f}; {row['peak_rss_mb_max']:.1f}"
        lines.append(
            f"| {row['nodes']} | {row['active_view']} / {row['max_peers']} | {up} | {target} | "
            f"{shape} | {degrees} | {_mean(steady, 'liveness_frames_per_s')} | {_mean(steady, 'frames_per_s')} | "
            f"{_mean(steady, 'bytes_per_s', 0)} | {cpu} | {row['cpu_s_mean']:.1f} / {row['cpu_s_max']:.1f} | {rss} |"
        )
    lines += [
        "",
        f"Each testnet stopped {result['data']['hold_s']:g} s after every view was at its target, or at its "
        "duration (60 s + 5 s per daemon); rates in steady state, from 5 s after the target to the end, sent.",
    ]
    return "\n".join(lines)


def _mean(steady: dict, key: str, digits: int = 1) -> str:
    return f"{steady[key]['mean']:.{digits}f}" if key in steady else "-"


if __name__ == "__main__":
    sys.exit(main())
