"""`testnet`: real daemons on this machine (or a Ray cluster), discovery only or learning."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

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


def _testnet(args: argparse.Namespace) -> int:
    churn = _churn(args)
    restart = _restart(args)
    if args.algorithm == "none" and not args.fleet and (args.duration is None or args.nodes is None):
        needed = "--nodes N" if args.nodes is None else "--duration S"
        raise CommandError(f"--algorithm none needs {needed}", EXIT_USAGE)
    if args.hold is not None and not args.exit_on_mesh:
        raise CommandError("--hold goes with --exit-on-mesh", EXIT_USAGE)
    spec = None if args.algorithm == "none" and not args.fleet else learning_spec(args)
    if spec is not None:
        backbones_note(args, spec)
        device_present(spec)
    if args.barrage and not args.poisoners:
        raise CommandError("--barrage goes with --poisoners I", EXIT_USAGE)
    if args.poisoners and spec is None:
        raise CommandError("--poisoners needs a learning --algorithm", EXIT_USAGE)
    from testnet.launch.cluster import ClusterStartError
    from testnet.launch.placement import PlacementError

    try:
        with _placement(args) as placement:
            if spec is None:
                return _discovery_testnet(args, churn, restart, placement)
            code, report = _learning_testnet(args, spec, churn, restart, placement)
    except (ClusterStartError, PlacementError) as exc:
        raise CommandError(str(exc)) from None
    if code != 130:
        add_baselines(report, spec, baseline_names(args))
    write_report(report, Path(args.out))
    return code


def _churn(args: argparse.Namespace):
    from testnet.launch.churn import ChurnSpec

    try:
        return None if args.churn is None else ChurnSpec.parse(args.churn)
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def _restart(args: argparse.Namespace):
    """`--restart`'s policy (testnet/launch/churn.py), or None without it."""
    from testnet.launch.churn import RestartPolicy

    chosen = {"max_restarts": args.max_restarts, "backoff_s": args.restart_backoff}
    if not args.restart:
        for option, value in zip(("--max-restarts", "--restart-backoff"), chosen.values(), strict=True):
            if value is not None:
                raise CommandError(f"{option} goes with --restart", EXIT_USAGE)
        return None
    return RestartPolicy(**{name: value for name, value in chosen.items() if value is not None})


def _daemon_settings(args: argparse.Namespace) -> dict[str, dict]:
    """The config sections every daemon gets from --daemon, --active-view and --max-peers
    (checked by each daemon as its config: a bad one stops the start, naming the field)."""
    import tomllib

    sections: dict[str, dict] = {}
    for item in args.daemon:
        name, _, value = item.partition("=")
        section, _, key = name.strip().partition(".")
        try:
            parsed = tomllib.loads(f"value = {value}")["value"]
        except tomllib.TOMLDecodeError:
            parsed = None
        if not key or parsed is None:
            raise CommandError(f"--daemon {item}: expected SECTION.KEY=VALUE with a TOML value", EXIT_USAGE)
        sections.setdefault(section, {})[key] = parsed
    views = {"active_view": args.active_view, "max_peers": args.max_peers}
    sections.setdefault("discovery", {}).update({key: value for key, value in views.items() if value is not None})
    return sections


def _placement(args: argparse.Namespace):
    """Where the testnet's daemons run (`--engine`); a missing Ray is a usage error."""
    from testnet.launch.choose_placement import EngineUnavailable, open_placement

    if args.ray_address is not None and args.engine != "ray":
        raise CommandError("--ray-address goes with --engine ray", EXIT_USAGE)
    try:
        return open_placement(args.engine, ray_address=args.ray_address)
    except EngineUnavailable as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def _discovery_testnet(args: argparse.Namespace, churn, restart, placement) -> int:
    from testnet.launch.discovery import run_discovery_testnet

    code, _ = run_discovery_testnet(
        Path(args.out),
        args.nodes,
        args.duration,
        exit_on_mesh=args.exit_on_mesh,
        hold_s=args.hold or 0.0,
        churn=churn,
        keep_going=args.keep_going,
        restart=restart,
        seed=args.seed,
        placement=placement,
        settings=_daemon_settings(args),
    )
    return code


def unpaced_warning(spec, engine: str, cores: int) -> str | None:
    """What to say when `--slow` runs more daemons than this machine's cores without `--pace`."""
    if spec.slow is None or spec.pace > 1 or engine != "local" or spec.nodes <= cores:
        return None
    return (
        f"--slow with {spec.nodes} daemons on {cores} cores and no --pace: a slow daemon's sleep hands its core to "
        f"the others, which then run faster than they would alone; give this run and those you compare it with "
        f"--pace {math.ceil(2 * spec.nodes / cores)} (docs/daemon.md, Emulated device speed)"
    )


