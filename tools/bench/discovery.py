"""The discovery testnet of BENCHMARKS.md: `p2pnode testnet --nodes N --algorithm none
--duration S` run several times, one row a run, saved as a result file.

    python -m tools.bench.discovery --nodes 30 --duration 40 --runs 3 --save discovery-30

Each run is exactly what the command gives a user: the launcher's own settings (past
CROWDED_PER_CORE daemons per core it chooses the crowded ones, and says so), held for the whole
duration (no --exit-on-mesh), every daemon stopped with SIGTERM at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .results import capture, save

__all__ = ["main", "render"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-out/discovery"))
    parser.add_argument("--save", metavar="NAME", help="write the runs to tools/bench/results/NAME.json")
    parser.add_argument(
        "--exit-on-mesh", action="store_true", help="end each run once every view is at its target (quick checks)"
    )
    args = parser.parse_args(argv)
    from testnet.launch.discovery import run_discovery_testnet

    command = f"p2pnode testnet --nodes {args.nodes} --algorithm none --duration {args.duration:g}"
    command += " --exit-on-mesh" if args.exit_on_mesh else ""
    words = sys.argv[1:] if argv is None else argv
    with capture(["python", "-m", "tools.bench.discovery", *words], runs=args.runs) as provenance:
        rows = []
        for index in range(args.runs):
            code, report = run_discovery_testnet(
                args.out / f"run{index + 1}", args.nodes, args.duration, exit_on_mesh=args.exit_on_mesh
            )
            rows.append(_row(code, report))
    provenance["settings"] = {
        f"{section}.{key}": value for section, table in rows[0]["crowded"].items() for key, value in table.items()
    }
    print(render({"data": {"command": command, "runs": rows}}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.discovery', provenance, {'command': command, 'runs': rows})}")
    return 0 if all(row["exit_code"] == 0 for row in rows) else 1


def _row(code: int, report: dict) -> dict:
    discovery, overlay = report["discovery"], report["discovery"]["overlay"]
    by_type = report["comm"]["by_type"]
    liveness = sum(by_type.get(kind, {}).get("messages", 0) for kind in ("PING", "PONG"))
    return {
        "exit_code": code,
        "all_up_s": discovery["all_up_s"],
        "target_s": discovery["target_s"],
        "full_mesh_s": discovery["full_mesh_s"],
        "connected": overlay["connected"],
        "diameter": overlay["diameter"],
        "degrees": [overlay["degree_min"], overlay["degree_mean"], overlay["degree_max"]],
        "frames": report["comm"]["messages"],
        "bytes": report["comm"]["bytes"],
        "liveness_share": round(liveness / max(1, report["comm"]["messages"]), 3),
        "rejections": report["rejections"],
        "send_dropped": report["send_dropped"],
        "exits": len(report["exits"]),
        "exit_codes": sorted(set(report["node_exit_codes"])),
        "crowded": report["crowded_settings"],
    }


def render(result: dict) -> str:
    runs = result["data"]["runs"]
    rows = [
        "| run | all up, s | every view at target, s | full mesh, s | connected, diameter | degrees min / mean / max "
        "| frames sent (PING + PONG) | MB sent | refusals | sends dropped | daemons' exit codes | run's verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for index, run in enumerate(runs, 1):
        refusals = ", ".join(f"{count} `{reason}`" for reason, count in sorted(run["rejections"].items())) or "0"
        dropped = ", ".join(f"{count} {kind}" for kind, count in sorted(run["send_dropped"].items())) or "0"
        low, mean, high = run["degrees"]
        frames = f"{run['frames']:,}".replace(",", " ")
        rows.append(
            f"| {index} | {_s(run['all_up_s'])} | {_s(run['target_s'])} | {_s(run['full_mesh_s'])} | "
            f"{'yes' if run['connected'] else 'NO'}, {run['diameter']} | {low} / {mean:g} / {high} | "
            f"{frames} ({run['liveness_share']:.0%}) | {run['bytes'] / 1e6:.1f} | {refusals} | {dropped} | "
            f"{', '.join(map(str, run['exit_codes']))} | {_verdict(run)} |"
        )
    crowded = runs[0]["crowded"]
    chosen = ", ".join(f"`{key} = {value}`" for table in crowded.values() for key, value in table.items())
    rows.append("")
    rows.append(
        f"Each run: `{result['data']['command']} --out DIR`"
        + (f"; the launcher chose its crowded settings ({chosen})." if chosen else ", the daemon's defaults.")
    )
    return "\n".join(rows)


def _verdict(run: dict) -> str:
    """The launcher's verdict (exit code 0: every view at target in time, connected, no exit)."""
    if run["exit_code"] == 0:
        return "passed"
    return "failed: " + ("views not at target in time" if run["target_s"] is None else "see report.json")


def _s(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
