"""The simulator's engines (issue #16; BENCHMARKS.md, "Scaling: simulator"): the wall time of
one simulation inline, spread over worker processes, and on Ray, with the ratios measured in the
same run of this tool.

    python -m tools.bench.simulate speedup [--rounds 60] [--repeats 1] [--skip-before] [--seed 0]  # 10-node MAPL
    python -m tools.bench.simulate scaling [--nodes 10 30 100] [--rounds 5] [--workers 1 2] [--ray]
    ... speedup | scaling [--save NAME]   # the rows and their provenance to tools/bench/results/NAME.json
    python -m tools.bench.simulate large [--nodes 200] [--rounds 3] [--engines ray processes]

`speedup` runs the MAPL row of `tools/bench/learning.py` (mnist5k, Scenario 1, 10 nodes, 25
samples per class, 60 rounds, seed 0 unless --seed) as `p2pnode simulate` ran it before engines existed
(inline, torch's default threads), then inline on one thread and on 2 worker processes of one
thread each, in turn, `--repeats` times. `scaling` times MAPL (mnist5k, Scenario 1) against the
number of nodes and of workers; `large` one run of many nodes. Both keep the data per node the
same whatever the number of nodes (5 training and 5 test images per class for `scaling`, 3 and
2 for `large`), so that mnist5k can supply them all without scaling it down. Each run is a
fresh process (`run`, below), so none inherits another's threads or caches; the 1-minute load
average is printed beside each, since the machine may be shared. A report's content (all but
its times and provenance) is kept as a digest, to compare engines by.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, fields

from algorithms.data.setup import ScenarioSpec
from testnet.simulation.hosting import Engine
from testnet.simulation.simulator import SimulationSpec

from .results import capture, save

BENCHMARK = {"algorithm": "mapl", "dataset": "mnist5k", "scenario": "1", "samples_per_class": 25, "seed": 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("speedup", "scaling", "large", "run"))
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--nodes", type=int, nargs="+")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="scaling: worker counts")
    parser.add_argument("--ray", action="store_true", help="scaling: also on a local Ray")
    parser.add_argument("--engines", nargs="+", default=["ray", "processes"], help="large: the engines to run")
    parser.add_argument("--repeats", type=int, default=1, help="speedup: inline / processes pairs, in turn")
    parser.add_argument(
        "--skip-before", action="store_true", help="speedup: leave out the run as before engines (the slowest)"
    )
    parser.add_argument("--seed", type=int, default=0, help="speedup: the run's seed")
    parser.add_argument(
        "--samples-per-class", type=int, help="per node (default: speedup 25, as the benchmark; scaling 5; large 3)"
    )
    parser.add_argument(
        "--test-per-class", type=int, help="per node (default: speedup the simulator's; scaling 5; large 2)"
    )
    parser.add_argument(
        "--save", metavar="NAME", help="speedup, scaling: write the runs to tools/bench/results/NAME.json"
    )
    parser.add_argument("--job", help=argparse.SUPPRESS)  # `run`: one simulation, as JSON
    args = parser.parse_args(argv)
    if args.what == "run":
        print(json.dumps(_run_here(json.loads(args.job))))
        return 0
    if args.what == "large":
        data = {"samples_per_class": args.samples_per_class or 3, "test_per_class": args.test_per_class or 2}
        print(_large(args.nodes or [200], args.rounds or 3, data, args.engines))
        return 0
    if args.what == "speedup":
        given = {"samples_per_class": args.samples_per_class, "test_per_class": args.test_per_class}
        data = {key: value for key, value in given.items() if value}  # the benchmark's otherwise
    else:
        data = {"samples_per_class": args.samples_per_class or 5, "test_per_class": args.test_per_class or 5}
    words = ["python", "-m", "tools.bench.simulate", *(sys.argv[1:] if argv is None else argv)]
    seeds = [args.seed if args.what == "speedup" else BENCHMARK["seed"]]
    with capture(words, settings=settings(data), seeds=seeds, threads=1) as provenance:
        if args.what == "speedup":
            measured = _speedup(args.rounds or 60, args.skip_before, args.repeats, args.seed, data)
        else:
            measured = _scaling(args.nodes or [10, 30, 100], args.rounds or 5, data, args.workers, args.ray)
    provenance["runs"] = len(measured["runs"])
    print(render({"data": measured}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.simulate', provenance, measured)}")
    return 0


def settings(data: dict) -> dict:
    """What differs from `p2pnode simulate`'s defaults beside the engine of each row: one torch
    thread per host (but the run "before engines"), and the data per node if not the simulator's."""
    defaults = SimulationSpec(algorithm=BENCHMARK["algorithm"])
    changed = {f"simulate.{key}": value for key, value in data.items() if getattr(defaults.data, key) != value}
    return {"engine.threads": 1, **changed}


def _speedup(rounds: int, skip_before: bool, repeats: int, seed: int, data: dict) -> dict:
    """The run as before engines once; then inline on one thread and 2 worker processes, in turn,
    `repeats` times, so that a busy stretch of a shared machine hits both alike."""
    spec = {**BENCHMARK, **data, "nodes": 10, "rounds": rounds, "seed": seed}
    before = (
        None
        if skip_before
        else run(spec, {"kind": "inline"}, label=f"before engines: inline, torch's threads (seed {seed})")
    )
    runs = [] if before is None else [before]
    for _ in range(repeats):
        runs.append(run(spec, {"kind": "inline", "threads": 1}, label=f"inline, 1 thread (seed {seed})"))
        engine = {"kind": "processes", "workers": 2, "threads": 1}
        runs.append(run(spec, engine, label=f"processes, 2 × 1 thread (seed {seed})"))
    return {"what": "speedup", "before": before is not None, "runs": runs}


