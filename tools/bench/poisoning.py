"""The poisoning benchmark of BENCHMARKS.md (issue #14, item 7): MAPL and SCooL-attention on
mnist5k, Scenario 1 (10 nodes, 2 clusters), each with one poisoning node per attack and with
its control twin (the same node honest), simulated, one torch thread per run.

    python -m tools.bench.poisoning --out bench-out/poisoning [--seeds 1 2] [--workers 2] [--attacks random]
                                    [--rounds R] [--save poisoning]

Prints, per run, the poisoner's largest weight in an honest row of W and the honest nodes' mean
accuracy every few rounds, then a summary: rounds after warm-up (SCooL has none: after round 0)
until the poisoner's weight in every honest row stays ≤ 0.02, and the honest mean accuracy at
the end with the poisoner and in the twin. The hyper-parameters were tuned on seed 0 (as in
tools/bench/learning.py), so the runs use other seeds (default 1, 2; seed 0 is refused). A
finished run of the same spec and commit is reused (tools/bench/runs.py); `--save NAME` writes
the runs as result NAME (tools/bench/results.py) for BENCHMARKS.md to draw the table from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from algorithms.data.setup import ScenarioSpec
from testnet.simulation.simulator import SimulationSpec

from .learning import THREADS, TUNING_SEEDS
from .results import capture, save
from .runs import simulate_all, write_summary

POISONER = 1  # in cluster 0 (nodes 0–4): four honest nodes share its classes
ATTACKS = (("scale", 10.0), ("scale", 1e6), ("sign-flip", 10.0), ("random", 10.0))
SETTINGS = {  # algorithm → (rounds, training samples per class, warm-up rounds)
    "mapl": (60, 25, 20),  # as the learning benchmark
    "scool-attention": (30, 10, 0),  # as the SCooL benchmark; pruning at round 10
}
BOUND = 0.02
# What a result keeps of each run's report: enough to draw the table (the per-round series that
# settle it and the last rounds' mean), not W or every node's accuracy.
KEPT = ("algorithm", "seed", "attack", "rejections", "wall_s")


def spec(algorithm: str, attack: str, factor: float, seed: int, rounds: int | None = None) -> SimulationSpec:
    default_rounds, samples, _ = SETTINGS[algorithm]
    return SimulationSpec(
        algorithm=algorithm,
        data=ScenarioSpec(
            dataset="mnist5k", scenario="1", nodes=10, seed=seed, samples_per_class=samples, test_per_class=15
        ),
        rounds=rounds or default_rounds,
        poisoners=(POISONER,),
        attack=attack,
        attack_factor=factor,
    )


def settled_after(weights: list[float], warmup: int) -> int | None:
    """Rounds after warm-up until the weight is ≤ BOUND for good (0: from the first graph round)."""
    above = [r for r, w in enumerate(weights) if w > BOUND]
    last = max(above, default=-1)
    return None if last == len(weights) - 1 else max(last + 1 - warmup, 0)


def label(report: dict) -> str:
    attack = report["attack"]
    return f"scale ×{attack['factor']:g}" if attack["kind"] == "scale" else attack["kind"]


def series(report: dict, every: int) -> str:
    poisoning = report["poisoning"]
    weight, accuracy = poisoning["poisoner_weight"]["max_per_round"], poisoning["honest_accuracy"]["per_round"]
    rounds = [r for r in range(len(weight)) if r % every == every - 1 or r < 2]
    return "\n".join(
        f"  round {r + 1:3d}: max weight {weight[r]:.3f}, honest accuracy {accuracy[r]:.3f}" for r in rounds
    )


def last_rounds(poisoning: dict, count: int = 10) -> float:
    """The honest mean accuracy averaged over the last `count` rounds: one round's test split is
    small (75 images per node here), and its noise alone moves a node by several points."""
    return float(np.mean(poisoning["honest_accuracy"]["per_round"][-count:]))


def format_table(reports: list[dict]) -> str:
    rows = [
        "| method | attack | seed | rounds after warm-up until weight ≤ 0.02 | final max / mean weight | "
        "honest accuracy, poisoned | twin | difference (points) | same, mean of the last 10 rounds | rejections |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    twins = {(r["algorithm"], r["seed"]): r for r in reports if r["attack"]["kind"] == "none"}
    for r in reports:
        if r["attack"]["kind"] == "none":
            continue
        poisoning, twin = r["poisoning"], twins[(r["algorithm"], r["seed"])]["poisoning"]
        settled = settled_after(poisoning["poisoner_weight"]["max_per_round"], SETTINGS[r["algorithm"]][2])
        ours, theirs = poisoning["honest_accuracy"]["mean"] * 100, twin["honest_accuracy"]["mean"] * 100
        late = 100 * (last_rounds(poisoning) - last_rounds(twin))
        weight = poisoning["poisoner_weight"]
        rejected = ", ".join(f"{n} {k}" for k, n in r["rejections"].items()) or "—"
        rows.append(
            f"| {r['algorithm']} | {label(r)} | {r['seed']} | {'never' if settled is None else settled} "
            f"| {weight['max']:.3f} / {weight['mean']:.3f} | {ours:.1f} | {theirs:.1f} | {ours - theirs:+.1f} "
            f"| {late:+.1f} | {rejected} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/poisoning")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="evaluation seeds (not 0)")
    parser.add_argument("--workers", type=int, default=2, help="runs at once, one torch thread each")
    parser.add_argument("--methods", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--every", type=int, default=5, help="print every k-th round of each run")
    parser.add_argument("--attacks", nargs="+", help="only these (by kind; the twin always runs)")
    parser.add_argument(
        "--rounds", type=int, help="instead of each method's (mapl 60, past its 20 warm-up rounds; scool-attention 30)"
    )
    parser.add_argument("--save", metavar="NAME", help="write the runs to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)
    tuned = sorted(set(args.seeds) & set(TUNING_SEEDS))
    if tuned:
        parser.error(f"--seeds: seed {tuned[0]} tuned the hyper-parameters; evaluate on others")

    attacks = [("none", 10.0), *(a for a in ATTACKS if args.attacks is None or a[0] in args.attacks)]
    jobs = [
        (spec(m, a, f, s, args.rounds), f"{args.out}/{m}-{a}-x{f:g}-seed{s}")
        for m in args.methods
        for s in args.seeds
        for a, f in attacks
    ]
    words = ["python", "-m", "tools.bench.poisoning", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, seeds=args.seeds, threads=THREADS, runs=len(jobs)) as provenance:
        reports = simulate_all(jobs, args.workers, reuse=True)
    for r in reports:
        print(f"{r['algorithm']}, {label(r)}, seed {r['seed']} ({r['wall_s']:.0f} s):")
        print(series(r, args.every))
    data = {"poisoner": POISONER, "settings": _settings(args.rounds), "runs": [_kept(r) for r in reports]}
    print(render({"data": data}))
    mean = np.mean([r["wall_s"] for r in reports])
    print(f"{len(reports)} runs, {mean:.0f} s each on average")
    keys = ("algorithm", "seed", "poisoners", "attack", "accuracy", "poisoning", "rejections", "wall_s")
    write_summary(reports, keys, Path(args.out, "summary.json"))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.poisoning', provenance, data)}")
    return 0


def _settings(rounds: int | None) -> dict:
    """Each method's rounds, training samples per class and warm-up, as run."""
    return {
        method: {"rounds": rounds or default, "samples_per_class": samples, "warmup": warmup}
        for method, (default, samples, warmup) in SETTINGS.items()
    }


