"""Fleet shapes (issue #44): does collaboration pay on the fleets users have? Each cell is a
number of nodes, one backbone everywhere (the convnet: what `p2pnode init` writes) or four
different ones (the CPU backbones, node i the i-th modulo 4), and a dataset; in each, every
method runs on the same partitions and is paired with Local on the same nodes. Scenario 1 (two
clusters, each with its own classes), 10 training images per class, `--rounds` rounds.

    python -m tools.bench.fleets --out bench-out/fleets [--nodes 3 4 10] [--backbones one four]
        [--datasets mnist5k digits folder] [--methods local mapl+ mapl-dual mapl-auto oracle] [--seeds 3 4 5]
        [--rounds 40] [--workers 2] [--save fleets]

Per cell and method: accuracy per seed and its mean; the gain over Local with its interval,
resampling the seeds and then the nodes within each (testnet/reporting/intervals.py `runs_bootstrap`:
nodes of one run share its luck); the worst node against its own Local; traffic. MAPL+ needs one
backbone everywhere and is left out of the four-backbone cells. `oracle` (run only when asked):
each node's own model trained on its true cluster's pooled data, as if its cluster-mates'
images were its own, the reference for what collaboration can give. Seeds 0, 1 and 2 chose settings
(MAPL-Dual's defaults, MAPL-Auto's): a table is saved only from others. Each run is one process
with one torch thread; a finished run of the same spec and commit is reused (runs.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from algorithms.catalog import CPU_BACKBONES
from algorithms.data.setup import ScenarioSpec
from testnet.simulation.simulator import SimulationSpec

from .results import capture, publish
from .runs import simulate_all, write_summary

DEFAULT_METHODS = ("local", "mapl+", "mapl-dual", "mapl-auto")
METHODS = (*DEFAULT_METHODS, "oracle")
SHAPES = {"one": ("convnet",), "four": CPU_BACKBONES}
HOMOGENEOUS = ("mapl+",)
TEST_PER_CLASS = {"mnist5k": 80, "digits": 30, "folder": 80}  # digits has ~180 images a class: 10 nodes must fit
# "folder": each node's own folder of PNGs (class sub-folders), written from its mnist5k shard and
# read back as a device's own data is (`--data-per-node`), its own split of 10 + 80 images a class.
FOLDER_SOURCE = "mnist5k"
TUNING_SEEDS = (0, 1, 2)
THREADS = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/fleets")
    parser.add_argument("--nodes", nargs="+", type=int, default=[3, 4, 10])
    parser.add_argument("--backbones", nargs="+", choices=sorted(SHAPES), default=["one", "four"])
    parser.add_argument("--datasets", nargs="+", choices=sorted(TEST_PER_CLASS), default=["mnist5k", "digits"])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(DEFAULT_METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[3, 4, 5])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--samples", type=int, default=10, help="training images per class per node")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--save", metavar="NAME", help="write the table's runs to tools/bench/results/NAME.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    tuned = sorted(set(args.seeds) & set(TUNING_SEEDS))
    if "folder" in args.datasets and args.samples < 9:
        parser.error(
            "--datasets folder: --samples must be at least 9 (a node holds out at most 90 %, 80 images a class)"
        )
    if tuned and args.save:
        parser.error(f"--save: seed {tuned[0]} chose settings; a saved table comes from other seeds (3 and up)")
    methods = ["local", *(m for m in args.methods if m != "local")]
    cells = [(d, n, b) for d in args.datasets for n in args.nodes for b in args.backbones]
    runs = [
        (cell, method, seed)
        for cell in cells
        for method in methods
        if not (method in HOMOGENEOUS and len(SHAPES[cell[2]]) > 1)
        for seed in args.seeds
    ]
    jobs = [(_spec(cell, method, seed, args), _folder(args.out, cell, method, seed)) for cell, method, seed in runs]
    words = ["python", "-m", "tools.bench.fleets", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, seeds=args.seeds, threads=THREADS, runs=len(jobs)) as provenance:
        reports = simulate_all(jobs, args.workers, reuse=True)
    write_summary(
        reports,
        ("algorithm", "dataset", "nodes", "backbones", "seed", "accuracy", "comm"),
        Path(args.out, "summary.json"),
    )
    data = {
        "rounds": args.rounds,
        "samples_per_class": args.samples,
        "tuning_seeds": list(TUNING_SEEDS),
        "runs": [_kept(cell, method, report) for (cell, method, _), report in zip(runs, reports, strict=True)],
    }
    return publish(data["runs"], render({"data": data}), provenance, args.save, "tools.bench.fleets", data)


def _spec(cell: tuple, method: str, seed: int, args: argparse.Namespace) -> SimulationSpec:
    dataset, nodes, shape = cell
    source = FOLDER_SOURCE if dataset == "folder" else dataset
    data = ScenarioSpec(
        dataset=source,
        scenario="1",
        nodes=nodes,
        seed=seed,
        samples_per_class=args.samples,
        test_per_class=TEST_PER_CLASS[dataset],
    )
    if dataset == "folder":
        data = ScenarioSpec(dataset=source, nodes=nodes, seed=seed, per_node=_node_folders(data, args.out))
    return SimulationSpec(algorithm=method, data=data, rounds=args.rounds, backbones=SHAPES[shape])


def _node_folders(scenario: ScenarioSpec, out: str) -> tuple:
    """Each node's shard of `scenario` (training and test images together) as PNGs under
    OUT/folders/, one folder per node with a sub-folder per class, written once; then read back
    as `--data-per-node` reads a user's folders."""
    import numpy as np
    from PIL import Image

    from algorithms.data.setup import load_scenario, node_data
    from testnet.simulation.own_data import OwnDataArguments, own_data_specs

    images = f"{scenario.samples_per_class}+{scenario.test_per_class}"
    root = Path(out, "folders", f"{scenario.dataset}-n{scenario.nodes}-{images}-seed{scenario.seed}")
    written = root.with_name(f"{root.name}.written")  # beside it: the folder holds the nodes' alone
    if not written.exists():
        dataset, partition = load_scenario(scenario)
        for node in range(scenario.nodes):
            local = node_data(dataset, partition, node, pooled=False)
            images = np.concatenate([local.train_images.numpy(), local.test_images.numpy()])
            labels = np.concatenate([local.train_labels.numpy(), local.test_labels.numpy()])
            for index, (image, label) in enumerate(zip(images, labels, strict=True)):
                folder = root / f"node{node:02d}" / str(int(label))
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.round(image[0] * 255).astype(np.uint8), "L").save(folder / f"{index:04d}.png")
        written.touch()
    classes = tuple(str(k) for k in range(10))
    held_out = scenario.test_per_class / (scenario.test_per_class + scenario.samples_per_class)
    arguments = OwnDataArguments(None, str(root), classes, None, None, held_out, None)
    return own_data_specs(arguments, scenario.nodes, scenario.seed)[1]


