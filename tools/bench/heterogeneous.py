"""The heterogeneous-learning benchmark of BENCHMARKS.md (issue #13): mnist5k, 10 nodes,
Scenarios 1 and 2, 5 and 10 training samples per class, 80 test samples per class (so one test
image is 0.25 points, not 1.3), 80 rounds, evaluation seeds 3/4/5, every method on the same
partitions and compared with Local on the same nodes (paired). Prints markdown tables.

    python -m tools.bench.heterogeneous --out bench-out/heterogeneous [--methods local mapl-dual]
        [--scenarios 1 2] [--samples 5 10] [--seeds 3 4 5] [--workers 2] [--set KEY=VALUE]
        [--save heterogeneous]

MAPL-Dual's defaults (distillation direction, `update-cosine` similarity, ...) were chosen on
this benchmark's seeds 0, 1 and 2, and MAPL's β, which it inherits, on seed 0: those seeds are
refused, the figures come from seeds the choices never saw. Heterogeneous methods run the four
CPU backbones (node i the i-th modulo 4); the homogeneous ones (mapl+, sfmtl, scool-attention)
run the convnet everywhere and are paired with `local@convnet` (Local with the convnet
everywhere) when it is among the methods. Scenario 2's classes 3–6 are on all 10 nodes and
mnist5k has 500 images per class, so its test split is capped at 50 − samples per class (40 at
10, 45 at 5): the training samples stay as asked. Each run is one process with one torch thread,
whatever `--workers`; a finished run of the same spec and commit is reused (tools/bench/runs.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from algorithms.data.setup import ScenarioSpec
from testnet.simulation.simulator import SimulationSpec

from .results import capture, save
from .runs import simulate_all, write_summary

METHODS = (
    "local",
    "local@convnet",
    "oracle",
    "mapl",
    "mapl+",
    "mapl-dual",
    "mapl-auto",
    "fedmrl",
    "sfmtl",
    "scool-attention",
)
BASELINES = ("local", "local@convnet", "oracle")  # run with their defaults, whatever --set says
TUNING_SEEDS = (0, 1, 2)  # MAPL-Dual's defaults were chosen on them (MAPL's β on seed 0)
THREADS = 1  # runs.py: every run one torch thread
ORDER = ("personal", "shared", "ensemble")  # MAPL-Dual's predictors, as the prose reads them


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/heterogeneous")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--scenarios", nargs="+", default=["1", "2"])
    parser.add_argument("--samples", nargs="+", type=int, default=[10, 5])
    parser.add_argument("--seeds", nargs="+", type=int, default=[3, 4, 5], help="evaluation seeds (not 0, 1, 2)")
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--test-per-class", type=int, default=80)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every method but local")
    parser.add_argument("--tag", default="", help="suffix of the run folders (for runs with --set)")
    parser.add_argument("--save", metavar="NAME", help="write the tables' runs to tools/bench/results/NAME.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    tuned = sorted(set(args.seeds) & set(TUNING_SEEDS))
    if tuned:
        parser.error(f"--seeds: seed {tuned[0]} tuned MAPL-Dual's defaults; evaluate on others (3 and up)")
    overrides = dict(item.split("=", 1) for item in args.set)

    def spec(label: str, scenario: str, samples: int, seed: int) -> SimulationSpec:
        method, _, backbone = label.partition("@")
        return SimulationSpec(
            algorithm=method,
            data=ScenarioSpec(
                dataset="mnist5k",
                scenario=scenario,
                nodes=10,
                seed=seed,
                samples_per_class=samples,
                test_per_class=min(args.test_per_class, 50 - samples) if scenario == "2" else args.test_per_class,
            ),
            rounds=args.rounds,
            backbones=(backbone,) if backbone else None,
            overrides={} if method in BASELINES else overrides,
        )

    labels = ["local", *(m for m in args.methods if m != "local")]
    runs = [
        (label, sc, n, seed) for n in args.samples for sc in args.scenarios for label in labels for seed in args.seeds
    ]
    jobs = [
        (
            spec(*run),
            f"{args.out}/sc{run[1]}-spc{run[2]}-{run[0]}{'' if run[0] in BASELINES else args.tag}-seed{run[3]}",
        )
        for run in runs
    ]
    words = ["python", "-m", "tools.bench.heterogeneous", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, settings=overrides, seeds=args.seeds, threads=THREADS, runs=len(jobs)) as provenance:
        reports = simulate_all(jobs, args.workers, reuse=True)
    keys = ("algorithm", "scenario", "samples_per_class", "seed", "accuracy", "accuracy_by_predictor", "graph", "comm")
    write_summary(reports, keys, Path(args.out, f"summary{args.tag}.json"))
    data = {
        "rounds": args.rounds,
        "test_per_class": args.test_per_class,
        "tuning_seeds": list(TUNING_SEEDS),
        "set": overrides,
        "runs": [_kept(run[0], report) for run, report in zip(runs, reports, strict=True)],
    }
    print(render({"data": data}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.heterogeneous', provenance, data)}")
    return 0


def _kept(label: str, report: dict) -> dict:
    """What the tables need of a run's report."""
    graph = report["graph"]
    return {
        "label": label,
        "algorithm": report["algorithm"],
        "scenario": report["scenario"],
        "samples_per_class": report["samples_per_class"],
        "seed": report["seed"],
        "accuracy": {key: report["accuracy"][key] for key in ("mean", "std", "per_node")},
        "accuracy_by_predictor": {
            name: {"mean": spread["mean"], "per_node": spread["per_node"]}
            for name, spread in (report.get("accuracy_by_predictor") or {}).items()
        },
        "graph": {key: graph[key] for key in ("within_cluster_mass", "l1_to_truth", "community_agreement")},
        "kib_per_node_round": report["comm"]["bytes"] / report["nodes"] / report["rounds"] / 1024,
        "wall_s": report["wall_s"],
    }