def _kept(report: dict) -> dict:
    poisoning = report["poisoning"]
    return {
        **{key: report[key] for key in KEPT},
        "poisoning": {
            "honest_accuracy": {key: poisoning["honest_accuracy"][key] for key in ("mean", "per_round")},
            "poisoner_weight": {key: poisoning["poisoner_weight"][key] for key in ("max", "mean", "max_per_round")},
        },
    }


def render(result: dict) -> str:
    """The summary table, then how much the same node got in each twin, where it was honest
    (the zeros of the table are the graph shutting it out, not a node nobody wanted)."""
    data = result["data"]
    runs = data["runs"]
    twins = [run for run in runs if run["attack"]["kind"] == "none"]
    honest = "; ".join(
        f"{twin['algorithm']}, seed {twin['seed']}: {max(twin['poisoning']['poisoner_weight']['max_per_round']):.2f}"
        for twin in twins
    )
    rounds = ", ".join(
        f"{method} {s['rounds']} rounds, {s['samples_per_class']} training samples per class, warm-up {s['warmup']}"
        for method, s in data["settings"].items()
        if any(run["algorithm"] == method for run in runs)
    )
    return (
        f"{format_table(runs)}\n\n{rounds}; node {data['poisoner']} poisons. In the twins the same node, honest, got "
        f"at most this weight in an honest row over the run: {honest}."
    )


if __name__ == "__main__":
    raise SystemExit(main())