def _folder(out: str, cell: tuple, method: str, seed: int) -> str:
    dataset, nodes, shape = cell
    return f"{out}/{dataset}-n{nodes}-{shape}-{method}-seed{seed}"


def _kept(cell: tuple, method: str, report: dict) -> dict:
    """What the table needs of a run's report."""
    dataset, nodes, shape = cell
    return {
        "dataset": dataset,
        "nodes": nodes,
        "backbones": shape,
        "method": method,
        "seed": report["seed"],
        "accuracy": {"mean": report["accuracy"]["mean"], "per_node": report["accuracy"]["per_node"]},
        "within_cluster_mass": report["graph"]["within_cluster_mass"],
        "kib_per_node_round": report["comm"]["bytes"] / report["nodes"] / report["rounds"] / 1024,
    }


def render(result: dict) -> str:
    """One row per cell and method: accuracy per seed and mean, the gain over Local (per seed,
    and pooled with its interval over seeds, then nodes), the worst node against its own Local,
    the within-cluster mass and the traffic."""
    data = result["data"]
    groups: dict[tuple, list[dict]] = {}
    for run in data["runs"]:
        groups.setdefault((run["dataset"], run["nodes"], run["backbones"], run["method"]), []).append(run)
    seeds = sorted({run["seed"] for run in data["runs"]})
    rows = [
        f"| dataset | nodes | backbones | method | accuracy, % (seeds {' / '.join(map(str, seeds))}; mean) "
        "| − Local per seed | − Local, points [95 % CI] | worst node − its Local | mass | KiB / node / round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, runs in groups.items():
        local = {run["seed"]: run for run in groups.get((*key[:3], "local"), [])}
        rows.append(_row(key, runs, local))
    rows += [
        "",
        f"{' and '.join(sorted({run['dataset'] for run in data['runs']}))}, Scenario 1, "
        f"{data['samples_per_class']} training images per class per node, "
        f"{data['rounds']} rounds; one backbone: the convnet everywhere, four: the CPU backbones."
        f"{_folder_note(data)} Seeds "
        f"{', '.join(map(str, data['tuning_seeds']))} chose settings and are not in the table. The interval "
        "resamples the seeds, then the nodes of each.",
    ]
    return "\n".join(rows)


def _folder_note(data: dict) -> str:
    if not any(run["dataset"] == "folder" for run in data["runs"]):
        return ""
    return " folder: each node's own folder of PNGs, written from its mnist5k shard, read back as a device's own data."


def _row(key: tuple, runs: list[dict], local: dict[int, dict]) -> str:
    from testnet.reporting.intervals import runs_bootstrap

    dataset, nodes, shape, method = key
    mean = statistics.fmean(run["accuracy"]["mean"] for run in runs) * 100
    per_seed = " / ".join(f"{run['accuracy']['mean'] * 100:.1f}" for run in runs)
    paired = method != "local" and all(run["seed"] in local for run in runs)
    gain = worst = versus = "—"
    if paired:
        differences = [
            [
                a - b
                for a, b in zip(run["accuracy"]["per_node"], local[run["seed"]]["accuracy"]["per_node"], strict=True)
            ]
            for run in runs
        ]
        versus = " / ".join(f"{statistics.fmean(d) * 100:+.1f}" for d in differences)
        centre, low, high = runs_bootstrap(differences)
        gain = f"{centre * 100:+.1f} [{low * 100:+.1f}, {high * 100:+.1f}]"
        worst = f"{min(min(d) for d in differences) * 100:+.1f}"
    masses = [run["within_cluster_mass"] for run in runs]
    mass = "—" if None in masses else f"{statistics.fmean(masses):.3f}"
    traffic = statistics.fmean(run["kib_per_node_round"] for run in runs)
    return (
        f"| {dataset} | {nodes} | {shape} | {method} | {per_seed}; {mean:.1f} | {versus} | {gain} | {worst} "
        f"| {mass} | {traffic:,.0f} |"
    )


if __name__ == "__main__":
    sys.exit(main())
