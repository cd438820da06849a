"""`start`, `status`, `stop`, `predict` and `export` one node; `init` a fleet's keys and configs;
`report` on deployed nodes from their history files."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from p2pnode.exits import EXIT_FAILED, EXIT_OK

from .arguments import backbone_name, node_numbers, positive_float, positive_int
from .errors import EXIT_USAGE, CommandError
from .scenario import write_report


def _config(path: str, *, load_identity: bool = True, check_learning: bool = True):
    from p2pnode.config import ConfigError, load_config

    try:
        return load_config(path, load_identity=load_identity, check_learning=check_learning)
    except ConfigError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def _start(args: argparse.Namespace) -> int:
    from p2pnode.runner import StartFailed, start

    try:
        start(args.config)
    except StartFailed as exc:
        raise CommandError(str(exc), exc.exit_code) from None
    return EXIT_OK


def _ask(config_path: str, command: str):
    """Send one command to the node of `config_path`; returns (config, answer)."""
    from p2pnode.operations.control import ControlError, request

    config = _config(config_path, load_identity=False, check_learning=False)  # quick: a health check runs it
    try:
        answer = request(config.control_socket, command)
    except ControlError as exc:
        raise CommandError(str(exc)) from None
    if not answer.get("ok"):
        raise CommandError(f"the node refused: {answer.get('error')}")
    return config, answer


def _status(args: argparse.Namespace) -> int:
    from p2pnode.operations.status import format_status

    configs = _status_configs(args)
    if len(configs) == 1 and not args.fleet:
        _, answer = _ask(configs[0], "status")
        print(json.dumps(answer["status"], indent=2) if args.json else format_status(answer["status"]))
        return EXIT_OK
    return _fleet_status(configs, args.json)


def _doctor(args: argparse.Namespace) -> int:
    from p2pnode.operations.doctor import diagnose

    _, answer = _ask(args.config, "status")
    lines, problems = diagnose(answer["status"])
    print("\n".join(lines))
    return EXIT_FAILED if problems else EXIT_OK


def _status_configs(args: argparse.Namespace) -> list[str]:
    """--config, each given; --fleet DIR, every DIR/*/node.toml (as `init` writes them)."""
    configs = list(args.config or ())
    if args.fleet:
        from p2pnode.fleet import fleet_configs

        found = [str(path) for path in fleet_configs(Path(args.fleet))]
        if not found:
            raise CommandError(
                f"--fleet {args.fleet}: no */node.toml there (p2pnode init writes DIR/node<i>/node.toml)"
            )
        configs += found
    if not configs:
        raise CommandError("status: give --config TOML (one node) or --fleet DIR", EXIT_USAGE)
    return configs


def _fleet_status(configs: list[str], as_json: bool) -> int:
    """One row per node: its status, or why it gave none (not running, refused). Exit 0 even if
    some are down: the table says which."""
    from p2pnode.operations.control import ControlError, request
    from p2pnode.operations.status import format_fleet

    rows = []
    for path in configs:
        try:
            config = _config(path, load_identity=False, check_learning=False)
            answer = request(config.control_socket, "status")
            rows.append(
                {"config": path, "status": answer["status"]}
                if answer.get("ok")
                else {"config": path, "error": str(answer.get("error"))}
            )
        except (CommandError, ControlError) as exc:
            rows.append({"config": path, "error": str(exc)})
    print(json.dumps(rows, indent=2) if as_json else format_fleet(rows))
    return EXIT_OK


def _stop(args: argparse.Namespace) -> int:
    import time

    config, answer = _ask(args.config, "stop")
    deadline = time.monotonic() + args.timeout
    # The socket goes first, as the node begins to exit; its process ends seconds later.
    while config.control_socket.exists() or not _ended(answer.get("pid")):
        if time.monotonic() > deadline:
            raise CommandError(f"the node accepted the stop but is still running after {args.timeout:g} s")
        time.sleep(0.05)
    print("stopped", file=sys.stderr)
    return EXIT_OK


def _ended(pid: int | None) -> bool:
    """Whether the node's process has ended (a zombie has: only its parent's wait is left). Every
    thread, not only the first: its first thread turns zombie while the others are still being
    torn down, and until they are gone its parent cannot reap it (a service manager sees it run)."""
    if pid is None or pid == os.getpid():  # too old to say; or a node run inside this process (tests)
        return True
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks]
    except (OSError, IndexError):
        return True  # no such process (or no /proc: the socket's going is all there is to go by)
    return all(state in ("Z", "X") for state in states)