def _learning_testnet(args: argparse.Namespace, spec, churn, restart, placement):
    from algorithms.data.datasets import DatasetError
    from algorithms.data.partitions import PartitionError
    from testnet.launch.learning import run_learning_testnet

    warning = unpaced_warning(spec, args.engine, os.cpu_count() or 1)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    try:
        return run_learning_testnet(
            spec,
            Path(args.out),
            round_deadline_s=args.round_deadline,
            timeout_s=args.timeout,
            check=thresholds(args),
            churn=churn,
            keep_going=args.keep_going,
            restart=restart,
            placement=placement,
            settings=_daemon_settings(args),
            barrage=args.barrage,
        )
    except (DatasetError, PartitionError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def add_parser(commands) -> None:
    from algorithms.catalog import ALGORITHM_NAMES

    testnet = commands.add_parser(
        "testnet",
        help="launch N daemons on this machine and check they converge",
        description="With --algorithm none: N daemons on 127.0.0.1 that discover each other for --duration S; exit 0 "
        "iff every view reached its target (all others, for N ≤ active view + 1) in time and the overlay is "
        "connected. Past 8 daemons per core they get the settings that hold crowded (view 8, at most 10 peers, "
        "liveness every 5 s; printed, in the report; --daemon overrides them); --active-view and --max-peers set "
        "every daemon's, e.g. 8 and 10 for many nodes: every view at its target, not a full mesh (docs/daemon.md, "
        '"Testnet"). With a learning --algorithm: N learning daemons on the scenario simulate takes, the same '
        "report.json, report.md and plots; --check: exit 1 unless every node ran to the last round, mean accuracy "
        "≥ --check-accuracy and, for the algorithms that learn a graph (mapl, mapl+, mapl-dual, mapl-auto, fedmrl, "
        'scool-sbm, scool-attention, sfmtl), in-cluster mass ≥ --check-mass (docs/daemon.md, "Learning testnet").',
    )
    testnet.add_argument(
        "--nodes", type=positive_int, help="number of daemons (required, unless --data-per-node DIR or --fleet DIR)"
    )
    testnet.add_argument(
        "--algorithm",
        choices=["none", *(a for a in ALGORITHM_NAMES if a != "oracle")],
        default="none",
        help="learning algorithm (none: discovery only; oracle exists in simulate only)",
    )
    testnet.add_argument(
        "--out", required=True, metavar="DIR", help="keys, configs, logs, report.json and PNGs go here"
    )
    testnet.add_argument(
        "--duration", type=positive_float, metavar="S", help="--algorithm none: seconds to run (required)"
    )
    testnet.add_argument(
        "--exit-on-mesh",
        action="store_true",
        help="--algorithm none: stop once every node's view is at its target, for N ≤ active view + 1 the full mesh "
        "(with --churn: again, after the last stop)",
    )
    testnet.add_argument(
        "--hold",
        type=positive_float,
        metavar="S",
        help="with --exit-on-mesh: go on S seconds after every view reached its target, for the steady-state "
        "rates of report.json's discovery.steady (they start 5 s after it; default 0: stop at once)",
    )
    testnet.add_argument(
        "--active-view",
        type=positive_int,
        metavar="K",
        help="[discovery].active_view of every daemon: the peers each seeks (default: the daemon's, 64)",
    )
    testnet.add_argument(
        "--max-peers",
        type=positive_int,
        metavar="M",
        help="[discovery].max_peers of every daemon (default: the daemon's, 64); for a large testnet "
        "a little above --active-view, e.g. 8 and 10 (docs/daemon.md)",
    )
    testnet.add_argument(
        "--daemon",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="any other setting of every daemon, e.g. discovery.ping_interval_s=5 (repeatable; docs/config.md)",
    )
    testnet.add_argument(
        "--keep-going",
        action="store_true",
        help="a daemon that exits on its own (and, with --restart, is not restarted) is reported and the others go on "
        "(default: the run stops)",
    )
    testnet.add_argument(
        "--restart",
        action="store_true",
        help="a daemon that dies (a crash, a signal, any exit but 0 and 2) is started again from its data directory "
        "and checkpoint, after a backoff, at most --max-restarts times; each restart is reported. Past that it is an "
        "exit, which --keep-going decides on (docs/daemon.md, Restarts)",
    )
    testnet.add_argument(
        "--max-restarts",
        type=positive_int,
        metavar="N",
        help="--restart: most restarts of one daemon in the run (default 3)",
    )
    testnet.add_argument(
        "--restart-backoff",
        type=positive_float,
        metavar="S",
        help="--restart: seconds before a daemon's first restart, doubled for each of its next ones (default 1)",
    )
    testnet.add_argument(
        "--churn",
        metavar="SPEC",
        help="every=S,down=S[,count=N][,signal=kill|term]: every S seconds stop a random daemon (seeded) "
        "and restart it S seconds later (docs/daemon.md, Churn)",
    )
    add_learning_arguments(testnet)
    testnet.add_argument(
        "--pace",
        type=float,
        default=1.0,
        metavar="K",
        help="every daemon emulates a device K times slower than one core of this machine ([node].slowdown = K, "
        "K × FACTOR on --slow's nodes), so daemons sharing the cores keep the speeds they emulate; the async gather "
        "lasts K × async_gather_s too (slow motion); give it, e.g. 2 × daemons / cores, to --slow runs and to the "
        "runs you compare them with (default 1: no pacing)",
    )
    testnet.add_argument(
        "--round-deadline",
        type=positive_float,
        default=5.0,
        metavar="S",
        help="most seconds a daemon waits for its neighbours' payloads in a round (default 5)",
    )
    testnet.add_argument(
        "--timeout",
        type=positive_float,
        metavar="S",
        help="give up after this long (default: 180 s + rounds × (deadline + 5 s × the largest slowdown), more "
        "for more daemons than cores: docs/daemon.md)",
    )
    testnet.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="where the daemons run: local (children of this process, 127.0.0.1) or ray (spread over the "
        "nodes of a Ray cluster, each a real daemon on its node's address; pip install 'p2pnode[ray]'; docs/ray.md)",
    )
    testnet.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="--engine ray: the Ray cluster to join (host:port of its head, or auto); default: start a local Ray",
    )
    add_poisoning_arguments(testnet)
    testnet.add_argument(
        "--barrage",
        action="store_true",
        help="the poisoners also send, each round, their payload tagged with other rounds, NaN, wrong shapes, "
        "frames past the bounds, a 60 MB MODEL and a burst of SCOREs (testnet/launch/byzantine.py)",
    )
    testnet.set_defaults(run=_testnet, default_nodes=None)
