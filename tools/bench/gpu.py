"""A GPU beside the CPU: the learning table's setting (mnist5k, Scenario 1, 10 nodes, 25 samples
per class, the four CPU backbones) simulated on the CPU (one torch thread, as in every CPU
table), on CUDA in float32 and on CUDA under mixed precision; accuracy and the run's wall time,
measured in one run on one machine, so the ratios hold whatever that machine is. (The
simulator's own step times are simulated seconds; the wall time is the real cost.)

    python -m tools.bench.gpu --out bench-out/gpu [--methods local mapl mapl-dual] [--seeds 1]
                              [--rounds 30] [--devices cpu cuda cuda-mixed] [--save gpu]

The CPU runs go side by side (each one thread, a core each); the CUDA runs go one at a time, so
no two share the GPU, each in a process of its own started fresh (`spawn`: CUDA cannot live in a
forked process). `--devices cpu` runs anywhere (the quick variant of tests/test_bench_commands.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor

from algorithms.data.setup import ScenarioSpec
from testnet.simulation.simulator import SimulationSpec

from .results import capture, save
from .runs import simulate_all

METHODS = ("local", "mapl", "mapl-dual")
DEVICES = {"cpu": ("cpu", False), "cuda": ("cuda", False), "cuda-mixed": ("cuda", True)}
THREADS = 1  # runs.py: every run one torch thread (on CUDA, the thread that launches the kernels)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/gpu")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--devices", nargs="+", choices=list(DEVICES), default=list(DEVICES))
    parser.add_argument("--save", metavar="NAME", help="write the runs to tools/bench/results/NAME.json")
    args = parser.parse_args(argv)

    def job(method: str, seed: int, device: str) -> tuple[SimulationSpec, str]:
        name, mixed = DEVICES[device]
        spec = SimulationSpec(
            algorithm=method,
            data=ScenarioSpec(dataset="mnist5k", seed=seed),
            rounds=args.rounds,
            device=name,
            mixed_precision=mixed,
        )
        return spec, f"{args.out}/{method}-seed{seed}-{device}"

    cpu = [job(m, s, "cpu") for m in args.methods for s in args.seeds if "cpu" in args.devices]
    gpu = [job(m, s, d) for m in args.methods for s in args.seeds for d in args.devices if d != "cpu"]
    words = ["python", "-m", "tools.bench.gpu", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, seeds=args.seeds, threads=THREADS, runs=len(cpu) + len(gpu)) as provenance:
        spawn = multiprocessing.get_context("spawn")
        if cpu and gpu:
            with ThreadPoolExecutor(2) as both:
                on_cpu = both.submit(simulate_all, cpu, len(cpu))
                on_gpu = both.submit(simulate_all, gpu, 1, start=spawn)
                reports = on_cpu.result() + on_gpu.result()
        else:
            reports = simulate_all(cpu, len(cpu)) if cpu else simulate_all(gpu, 1, start=spawn)
        if gpu:
            import torch  # after the runs: this process never held CUDA while it forked workers

            provenance["machine"]["gpu"] = torch.cuda.get_device_name(0)
    keys = ("algorithm", "seed", "device", "mixed_precision", "wall_s")
    runs = [
        {**{key: report[key] for key in keys}, "accuracy": {k: report["accuracy"][k] for k in ("mean", "per_node")}}
        for report in reports
    ]
    data = {"rounds": args.rounds, "runs": runs}
    print(render({"data": data, "provenance": provenance}))
    if args.save:
        print(f"wrote {save(args.save, 'tools.bench.gpu', provenance, data)}")
    return 0


def _setting(run: dict) -> str:
    return "cpu" if run["device"] == "cpu" else ("cuda-mixed" if run["mixed_precision"] else "cuda")


def render(result: dict) -> str:
    """One row per method and device: accuracy (mean over seeds) and its difference from the CPU
    run of the same nodes, wall time per run and per round, and the speed-up over the CPU."""
    runs = result["data"]["runs"]
    by = {(run["algorithm"], _setting(run), run["seed"]): run for run in runs}
    seeds = sorted({run["seed"] for run in runs})
    rows = [
        "| method | device | accuracy, % | − CPU, points | run, s | per round, s | × faster than the CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        for setting in DEVICES:
            mine = [by[(method, setting, seed)] for seed in seeds if (method, setting, seed) in by]
            if not mine:
                continue
            cpu = [by.get((method, "cpu", run["seed"])) for run in mine]
            accuracy = statistics.fmean(run["accuracy"]["mean"] for run in mine)
            wall = statistics.fmean(run["wall_s"] for run in mine)
            versus = faster = "—"
            if setting != "cpu" and None not in cpu:
                versus = f"{(accuracy - statistics.fmean(r['accuracy']['mean'] for r in cpu)) * 100:+.1f}"
                faster = f"{statistics.fmean(r['wall_s'] for r in cpu) / wall:.1f}"
            label = {"cpu": "CPU, 1 thread", "cuda": "CUDA, float32", "cuda-mixed": "CUDA, mixed precision"}[setting]
            rows.append(
                f"| {method} | {label} | {accuracy * 100:.1f} | {versus} | {wall:.0f} | "
                f"{wall / result['data']['rounds']:.2f} | {faster} |"
            )
    gpu = result.get("provenance", {}).get("machine", {}).get("gpu")
    rows += [
        "",
        f"{result['data']['rounds']} rounds, seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; "
        f"GPU: {gpu or 'none'}. A run's wall time holds all 10 nodes' local steps, evaluation, the graph, "
        "the simulator's exchange and the start (data, models; CUDA's own start on the GPU).",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