def _predict(args: argparse.Namespace) -> int:
    from p2pnode.serving.predict import PredictError, predict_files

    config = _config(args.config, load_identity=False, check_learning=False)  # enough to ask a running node
    try:
        report = predict_files(config, args.files, lambda: _config(args.config), ask_peers=args.ask_peers)
    except PredictError as exc:
        raise CommandError(str(exc)) from None
    predictions = report["predictions"]
    if args.json:
        print(json.dumps(report, indent=2))
    for entry in predictions:
        if "error" in entry:
            print(f"p2pnode: skipped {entry['file']}: {entry['error']}", file=sys.stderr)
        elif not args.json:
            print("\t".join(_prediction_line(entry)))
    _unknown_summary(report, predictions, args.ask_peers)
    failed = sum("error" in entry for entry in predictions)
    if failed:
        raise CommandError(f"{failed} of {len(predictions)} files could not be classified")
    return EXIT_OK


def _prediction_line(entry: dict) -> list[str]:
    """FILE, CLASS, PROBABILITY; for an image not of the node's classes, why, and what its peers said."""
    line = [entry["file"], entry["class_name"], f"{entry['probability']:.4f}"]
    if entry.get("known", True):
        return line
    line.append(f"not one of my classes ({entry['why_unknown']})")
    if "peers" in entry:
        answer = entry["answer"]
        if answer is None:
            line.append(f"no peer knows it ({len(entry['peers'])} answered)")
        else:
            line.append(f"peer {answer['node_id']} says {answer['class_name']} {answer['probability']:.4f}")
    return line


def _unknown_summary(report: dict, predictions: list[dict], asked: bool) -> None:
    unknown = sum(entry.get("known") is False for entry in predictions)
    if not unknown or "known_classes" not in report:
        return
    hint = "" if asked else "; `--ask-peers` asks the node's learning peers about them"
    print(
        f"p2pnode: {unknown} of {len(predictions)} images are not one of this node's classes "
        f"({', '.join(report['known_classes'])}){hint}",
        file=sys.stderr,
    )
    if asked:
        print(f"p2pnode: asked {len(report.get('asked', []))} learning peers", file=sys.stderr)


def _export(args: argparse.Namespace) -> int:
    from p2pnode.serving.predict import PredictError, export_model

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


