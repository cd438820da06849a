"""Testnet against simulator (BENCHMARKS.md, issue #5 and SCooL over the network): each run as a
user launches it, `p2pnode testnet ... --check` (10 daemons on this machine), beside the
simulator on the same spec, saved as one result file.

    python -m tools.bench.parity --preset learning --seeds 1 2 --out bench-out/parity --save parity-learning
    python -m tools.bench.parity --preset scool --seeds 3 --out bench-out/parity-scool --save parity-scool
    python -m tools.bench.parity --preset dual --seeds 3 --out bench-out/parity-dual --save parity-dual

The testnet is the CLI itself, in a subprocess (its exit code is `--check`'s verdict); the
simulated runs go first, `--workers` at a time with one torch thread each, and a finished one of
the same spec and commit is reused (tools/bench/runs.py); then the testnets, one at a time, so
that a testnet never shares the cores with a simulation. Each preset refuses the seeds its
hyper-parameters were tuned on: MAPL's β on seed 0, SCooL's T and pruning round on 0, 1, 2,
MAPL-Dual's defaults on 0, 1, 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from algorithms.data.setup import ScenarioSpec
from testnet.simulation.simulator import SimulationSpec

from .heterogeneous import TUNING_SEEDS as HETEROGENEOUS_TUNING_SEEDS
from .learning import TUNING_SEEDS
from .results import capture, save
from .runs import simulate_all
from .scool import TUNING_SEEDS as SCOOL_TUNING_SEEDS

__all__ = ["PRESETS", "main", "render"]


@dataclass(frozen=True)
class Preset:
    """The (algorithm, scenario) runs of one BENCHMARKS.md table and their dataset settings."""

    runs: tuple[tuple[str, str], ...]
    rounds: int
    samples_per_class: int
    tuning_seeds: tuple[int, ...] = ()
    test_per_class: int = 15


PRESETS = {
    "learning": Preset((("mapl", "1"), ("mapl", "2"), ("mapl-nocgl", "1")), 60, 25, TUNING_SEEDS),
    "scool": Preset(
        (("scool-sbm", "noniid-sbm"), ("scool-attention", "noniid-sbm"), ("scool-dirac", "noniid-sbm")),
        30,
        10,
        SCOOL_TUNING_SEEDS,
    ),
    # make demo's setting: MAPL-Dual on the four CPU backbones, 10 training and 80 test images per class
    "dual": Preset((("mapl-dual", "1"),), 80, 10, HETEROGENEOUS_TUNING_SEEDS, test_per_class=80),
}
SIDES = ("simulator", "testnet")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=PRESETS, default="learning")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=Path("bench-out/parity"))
    parser.add_argument("--save", metavar="NAME", help="write the runs to tools/bench/results/NAME.json")
    parser.add_argument("--workers", type=int, default=2, help="simulations at once")
    parser.add_argument("--methods", nargs="+", help="only these algorithms of the preset")
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, help="default: the preset's")
    parser.add_argument("--samples-per-class", type=int, help="default: the preset's")
    parser.add_argument("--test-per-class", type=int, help="default: the preset's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a hyper-parameter, both sides")
    parser.add_argument("--check-accuracy", metavar="FRACTION", help="the testnet's (default: its own)")
    parser.add_argument("--check-mass", metavar="FRACTION", help="the testnet's (default: its own)")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    tuned = sorted(set(args.seeds) & set(preset.tuning_seeds))
    if tuned:
        parser.error(f"--seeds: seed {tuned[0]} tuned the hyper-parameters; evaluate on others")
    specs = [
        SimulationSpec(
            algorithm=algorithm,
            data=ScenarioSpec(
                dataset=args.dataset,
                scenario=scenario,
                nodes=args.nodes,
                seed=seed,
                samples_per_class=args.samples_per_class or preset.samples_per_class,
                test_per_class=args.test_per_class or preset.test_per_class,
            ),
            rounds=args.rounds or preset.rounds,
            overrides=dict(item.split("=", 1) for item in args.set),
        )
        for algorithm, scenario in preset.runs
        if not args.methods or algorithm in args.methods
        for seed in args.seeds
    ]
    words = ["python", "-m", "tools.bench.parity", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, seeds=args.seeds, threads=1, runs=2 * len(specs)) as provenance:
        jobs = [(spec, str(_folder(args.out, spec, "simulator"))) for spec in specs]
        simulated = simulate_all(jobs, args.workers, reuse=True)
        runs = [
            _pair(spec, report, _folder(args.out, spec, "testnet"), _check_words(args))
            for spec, report in zip(specs, simulated, strict=True)
        ]
    data = {
        "rounds": specs[0].rounds,
        "samples_per_class": specs[0].data.samples_per_class,
        "tuning_seeds": list(preset.tuning_seeds),
        "command": " ".join(_testnet_words(specs[0], "DIR", placeholders=True)),
        "runs": runs,
    }
    print(render({"data": data}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.parity', provenance, data)}")
    return 0 if all(run["exit_code"] == 0 for run in runs) else 1


def _folder(out: Path, spec: SimulationSpec, side: str) -> Path:
    return out / f"sc{spec.data.scenario}-{spec.algorithm}-seed{spec.seed}" / side


def _testnet_words(spec: SimulationSpec, out: str, placeholders: bool = False) -> list[str]:
    """`p2pnode testnet` as a user types it for `spec` (with A, S and SEED for what varies)."""
    data = spec.data
    algorithm, scenario, seed = ("A", "S", "SEED") if placeholders else (spec.algorithm, data.scenario, spec.seed)
    words = ["p2pnode", "testnet", "--algorithm", algorithm, "--dataset", data.dataset, "--scenario", scenario]
    words += ["--nodes", str(spec.nodes), "--rounds", str(spec.rounds), "--seed", str(seed)]
    words += ["--samples-per-class", str(data.samples_per_class), "--test-per-class", str(data.test_per_class)]
    for key, value in spec.overrides.items():
        words += ["--set", f"{key}={value}"]
    return [*words, "--out", out, "--check"]


def _check_words(args: argparse.Namespace) -> list[str]:
    """Thresholds of `--check` other than the testnet's own (quick runs learn nothing)."""
    pairs = (("--check-accuracy", args.check_accuracy), ("--check-mass", args.check_mass))
    return [word for option, value in pairs if value is not None for word in (option, value)]


