"""The learning scenario of `simulate` and `testnet`, checked as a daemon checks its config, and
the report both write."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from .errors import EXIT_USAGE, CommandError


def learning_spec(args: argparse.Namespace):
    """The scenario of `simulate` and `testnet`, checked (hyper-parameters included)."""
    from algorithms.data.datasets import missing_files
    from algorithms.registry import ConfigOverrideError, checked_config
    from p2pnode.learning.rounds import Schedule
    from testnet.simulation.simulator import SimulationSpec
    from testnet.simulation.spec import parse_slow

    if args.fleet:
        return fleet_rehearsal(args).spec
    nodes = node_count(args)
    if args.algorithm is None or nodes is None:
        raise CommandError(f"give --{'algorithm' if args.algorithm is None else 'nodes'} (or --fleet DIR)", EXIT_USAGE)
    overrides = {}
    for item in args.set or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"--set wants KEY=VALUE, got {item!r}", EXIT_USAGE)
        overrides[key.strip()] = value.strip()
    data = _scenario(args, nodes)
    try:
        spec = SimulationSpec(
            algorithm=args.algorithm,
            data=data,
            rounds=args.rounds,
            backbones=tuple(args.backbones) if args.backbones else None,
            backbone_files=_backbone_files(args),
            overrides=overrides,
            poisoners=tuple(getattr(args, "poisoners", ())),
            attack=getattr(args, "attack", "sign-flip"),
            attack_factor=getattr(args, "attack_factor", 10.0),
            device=args.device,
            mixed_precision=args.mixed_precision,
            slow=None if args.slow is None else parse_slow(args.slow),
            pace=getattr(args, "pace", 1.0),
            schedule=Schedule(schedule=args.schedule),
        )
        spec.node_backbones()
        checked_config(spec.algorithm, overrides, spec.rounds, "--rounds")
    except (ValueError, ConfigOverrideError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    missing = None if data.own or data.per_node else missing_files(data.dataset, data.root)
    if missing is not None:
        raise CommandError(f"--data-root: {missing}", EXIT_USAGE)
    return spec


def backbones_note(args: argparse.Namespace, spec) -> None:
    """Say which backbones the nodes got when none were asked for: not what `init` writes."""
    if args.fleet or args.backbones or len(set(spec.node_backbones())) == 1:
        return
    print(
        f"note: the nodes run {', '.join(dict.fromkeys(spec.node_backbones()))} in turn (the benchmarks' mixed "
        "fleet); `p2pnode init` writes convnet on every node: --backbones convnet rehearses that, --fleet DIR "
        "an init directory as written",
        file=sys.stderr,
    )


def fleet_rehearsal(args: argparse.Namespace):
    """--fleet DIR's run (testnet/simulation/rehearsal.py); a scenario flag given beside it is refused, as
    the configs say what it would."""
    from testnet.simulation.rehearsal import FleetRehearsalError

    given = [flag for dest, (flag, default) in args.fleet_replaces.items() if getattr(args, dest) != default]
    if given:
        raise CommandError(
            f"{given[0]}: --fleet {args.fleet} takes it from the fleet's configs; remove it (or edit the configs)",
            EXIT_USAGE,
        )
    try:
        return _read_fleet(str(Path(args.fleet).resolve()))
    except FleetRehearsalError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


@functools.lru_cache(maxsize=1)
def _read_fleet(directory: str):
    """The fleet's configs are loaded once a command (the spec, then its baselines ask)."""
    from testnet.simulation.rehearsal import read_fleet

    return read_fleet(Path(directory))


def baseline_names(args: argparse.Namespace) -> list[str]:
    """--baselines, and Local where a --fleet's configs train `[algorithm].local_baseline`."""
    names = list(args.baselines)
    if args.fleet and "local" not in names and fleet_rehearsal(args).local_baseline:
        names.insert(0, "local")
    return names