def _init(args: argparse.Namespace) -> int:
    """Keys and ready-to-run configs for a fleet (fleet.py), each checked as `start` would."""
    from p2pnode.fleet import FleetError, FleetSpec, write_fleet

    spec = FleetSpec(
        nodes=args.nodes,
        out=Path(args.out),
        hosts=tuple(host.strip() for host in args.hosts.split(",")),
        port=args.port,
        network=args.network,
        algorithm=args.algorithm,
        rounds=args.rounds,
        backbone=args.backbone,
        code=None if args.code is None else Path(args.code),
        weights=None if args.weights is None else Path(args.weights),
        settings=_toml_settings(args.set or ()),
        local_baseline=args.local_baseline,
        data_per_node=None if args.data_per_node is None else Path(args.data_per_node),
        class_names=tuple(args.class_names or ()),
        image_size=args.image_size,
        force=args.force,
        behind_nat=frozenset(args.behind_nat or ()),
    )
    try:
        paths = write_fleet(spec)  # nothing left behind if it fails
    except FleetError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    for path in paths:
        print(path)  # stdout: the configs, one a line, for scripts
    print(
        f"wrote {len(paths)} keys (mode 0600) and configs under {spec.out}; start each on its host: "
        f"p2pnode start --config {paths[0]}"
        + ("" if args.data_per_node else " (edit [data] first to learn from your own images)"),
        file=sys.stderr,
    )
    if spec.behind_nat:
        clients = ", ".join(map(str, sorted(spec.behind_nat)))
        relays = ", ".join(str(i) for i in range(spec.nodes) if i not in spec.behind_nat)
        print(
            f"nodes {clients} are behind NATs (client mode): they dial the others and are reached over those "
            "connections"
            + (
                f"; they reach each other through nodes {relays}, which relay for them"
                if len(spec.behind_nat) > 1
                else ""
            ),
            file=sys.stderr,
        )
    if spec.algorithm == "mapl-auto":
        print(
            "each node learns with mapl-auto: its own model is averaged with the peers that run the same one "
            f"(here {spec.backbone}: every node), a small shared model with the peers it learns are alike, and "
            "a third model trains on its own data alone; it predicts with its own and that third model together "
            "(never far under training alone, even where the others cannot help it), or with another where "
            "that cannot fit its training images; `p2pnode status` and the report say which model each node "
            "predicts with and why",
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


def _report(args: argparse.Namespace) -> int:
    """report.md and the plots of deployed nodes, from their history files (testnet/reporting/deployment.py)."""
    from testnet.reporting.deployment import DeploymentReportError, deployment_report, load_histories
    from testnet.reporting.summary import difference_text

    configs = [_config(path, check_learning=False) for path in args.config]
    try:
        report = deployment_report(load_histories(configs))
    except DeploymentReportError as exc:
        raise CommandError(str(exc)) from None
    if not any(entry["records"] for entry in report["histories"]):
        raise CommandError("no node has recorded a round yet: nothing to report")
    write_report(report, Path(args.out))
    if args.files:
        _held_out_files(configs, Path(args.out))
    difference = (report["local_baseline_gain"] or {}).get("difference")
    if difference is not None:
        print(
            f"collaboration gained {difference_text(difference)} over the local baseline, {difference['nodes']} nodes"
        )
    return EXIT_OK


def _held_out_files(configs, out: Path) -> None:
    """`report --files`: OUT/held_out/node<i>.csv, node i as the report numbers it (testnet/reporting/held_out.py)."""
    from testnet.reporting.held_out import write_held_out

    for index, loaded in enumerate(configs):
        try:
            config = _config(str(loaded.source))  # the full check: [data] is read
            print(f"node {index}: held-out images: {write_held_out(config, out / 'held_out' / f'node{index}.csv')}")
        except (CommandError, ValueError) as exc:
            print(f"node {index} ({loaded.source}): no list of held-out images: {exc}", file=sys.stderr)


# What `p2pnode COMMAND --help` says above the options (docs/cli.md is generated from it).
CONFIG_HELP = "the node's configuration (docs/config.md)"
PREDICT_DESCRIPTION = (
    "Prints each image file's class name and probability, from the running node's model or, with none running, "
    "its checkpoint's. An image that is not one of the node's classes (a threshold set on its held-out images) is "
    "said so; with --ask-peers the running node asks its learning peers about those, and their signed answers come "
    "back (docs/usage.md)."
)
INIT_DESCRIPTION = (
    "Writes a key (mode 0600) and a ready-to-run DIR/node<i>/node.toml per node: CURVE on, every other node a "
    "KEY@tcp://HOST:PORT bootstrap entry, hosts round-robin, own ports and data directory; [data] each node's "
    "folder of --data-per-node (relative to the config), or a placeholder to fill; with --local-baseline a Local "
    "model beside each. Nothing is left behind if a config does not load (docs/deploy.md)."
)
REPORT_DESCRIPTION = (
    "Renders, as simulate does, report.md, report.json and the plots of deployed nodes from the history.jsonl in "
    "each one's data directory; with [algorithm].local_baseline, what collaboration gained over training alone, "
    'per node and overall (docs/daemon.md, "A node\'s result").'
)


def add_parsers(commands) -> None:
    start = commands.add_parser("start", help="run a node in the foreground until SIGINT/SIGTERM or `p2pnode stop`")
    start.add_argument("--config", required=True, metavar="TOML", help=CONFIG_HELP)
    start.set_defaults(run=_start)

    status = commands.add_parser(
        "status", help="ask a running node for its status; with --fleet DIR (or several --config), one table of all"
    )
    status.add_argument("--config", action="append", metavar="TOML", help="a node's configuration; repeat for several")
    status.add_argument(
        "--fleet",
        metavar="DIR",
        help="every DIR/*/node.toml, as `p2pnode init` wrote them: one line per node, its round, peers, accuracy, "
        "its local baseline's and the gain, or why it is down",
    )
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(run=_status)

    _add_doctor_parser(commands)

    stop = commands.add_parser("stop", help="ask a running node to shut down, and wait until it has")
    stop.add_argument("--config", required=True, metavar="TOML", help=CONFIG_HELP)
    stop.add_argument(
        "--timeout", type=positive_float, default=10.0, help="seconds to wait for the node to exit (default 10)"
    )
    stop.set_defaults(run=_stop)

    predict = commands.add_parser(
        "predict",
        help="classify image files with a node's model (the running node's, else its checkpoint's) and say which are "
        "not one of its classes (docs/usage.md)",
        description=PREDICT_DESCRIPTION,
    )
    predict.add_argument("--config", required=True, metavar="TOML", help=CONFIG_HELP)
    predict.add_argument("files", nargs="+", metavar="FILE", help="image files (any format PIL reads)")
    predict.add_argument("--json", action="store_true", help="print JSON instead of FILE, CLASS, PROBABILITY lines")
    predict.add_argument(
        "--ask-peers",
        action="store_true",
        help="the running node asks its learning peers about the images it calls not one of its classes "
        "(sends those images to them; docs/usage.md)",
    )
    predict.set_defaults(run=_predict)

    export = commands.add_parser(
        "export",
        help="write a node's model from its checkpoint as a torch.export program plain torch loads (docs/usage.md)",
    )
    export.add_argument("--config", required=True, metavar="TOML", help=CONFIG_HELP)
    export.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="the program (.pt2); its class names, preprocessing and unknown-image threshold go to FILE.json",
    )
    export.set_defaults(run=_export)

    _add_init_parser(commands)
    _add_report_parser(commands)