def _pair(spec: SimulationSpec, simulated: dict, out: Path, check: list[str]) -> dict:
    """Run the testnet of `spec` through the CLI, in its own process, and set it beside the
    simulation of the same spec."""
    words = _testnet_words(spec, str(out)) + check
    print(" ".join(words), file=sys.stderr, flush=True)
    code = subprocess.run([sys.executable, "-m", "p2pnode_cli", *words[1:]], check=False).returncode
    if not (out / "report.json").exists():  # the command refused its arguments, or died before reporting
        raise SystemExit(f"the testnet wrote no report (exit {code}): {' '.join(words)}")
    testnet = json.loads((out / "report.json").read_text())
    return {
        "algorithm": spec.algorithm,
        "scenario": spec.data.scenario,
        "seed": spec.seed,
        "exit_code": code,
        "failures": (testnet.get("check") or {}).get("failures", []),
        "simulator": _figures(simulated),
        "testnet": _figures(testnet),
    }


def _figures(report: dict) -> dict:
    graph, comm, timing = report["graph"], report["comm"], report.get("timing") or {}
    return {
        "accuracy": report["accuracy"]["mean"],
        "accuracy_std": report["accuracy"]["std"],
        "own_class_accuracy": report["accuracy_own_classes"]["mean"],
        "within_cluster_mass": graph["within_cluster_mass"],
        "l1_to_truth": graph["l1_to_truth"],
        "messages": comm["messages"],
        "bytes": comm["bytes"],
        "envelope_overhead": comm["envelope_overhead"],
        "wall_s": report["wall_s"],
        "missing_payloads": report["missing_payloads"],
        "round_s": timing.get("round_s_mean"),
    }


