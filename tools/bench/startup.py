"""What forking a local testnet's learning daemons from a warm parent saves (testnet/launch/warm_parent.py),
next to starting each with exec; prints one markdown table.

    python -m tools.bench.startup [--runs 2] [--out bench-out/startup] [--save startup]

The README's MAPL testnet (4 daemons on digits, mlp, 8 rounds, `--check`), `--runs` times each
way, alternating (exec, fork, exec, fork, ...) so that a change in the machine's load falls on
both: the CPU the daemons used (user + system, from the processes this one reaped: the daemons,
or the fork server and through it its daemons), the run's wall time, and the accuracy, which must
be the same both ways (the same daemons on the same data). The ratio is of medians, measured in
one run.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

from .results import capture, save

NODES, ROUNDS = 4, 8


def measure(out: Path, fork: bool) -> dict:
    """One run of the README's MAPL testnet; its daemons' CPU, wall time and accuracy."""
    from algorithms.data.setup import ScenarioSpec
    from testnet.launch.learning import run_learning_testnet
    from testnet.launch.placement import LocalPlacement
    from testnet.reporting.report import CheckThresholds
    from testnet.simulation.simulator import SimulationSpec

    spec = SimulationSpec(
        algorithm="mapl",
        data=ScenarioSpec(dataset="digits", nodes=NODES, samples_per_class=10),
        rounds=ROUNDS,
        backbones=("mlp",),
        overrides={"warmup_rounds": "3"},
    )
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    with LocalPlacement(fork=fork) as placement:
        code, report = run_learning_testnet(
            spec, out, placement=placement, check=CheckThresholds(accuracy=0.6, within_cluster_mass=0.9)
        )
    wall_s, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise SystemExit(f"the testnet failed ({report['check']}); see the logs under {out}")
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"fork": fork, "cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2), "accuracy": report["accuracy"]["mean"]}


def summary(runs: list[dict]) -> dict:
    """Medians each way and their ratios (forked / exec)."""
    way = {fork: [run for run in runs if run["fork"] is fork] for fork in (False, True)}
    medians = {
        name: {key: statistics.median(run[key] for run in way[fork]) for key in ("cpu_s", "wall_s")}
        for name, fork in (("exec", False), ("fork", True))
    }
    return {
        **medians,
        "cpu_ratio": round(medians["fork"]["cpu_s"] / medians["exec"]["cpu_s"], 2),
        "wall_ratio": round(medians["fork"]["wall_s"] / medians["exec"]["wall_s"], 2),
        "same_accuracy": len({run["accuracy"] for run in runs}) == 1,
    }


def render(result: dict) -> str:
    data = result["data"]
    rows = [
        "| daemons started | runs | daemons' CPU, s (median) | wall, s (median) | accuracy, % |",
        "|---|---|---|---|---|",
    ]
    for name, fork in (("with exec", False), ("forked (testnet/launch/warm_parent.py)", True)):
        runs = [run for run in data["runs"] if run["fork"] is fork]
        medians = data["summary"]["fork" if fork else "exec"]
        accuracy = ", ".join(sorted({f"{run['accuracy'] * 100:.1f}" for run in runs}))
        rows.append(f"| {name} | {len(runs)} | {medians['cpu_s']:.1f} | {medians['wall_s']:.1f} | {accuracy} |")
    s = data["summary"]
    rows += [
        "",
        f"Forked / exec: **{s['cpu_ratio']:.2f}×** the CPU, {s['wall_ratio']:.2f}× the wall time; "
        f"the same accuracy both ways: {'yes' if s['same_accuracy'] else 'no'}. The README's MAPL testnet: "
        f"{data['nodes']} daemons on digits (mlp), {data['rounds']} rounds, `--check`, runs alternating.",
    ]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs each way, alternating (default 2)")
    parser.add_argument(
        "--out", default="bench-out/startup", help="where the testnets write (default bench-out/startup)"
    )
    parser.add_argument("--save", metavar="NAME", help="write the result to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    words = ["python", "-m", "tools.bench.startup", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, settings={"node.backbone": "mlp"}, threads=1, runs=2 * args.runs) as provenance:
        runs = [
            measure(Path(args.out, f"{trial}-{'fork' if fork else 'exec'}"), fork)
            for trial in range(args.runs)
            for fork in (False, True)
        ]
    data = {"nodes": NODES, "rounds": ROUNDS, "runs": runs, "summary": summary(runs)}
    result = {"data": data}
    print(render(result))
    if args.save:
        print(f"saved {save(args.save, 'tools.bench.startup', provenance, data)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