def render(result: dict) -> str:
    """The accuracy table (one row per samples, scenario and method: accuracy per seed and its
    mean, the gain over the baseline per seed and pooled over the nodes of every seed with its
    interval, the graph and traffic, means over the seeds), then each predictor of the methods
    that have several."""
    data = result["data"]
    groups: dict[tuple, list[dict]] = {}
    for run in data["runs"]:
        groups.setdefault((run["samples_per_class"], run["scenario"], run["label"]), []).append(run)
    seeds = sorted({run["seed"] for run in data["runs"]})
    rows = [
        f"| spc | scenario | method | accuracy, % (seeds {' / '.join(map(str, seeds))}; mean) | − baseline per seed "
        "| − baseline, points [95 % CI] | mass | L1 | ARI | KiB / node / round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows += [_row(groups, key, runs) for key, runs in groups.items()]
    overrides = ", ".join(f"`{key} = {value}`" for key, value in data["set"].items())
    rows += [
        "",
        f"{data['rounds']} rounds, {data['test_per_class']} test images per own class (Scenario 2: 50 − training "
        f"samples); defaults chosen on seeds {', '.join(map(str, data['tuning_seeds']))}, which the table leaves out"
        f"{f'; {overrides} for every method but the baselines' if overrides else ''}. The interval pools the nodes "
        "of every seed, each paired with its own baseline run.",
        *_predictor_table(groups),
    ]
    return "\n".join(rows)


def _row(groups: dict, key: tuple, runs: list[dict]) -> str:
    samples, scenario, label = key
    base_label, base = _baseline(groups, samples, scenario, runs)
    shown = bool(base) and label not in BASELINES
    paired = [(run["accuracy"]["mean"] - base[run["seed"]]["accuracy"]["mean"]) * 100 for run in runs] if shown else []
    mean = statistics.fmean(run["accuracy"]["mean"] for run in runs) * 100
    name, total = (f"**{label}**", f"**{mean:.1f}**") if label == "mapl-dual" else (label, f"{mean:.1f}")
    per_seed = " / ".join(f"{run['accuracy']['mean'] * 100:.1f}" for run in runs)
    versus = f"{' / '.join(f'{d:+.1f}' for d in paired)} ({base_label})" if shown else "—"

    def graph(name: str, digits: int) -> str:
        values = [run["graph"][name] for run in runs]
        return "—" if None in values else f"{statistics.fmean(values):.{digits}f}"

    return (
        f"| {samples} | {scenario} | {name} | {per_seed}; {total} | {versus} | "
        f"{_pooled(runs, base, 'accuracy') if shown else '—'} | {graph('within_cluster_mass', 3)} | "
        f"{graph('l1_to_truth', 3)} | {graph('community_agreement', 2)} | "
        f"{statistics.fmean(run['kib_per_node_round'] for run in runs):,.0f} |"
    )


def _baseline(groups: dict, samples: int, scenario: str, runs: list[dict]) -> tuple[str, dict[int, dict]]:
    """The baseline a method is paired with (Local on its backbones, or on the convnet for a
    one-backbone method when that ran), by seed."""
    from algorithms.registry import ALGORITHMS

    homogeneous = ALGORITHMS[runs[0]["algorithm"]].homogeneous
    label = "local@convnet" if homogeneous and (samples, scenario, "local@convnet") in groups else "local"
    base = {run["seed"]: run for run in groups.get((samples, scenario, label), [])}
    return label, base if all(run["seed"] in base for run in runs) else {}


def _pooled(runs: list[dict], base: dict[int, dict], key: str, predictor: str | None = None) -> str:
    """The mean per-node difference to the baseline over the nodes of every seed, with its
    interval in points: the seeds resampled, then the nodes of each (`runs_bootstrap`: a run's
    nodes share its luck)."""
    from testnet.reporting.intervals import runs_bootstrap

    def per_node(run: dict) -> list[float]:
        return run[key][predictor]["per_node"] if predictor else run[key]["per_node"]

    differences = [
        [a - b for a, b in zip(per_node(run), base[run["seed"]]["accuracy"]["per_node"], strict=True)] for run in runs
    ]
    mean, low, high = runs_bootstrap(differences)
    return f"{mean * 100:+.1f} [{low * 100:+.1f}, {high * 100:+.1f}]"


def _predictor_table(groups: dict) -> list[str]:
    """Each predictor of a method that reports several (MAPL-Dual: `personal`, the node's own
    model; `shared`, the small model; `ensemble`, the default), against the same baseline."""
    rows = []
    for (samples, scenario, label), runs in groups.items():
        predictors = sorted(
            runs[0]["accuracy_by_predictor"],
            key=lambda name: (name not in ORDER, ORDER.index(name) if name in ORDER else 0, name),
        )
        base_label, base = _baseline(groups, samples, scenario, runs)
        if len(predictors) < 2 or label in BASELINES or not base:
            continue
        for predictor in predictors:
            means = [run["accuracy_by_predictor"][predictor]["mean"] * 100 for run in runs]
            rows.append(
                f"| {samples} | {scenario} | {label} | `{predictor}` | {' / '.join(f'{m:.1f}' for m in means)}; "
                f"{statistics.fmean(means):.1f} | {_pooled(runs, base, 'accuracy_by_predictor', predictor)} "
                f"({base_label}) |"
            )
    if not rows:
        return []
    seeds = sorted({run["seed"] for runs in groups.values() for run in runs})
    header = (
        f"| spc | scenario | method | predictor | accuracy, % (seeds {' / '.join(map(str, seeds))}; mean) "
        "| − baseline, points [95 % CI] |"
    )
    return ["", "Each predictor of a node:", "", header, "|---|---|---|---|---|---|", *rows]


if __name__ == "__main__":
    sys.exit(main())