COLUMNS = (  # (heading, key, format of a value, format of a difference)
    ("accuracy, % (mean ± std over nodes)", "accuracy", "{:.1f}", "{:+.1f}"),
    ("own-class accuracy, %", "own_class_accuracy", "{:.1f}", "{:+.1f}"),
    ("within-cluster mass", "within_cluster_mass", "{:.3f}", "{:+.3f}"),
    ("L1 to truth", "l1_to_truth", "{:.3f}", "{:+.3f}"),
    ("messages", "messages", "{:.0f}", "{:+.0f}"),
    ("MiB", "bytes", "{:.1f}", "{:+.1f}"),
    ("wall s", "wall_s", "{:.0f}", "{:+.0f}"),
    ("missing payloads", "missing_payloads", "{:.0f}", "{:+.0f}"),
)
SCALE = {"accuracy": 100, "own_class_accuracy": 100, "bytes": 2**-20}


def _cell(figures: dict, key: str, form: str) -> str:
    value = figures[key]
    if value is None:
        return "—"
    text = form.format(value * SCALE.get(key, 1))
    if key == "accuracy" and figures["accuracy_std"] is not None:
        text += f" ± {figures['accuracy_std'] * 100:.1f}"
    return text


def _delta(run: dict, key: str, form: str) -> str:
    testnet, simulator = run["testnet"][key], run["simulator"][key]
    if testnet is None or simulator is None:
        return "—"
    return form.format(round((testnet - simulator) * SCALE.get(key, 1), 6) + 0.0)  # + 0.0: no "-0"


def _spans(runs: list[dict]) -> str:
    """The testnets' envelope overhead and round time, lowest to highest over the runs."""
    overheads = [run["testnet"]["envelope_overhead"] for run in runs if run["testnet"]["envelope_overhead"]]
    rounds = [run["testnet"]["round_s"] for run in runs if run["testnet"]["round_s"]]
    parts = []
    if overheads:
        parts.append(f"envelope overhead (bytes on the wire ÷ tensor bytes) {min(overheads):.3f}–{max(overheads):.3f}")
    if rounds:
        parts.append(f"mean round {min(rounds):.2f}–{max(rounds):.2f} s")
    return f"Testnets: {', '.join(parts)}." if parts else ""


def render(result: dict) -> str:
    """Per run, the simulator's row, the testnet's and their difference (testnet − simulator);
    then the mean and largest difference in accuracy, and the testnets' `--check` verdicts."""
    data = result["data"]
    rows = [
        "| scenario | method | seed | run | " + " | ".join(heading for heading, *_ in COLUMNS) + " |",
        "|---|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for run in data["runs"]:
        head = f"| {run['scenario']} | {run['algorithm']} | {run['seed']} |"
        for side in SIDES:
            cells = " | ".join(_cell(run[side], key, form) for _, key, form, _ in COLUMNS)
            rows.append(f"{head} {side} | {cells} |")
        rows.append(f"{head} **Δ** | " + " | ".join(_delta(run, key, form) for _, key, _, form in COLUMNS) + " |")
    deltas = [(run["testnet"]["accuracy"] - run["simulator"]["accuracy"]) * 100 for run in data["runs"]]
    failed = [f"{run['algorithm']} {run['scenario']} seed {run['seed']}" for run in data["runs"] if run["exit_code"]]
    tuned = (
        f"; hyper-parameters tuned on seed {', '.join(map(str, data['tuning_seeds']))}, left out"
        if data["tuning_seeds"]
        else ""
    )
    rows += [
        "",
        f"Δ accuracy, testnet − simulator, over the {len(deltas)} run{'s' if len(deltas) > 1 else ''}: "
        f"mean {statistics.fmean(deltas):+.2f} points, "
        f"mean |Δ| {statistics.fmean(map(abs, deltas)):.2f}, largest |Δ| {max(map(abs, deltas)):.2f}. "
        + "Testnets' `--check`: "
        + (f"failed for {', '.join(failed)}. " if failed else "every one passed. ")
        + _spans(data["runs"]),
        f"Each testnet: `{data['command']}`; {data['rounds']} rounds, {data['samples_per_class']} training samples "
        f"per class and node{tuned}. The simulator ran the same spec.",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