def _add_doctor_parser(commands) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="why a running node does or does not reach its peers: its address, its reachability, each "
        "bootstrap entry, and what to change (exit 1 if it names a problem)",
    )
    doctor.add_argument("--config", required=True, metavar="TOML", help=CONFIG_HELP)
    doctor.set_defaults(run=_doctor)


def _add_init_parser(commands) -> None:
    from algorithms.catalog import ALGORITHM_NAMES, DEFAULT_ALGORITHM

    init = commands.add_parser(
        "init",
        help="write a key and a ready-to-run config per node of a small fleet (CURVE keys in the bootstrap)",
        description=INIT_DESCRIPTION,
    )
    init.add_argument("--nodes", type=positive_int, required=True, help="nodes in the fleet")
    init.add_argument("--out", required=True, metavar="DIR", help="DIR/node<i>/ gets key.pem and node.toml")
    _add_init_layout_arguments(init)
    init.add_argument(
        "--algorithm",
        choices=[a for a in ALGORITHM_NAMES if a != "oracle"],
        default=DEFAULT_ALGORITHM,
        help=f"[algorithm].name (default {DEFAULT_ALGORITHM}: each node shares its own model with the peers that "
        "run the same one, and a small model with all, and predicts with them and a model trained on its data "
        "alone; docs/learning.md)",
    )
    init.add_argument("--rounds", type=positive_int, default=60, help="[algorithm].rounds (default 60)")
    _add_init_model_arguments(init)
    init.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="[algorithm.settings], e.g. --set warmup_rounds=10"
    )
    init.add_argument(
        "--local-baseline",
        action="store_true",
        help="[algorithm].local_baseline: each node also trains a Local model (no communication) on the "
        "same data, and its report compares the two",
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
    init.add_argument("--image-size", type=positive_int, metavar="N", help="[data].image_size of image folders")
    init.add_argument("--force", action="store_true", help="replace the node directories of a non-empty DIR")
    init.set_defaults(run=_init)


def _add_init_layout_arguments(init) -> None:
    """Where the fleet's nodes run and how they reach each other."""
    init.add_argument(
        "--hosts",
        default="127.0.0.1",
        metavar="H1,H2,...",
        help="hosts the nodes run on, dealt round-robin (IPv4 addresses or host names; default 127.0.0.1)",
    )
    init.add_argument(
        "--port",
        type=positive_int,
        default=7000,
        help="public port of the first node on each host, its peers' port one above; the next node on the "
        "same host takes the next two (default 7000)",
    )
    init.add_argument(
        "--behind-nat",
        type=node_numbers,
        metavar="I,J,...",
        help="nodes nobody can dial (behind a NAT or a firewall that forwards nothing): [node].client_mode, "
        "reached over the connections they dial to the others; they are not the others' bootstrap entries; with "
        "two or more, every other node relays for them ([relay].enabled)",
    )
    init.add_argument("--network", default="p2pnode", help="[node].network of every node (default p2pnode)")


def _add_init_model_arguments(init) -> None:
    from algorithms.catalog import BACKBONES

    init.add_argument(
        "--backbone",
        type=backbone_name,
        default="convnet",
        help=f"[model].backbone (default convnet): {', '.join(BACKBONES)}, or your own as MODULE:CALLABLE "
        "(docs/own-model.md)",
    )
    init.add_argument(
        "--code",
        metavar="DIR",
        help="[model].code: the folder your MODULE is imported from (default: each config's own folder)",
    )
    init.add_argument(
        "--weights", metavar="PATH", help="[model].weights: a state dict every node's backbone starts from"
    )


def _add_report_parser(commands) -> None:
    report = commands.add_parser(
        "report",
        help="report.md and the plots of deployed nodes, from the history files in their data directories",
        description=REPORT_DESCRIPTION,
    )
    report.add_argument(
        "--config",
        action="append",
        required=True,
        metavar="TOML",
        help="a node's configuration (its key names it, its [node].data_dir holds history.jsonl); repeat per node",
    )
    report.add_argument("--out", required=True, metavar="DIR", help="report.json, report.md and PNGs go here")
    report.add_argument(
        "--files",
        action="store_true",
        help="also DIR/held_out/node<i>.csv: each node's held-out images (its own files) with their class, "
        "the class it predicts and whether that is right, from its checkpoint",
    )
    report.set_defaults(run=_report)
