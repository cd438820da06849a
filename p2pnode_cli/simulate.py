"""`simulate`: the algorithms on all nodes without a network (inline, worker processes or Ray)."""

from __future__ import annotations

import argparse
from pathlib import Path

from p2pnode.exits import EXIT_FAILED, EXIT_OK

from .arguments import add_learning_arguments, add_poisoning_arguments, positive_float, positive_int
from .errors import EXIT_USAGE, CommandError
from .scenario import (
    add_baselines,
    backbones_note,
    baseline_names,
    device_present,
    learning_spec,
    thresholds,
    write_report,
)


def _simulate(args: argparse.Namespace) -> int:
    from algorithms.data.datasets import DatasetError
    from algorithms.data.partitions import PartitionError
    from algorithms.registry import ConfigOverrideError
    from testnet.simulation.progress import RoundProgress
    from testnet.simulation.shard import SimulationError
    from testnet.simulation.simulator import run_simulation

    spec = learning_spec(args)
    engine = _engine(args, spec.nodes)
    if engine.kind != "ray":  # a Ray cluster's machines may have devices this one lacks
        device_present(spec)
    backbones_note(args, spec)
    try:
        report = run_simulation(
            spec, progress=RoundProgress(spec.algorithm), thresholds=thresholds(args), engine=engine
        )
        add_baselines(report, spec, baseline_names(args), engine)
    except (DatasetError, PartitionError, ConfigOverrideError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    except SimulationError as exc:
        raise CommandError(str(exc)) from None
    write_report(report, Path(args.out))
    return EXIT_OK if report["check"]["passed"] else EXIT_FAILED


def _engine(args: argparse.Namespace, nodes: int):
    """The engine of `simulate` (testnet/simulation/hosting.py): processes when more than one worker would
    have nodes to run, else inline, unless --engine says otherwise."""
    from testnet.ray_extra import ray_missing
    from testnet.simulation.hosting import Engine, cores

    kind = args.engine or ("inline" if min(args.workers or cores(), nodes) == 1 else "processes")
    missing = ray_missing() if kind == "ray" else None
    if missing:
        raise CommandError(missing, EXIT_USAGE)
    try:
        return Engine(kind, args.workers, args.threads, args.ray_address, args.worker_timeout)
    except ValueError as exc:
        raise CommandError(f"--engine {kind}: {exc}", EXIT_USAGE) from None


def add_parser(commands) -> None:
    from algorithms.catalog import ALGORITHM_NAMES

    simulate = commands.add_parser(
        "simulate",
        help="run a learning algorithm on all nodes without a network (in worker processes, or on Ray) and "
        "write a report",
        description="All nodes, real frames, no sockets (docs/learning.md): in this process, on --workers processes "
        "or on Ray actors, the same report on each, with the testnet's keys: report.json, report.md and the plots in "
        "--out. --fleet DIR rehearses the fleet `p2pnode init` wrote, and its daemons end where the rehearsal did. "
        '--slow runs on a simulated clock (docs/architecture.md, "The simulator\'s clock").',
    )
    simulate.add_argument("--algorithm", choices=ALGORITHM_NAMES, help="required, unless --fleet DIR names it")
    simulate.add_argument(
        "--nodes", type=positive_int, help="default 10, or one per entry of --data-per-node DIR (--fleet: its configs)"
    )
    simulate.add_argument("--out", required=True, metavar="DIR", help="report.json and PNGs go here")
    add_learning_arguments(simulate)
    simulate.add_argument(
        "--engine",
        choices=("inline", "processes", "ray"),
        help="where the nodes run: inline (all in this process), processes (a pool of --workers worker "
        "processes), ray (Ray actors; needs pip install 'p2pnode[ray]'). Default: processes, or inline "
        'when one worker would do. Same report on each (docs/learning.md, "Engines")',
    )
    simulate.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="hosts the nodes are dealt to (default: one per core; ray: one per CPU of the cluster)",
    )
    simulate.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="CPU threads of torch and of numpy's BLAS per worker (default 1; inline: their defaults)",
    )
    simulate.add_argument(
        "--ray-address", metavar="ADDR", help="--engine ray: the cluster to use (default: start a local Ray)"
    )
    simulate.add_argument(
        "--worker-timeout",
        type=positive_float,
        default=1800.0,
        metavar="S",
        help="most seconds a worker may take over one command, e.g. a round's local steps of its nodes "
        "(default 1800); a worker that takes longer, dies or raises stops the run with exit 1",
    )
    add_poisoning_arguments(simulate)
    simulate.set_defaults(run=_simulate, default_nodes=10)