def _render_speedup(data: dict) -> list[str]:
    runs = data["runs"]
    before = runs[0] if data["before"] else None
    pairs = list(zip(runs[bool(before) :: 2], runs[bool(before) + 1 :: 2], strict=True))
    lines = [HEADER, *(_row(r) for r in runs), ""]
    spread = pairs[0][1]
    if before:
        lines.append(
            f"processes against before engines: {before['wall_s'] / spread['wall_s']:.2f}× as fast, accuracy "
            f"{(spread['accuracy'] - before['accuracy']) * 100:+.2f} points"
        )
    ratios = [inline["wall_s"] / spread["wall_s"] for inline, spread in pairs]
    same = all(inline["results"] == spread["results"] for inline, spread in pairs)
    lines.append(
        f"processes against inline on 1 thread: {statistics.median(ratios):.2f}× as fast (median of "
        f"{', '.join(f'{r:.2f}' for r in ratios)}), reports {'identical' if same else 'different'}"
    )
    return lines


def _scaling(nodes: list[int], rounds: int, data: dict, workers: list[int], ray: bool) -> dict:
    """The same data per node whatever their number (the default fits 100 nodes of mnist5k)."""
    runs = []
    for count in nodes:
        spec = {**BENCHMARK, **data, "nodes": count, "rounds": rounds}
        engines = [{"kind": "inline", "threads": 1} if w == 1 else {"kind": "processes", "workers": w} for w in workers]
        engines += [{"kind": "ray", "workers": w} for w in workers] if ray else []
        runs += [run(spec, engine) for engine in engines]
    return {"what": "scaling", "runs": runs}


def _render_scaling(data: dict) -> list[str]:
    rows = [HEADER]
    for count in sorted({r["nodes"] for r in data["runs"]}):
        mine = [r for r in data["runs"] if r["nodes"] == count]
        rows += [_row(r) for r in mine]
        same = len({r["results"] for r in mine}) == 1
        rows.append(f"| {count} nodes: reports {'identical' if same else 'different'} on every engine |" + " |" * 10)
    return rows


def render(result: dict) -> str:
    """BENCHMARKS.md's table of `speedup` or `scaling`: one row per run."""
    data = result["data"]
    return "\n".join(_render_speedup(data) if data["what"] == "speedup" else _render_scaling(data))


def _large(nodes: list[int], rounds: int, data: dict, engines: list[str]) -> str:
    """The default data fits 200 nodes of mnist5k (100 per class, 5 images each)."""
    rows = [HEADER]
    for count in nodes:
        spec = {**BENCHMARK, **data, "nodes": count, "rounds": rounds}
        rows += [_row(run(spec, {"kind": kind, "workers": 2})) for kind in engines]
    return "\n".join(rows)


HEADER = (
    "| run | nodes | rounds | engine | hosts × threads | wall s | cores used | wall s per round | accuracy % | "
    "peak RSS per host, MiB | load (1 min) before / after |\n" + "|---" * 11 + "|"
)


def _row(r: dict) -> str:
    """One run; `cores used` is the hosts' CPU seconds since they began to build their nodes over
    the run's wall time (which includes starting them). A report's step times are the simulated
    clock's (testnet/simulation/clock.py), not what a step cost here: the wall time per round is."""
    peak = [host["peak_rss_mb"] or 0.0 for host in r["engine"]["hosts"]]
    cores = sum(host["cpu_s"] for host in r["engine"]["hosts"]) / r["wall_s"]
    return (
        f"| {r['label']} | {r['nodes']} | {r['rounds']} | {r['engine']['kind']} | {len(peak)} × "
        f"{r['threads']} | {r['wall_s']:.1f} | {cores:.2f} | {r['wall_s'] / r['rounds']:.2f} | "
        f"{r['accuracy'] * 100:.2f} | "
        f"{' / '.join(f'{p:.0f}' for p in peak)} | {r['load'][0]:.1f} / {r['load'][1]:.1f} |"
    )


def run(spec: dict, engine: dict, label: str = "") -> dict:
    """One simulation in a fresh process; what it measured, with the load average around it."""
    job = json.dumps({"spec": spec, "engine": engine})
    before = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.simulate", "run", "--job", job],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    result.update(label=label or engine["kind"], load=(round(before, 2), round(os.getloadavg()[0], 2)))
    print(_row(result), file=sys.stderr, flush=True)
    return result


def _spec(flat: dict) -> SimulationSpec:
    """A job's spec: its keys that name the run's data (`ScenarioSpec`'s fields) make `data`."""
    names = {field.name for field in fields(ScenarioSpec)}
    data = ScenarioSpec(**{key: value for key, value in flat.items() if key in names})
    return SimulationSpec(data=data, **{key: value for key, value in flat.items() if key not in names})


def _run_here(job: dict) -> dict:
    import torch

    from testnet.simulation.simulator import run_simulation

    spec, engine = _spec(job["spec"]), Engine(**job["engine"])
    report = run_simulation(spec, engine=engine)
    kept = {k: v for k, v in report.items() if k not in ("wall_s", "timing", "provenance")}
    return {
        "nodes": spec.nodes,
        "rounds": spec.rounds,
        "engine": {**asdict(engine), "hosts": report["provenance"]["engine"]["hosts"]},
        "threads": torch.get_num_threads() if engine.kind == "inline" else engine.threads or 1,  # per host
        "wall_s": report["wall_s"],
        "accuracy": report["accuracy"]["mean"],
        # compared between runs: identical or not
        "results": hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16],
    }


if __name__ == "__main__":
    sys.exit(main())
