"""Daemon memory (issue #15, BENCHMARKS.md): the resident memory of learning daemons after a run
and at its peak, per algorithm; and, with `--stages`, where one node's memory goes.

    python -m tools.bench.memory --out bench-out/memory [--algorithms mapl mapl-dual scool-sbm local]
                                 [--nodes 4] [--rounds 25] [--save memory]
    python -m tools.bench.memory --stages [--algorithm mapl] [--rounds 25] [--save memory-stages]

The first runs one learning testnet per algorithm (mnist5k, scenario 1, convnet on every node,
`p2pnode start` processes) and reads each daemon's `rss_mb` / `peak_rss_mb` from the report.
The second runs one node's code path (the daemon's imports, config check, `build_algorithm`,
rounds with the driver's `malloc_trim`) alone in a fresh process, without the network, and
prints its memory after each stage. `--save NAME` writes either table's figures to
tools/bench/results/NAME.json (tools/bench/results.py), with the settings that differ from what
`p2pnode testnet` gives a user: a convnet on every node and a 10 s round deadline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .results import capture, save

ALGORITHMS = ("mapl", "mapl-dual", "scool-sbm", "local")
BACKBONE = "convnet"
LIMIT_MB = 400  # issue #15: a training daemon (mapl, convnet, mnist5k shard) in at most this
ROUND_DEADLINE_S = 10.0  # the testnets' (a user's default: 5 s); --stages runs no rounds over the network
THREADS = 1  # torch threads per daemon, as the launcher sets them


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/memory")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=25, help="past MAPL's 20 warm-up rounds")
    parser.add_argument("--stages", action="store_true", help="one node's memory, stage by stage")
    parser.add_argument("--algorithm", default="mapl", help="with --stages: the node's algorithm")
    parser.add_argument("--measure", metavar="CONFIG", help=argparse.SUPPRESS)  # the --stages child
    parser.add_argument("--save", metavar="NAME", help="write the table's figures to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    if args.measure:
        return _measure_stages(Path(args.measure), args.rounds)
    words = ["python", "-m", "tools.bench.memory", *(sys.argv[1:] if argv is None else argv)]
    settings = {"node.backbone": BACKBONE}
    if not args.stages:
        settings["algorithm.round_deadline_s"] = ROUND_DEADLINE_S
    with capture(words, settings=settings, threads=THREADS) as provenance:
        if args.stages:
            data = {"algorithm": args.algorithm, "rounds": args.rounds, "stages": _stages(args.algorithm, args.rounds)}
        else:
            data = {"nodes": args.nodes, "rounds": args.rounds, "algorithms": _testnets(args)}
    print(render({"data": data}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.memory', provenance, data)}")
    return 0


def _testnets(args: argparse.Namespace) -> dict[str, dict]:
    """Each algorithm's daemons' RSS after the run and at its peak, and the accuracy."""
    reports = {name: _testnet(name, args.nodes, args.rounds, Path(args.out, name)) for name in args.algorithms}
    summary = {name: {"processes": r["processes"], "accuracy": r["accuracy"]["mean"]} for name, r in reports.items()}
    Path(args.out, "summary.json").write_text(json.dumps(summary, indent=1))
    return {
        name: {
            "rss_mb": report["processes"]["rss_mb"],
            "peak_rss_mb": report["processes"]["peak_rss_mb"],
            "accuracy": report["accuracy"]["mean"],
        }
        for name, report in reports.items()
    }


def _testnet(algorithm: str, nodes: int, rounds: int, out: Path) -> dict:
    from algorithms.data.setup import ScenarioSpec
    from testnet.launch.learning import run_learning_testnet
    from testnet.launch.placement import LocalPlacement
    from testnet.simulation.simulator import SimulationSpec

    spec = SimulationSpec(
        algorithm, data=ScenarioSpec(dataset="mnist5k", nodes=nodes), rounds=rounds, backbones=(BACKBONE,)
    )
    # Each daemon started with exec, as on a device: a daemon forked from the testnet's warm
    # parent (testnet/launch/warm_parent.py) maps only the pages it touches, so its RSS is not a device's.
    with LocalPlacement(fork=False) as placement:
        code, report = run_learning_testnet(spec, out, round_deadline_s=ROUND_DEADLINE_S, placement=placement)
    if code != 0:
        raise SystemExit(f"{algorithm}: the testnet failed ({report.get('check')}); see the logs under {out}")
    return report


def render(result: dict) -> str:
    """BENCHMARKS.md's table: per algorithm, or (--stages) per stage of one node."""
    data = result["data"]
    if "stages" in data:
        rows = [
            f"| stage ({data['algorithm']}, {BACKBONE}, mnist5k, node 0 of 10) | RSS, MiB | peak RSS, MiB |",
            "|---|---|---|",
        ]
        rows += [f"| {s['stage']} | {s['rss_mb']:.0f} | {s['peak_rss_mb']:.0f} |" for s in data["stages"]]
        return "\n".join(rows)
    rows = [
        "| algorithm | daemons | RSS after the run, MiB: median / max | peak RSS, MiB: median / max | accuracy |",
        "|---|---|---|---|---|",
    ]
    for name, figures in data["algorithms"].items():
        rss, peak = figures["rss_mb"], figures["peak_rss_mb"]
        rows.append(
            f"| {name} | {len(rss)} | {statistics.median(rss):.0f} / {max(rss):.0f} | "
            f"{statistics.median(peak):.0f} / {max(peak):.0f} | {figures['accuracy'] * 100:.1f} % |"
        )
    rows += ["", f"{data['nodes']} daemons per algorithm, {data['rounds']} rounds; goal: at most {LIMIT_MB} MB."]
    return "\n".join(rows)