def _backbone_files(args: argparse.Namespace):
    """--weights, and the current folder where a backbone is the user's own (MODULE:CALLABLE),
    its module found there now, as a daemon's config check finds it."""
    from algorithms.models.user_backbone import NO_FILES, BackboneError, BackboneFiles, is_user_backbone, user_builder

    weights = None if args.weights is None else Path(args.weights).resolve()
    if weights is not None and not weights.is_file():
        raise CommandError(f"--weights: {args.weights} is not a file", EXIT_USAGE)
    own = [name for name in args.backbones or () if is_user_backbone(name)]
    code = Path.cwd() if own else None
    for name in own:
        try:
            user_builder(name, code)
        except BackboneError as exc:
            raise CommandError(f"--backbones: {exc}", EXIT_USAGE) from None
    return NO_FILES if weights is None and code is None else BackboneFiles(code=code, weights=weights)


def node_count(args: argparse.Namespace) -> int | None:
    """--nodes; without it, one node per entry of --data-per-node DIR, else the command's default."""
    if args.nodes is not None:
        return args.nodes
    folder = Path(args.data_per_node) if args.data_per_node else None
    if folder is not None and folder.is_dir():
        return sum(not entry.name.startswith(".") for entry in folder.iterdir()) or None
    return args.default_nodes


def _scenario(args: argparse.Namespace, nodes: int):
    """The run's data (algorithms/data/setup.py `ScenarioSpec`), built here once from the flags."""
    from algorithms.catalog import DATASET_FROM_PATH
    from algorithms.data.setup import ScenarioSpec

    own, per_node = _own_data(args, nodes)
    try:
        return ScenarioSpec(
            dataset=DATASET_FROM_PATH if own is not None else args.dataset or "mnist5k",
            scenario=args.scenario,
            nodes=nodes,
            seed=args.seed,
            clusters=args.clusters,
            samples_per_class=args.samples_per_class,
            test_per_class=args.test_per_class,
            root=args.data_root,
            own=own,
            per_node=per_node,
        )
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def _own_data(args: argparse.Namespace, nodes: int):
    """--data or --data-per-node (testnet/simulation/own_data.py), checked as a daemon checks [data].path."""
    from testnet.simulation.own_data import DataArgumentError, OwnDataArguments, own_data_specs

    if (args.data or args.data_per_node) and (args.dataset or args.data_root):
        flag = "--dataset" if args.dataset else "--data-root"
        raise CommandError(f"{flag}: names a benchmark, but --data gives the run its own data: remove one", EXIT_USAGE)
    arguments = OwnDataArguments(
        args.data,
        args.data_per_node,
        tuple(args.class_names or ()),
        args.image_size,
        args.channels,
        args.test_fraction,
        args.max_memory_mb,
    )
    try:
        return own_data_specs(arguments, nodes, args.seed)
    except DataArgumentError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def device_present(spec) -> None:
    """Stop now (exit 1) if the run's device is not on this machine; say so if it has no mixed
    precision to give."""
    from algorithms.models.device import DeviceError, placement

    try:
        device, mixed_precision = placement(spec.device, spec.mixed_precision)
    except DeviceError as exc:
        raise CommandError(f"--device: {exc}") from None
    if spec.mixed_precision and not mixed_precision:
        print(f"note: --mixed-precision: {device} has none; training in float32", file=sys.stderr)


def thresholds(args: argparse.Namespace):
    from testnet.reporting.report import CheckThresholds

    return CheckThresholds(accuracy=args.check_accuracy, within_cluster_mass=args.check_mass) if args.check else None


def add_baselines(report: dict, spec, names: list[str], engine=None) -> None:
    """Simulate the baselines on the run's nodes and put them beside it in the report; on
    `engine`, by default `simulate`'s (a worker process per core, inline on one): a testnet's
    Local costs about what `simulate --baselines local` adds, not 10× (issue #45)."""
    if not names:
        return
    from testnet.reporting.report import attach_baselines
    from testnet.simulation.hosting import default_engine
    from testnet.simulation.progress import RoundProgress
    from testnet.simulation.simulator import run_baselines

    engine = engine or default_engine(spec.nodes)
    attach_baselines(report, run_baselines(spec, names, progress=RoundProgress, engine=engine))


def write_report(report: dict, out: Path) -> None:
    """Write report.json and the plots; say how it went and what failed its check."""
    from testnet.reporting.report import summary_line, write_report

    written = write_report(report, out)
    for note in report["partition_notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(summary_line(report))
    for failure in (report["check"] or {}).get("failures", []):
        print(f"check failed: {failure}", file=sys.stderr)
    print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