def _stages(algorithm: str, rounds: int) -> list[dict]:
    """Write node 0's config of a 10-node scenario-1 partition, measure it in a fresh process
    (what is imported is part of what is measured); what it found, stage by stage."""
    import tomli_w

    from algorithms.data.setup import ScenarioSpec
    from p2pnode.wire.keystore import write_key
    from protocol import Identity
    from testnet.launch.learning import node_settings
    from testnet.simulation.simulator import SimulationSpec

    with tempfile.TemporaryDirectory() as directory:
        settings = node_settings(SimulationSpec(algorithm, data=ScenarioSpec(nodes=10)), 0, BACKBONE, 5.0)
        settings["node"] = {"key": "key.pem", "data_dir": "data", "listen": "tcp://127.0.0.1:0"}
        write_key(Path(directory, "key.pem"), Identity.generate())
        config = Path(directory, "node.toml")
        config.write_text(tomli_w.dumps(settings))
        command = [sys.executable, "-m", "tools.bench.memory", "--measure", str(config), "--rounds", str(rounds)]
        lines = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout.splitlines()
    return [json.loads(line) for line in lines]


def _measure_stages(config_path: Path, rounds: int) -> int:
    """The --stages child: one JSON line per stage on stdout."""
    from p2pnode.memory import limit_arenas, process_memory, trim_now

    def stage(name: str) -> None:
        print(json.dumps({"stage": name, **process_memory()}), flush=True)

    stage("interpreter and this tool")
    import p2pnode.node  # what `p2pnode start` runs (the CLI itself is not for tools to import)
    import p2pnode.runner  # noqa: F401

    stage("daemon modules imported")
    from p2pnode.config import load_config

    config = load_config(config_path)
    limit_arenas(config.node.malloc_arenas)  # as p2pnode start does
    stage("config checked (imports torch and algorithms/)")
    import torch._dynamo  # noqa: F401  (torch.optim imports it on an optimiser's first use: made visible here)

    stage("torch._dynamo imported (sympy, torch.distributed, ...)")
    from p2pnode.learning.algorithm import build_algorithm

    algorithm = build_algorithm(config, "bench")
    stage("shard cut, model and optimiser built")
    for r in range(rounds):
        algorithm.local_step(r)
        algorithm.publish(r)
        algorithm.end_round(r)
        algorithm.evaluate()
        trim_now()  # as the round driver does after each round
        if r in (0, rounds - 1):
            stage(f"after round {r + 1} (alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
