"""Running many simulations for a benchmark: each in a worker process with one torch thread
(so runs repeat exactly, and `workers` of them share the machine), its report written to its
own folder, and a summary of them all."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from multiprocessing.context import BaseContext
from pathlib import Path

from p2pnode.learning.rounds import Schedule
from testnet.reporting.provenance import CODE_ROOT, git_state
from testnet.simulation.simulator import SimulationSpec

__all__ = ["simulate_all", "write_summary"]


def _simulate(job: tuple[SimulationSpec, str]) -> dict:
    from algorithms.models.device import set_cpu_threads
    from testnet.reporting.report import write_report
    from testnet.simulation.simulator import run_simulation

    spec, out = job
    set_cpu_threads(1)
    report = run_simulation(spec)
    write_report(report, Path(out))
    return report


def simulate_all(
    jobs: Sequence[tuple[SimulationSpec, str]],
    workers: int,
    *,
    reuse: bool = False,
    start: BaseContext | None = None,
) -> list[dict]:
    """Run each (spec, output folder); returns the reports in the order of `jobs`. `start`: how
    the workers start (default: the platform's; `spawn` where they use CUDA). With `reuse`,
    a folder that already holds the report of the same spec, run by the same committed code as
    this checkout's, is read instead of run again, so an interrupted or extended benchmark only
    runs what is missing and a table never mixes code versions."""
    code = git_state(CODE_ROOT)
    reusable = reuse and code is not None and not code["dirty"]
    done = {index: _finished(spec, out, code) for index, (spec, out) in enumerate(jobs)} if reusable else {}
    todo = [job for index, job in enumerate(jobs) if done.get(index) is None]
    with ProcessPoolExecutor(workers, mp_context=start) as pool:
        fresh = iter(pool.map(_simulate, todo))
    return [done.get(index) or next(fresh) for index in range(len(jobs))]


def _finished(spec: SimulationSpec, out: str, code: dict) -> dict | None:
    path = Path(out, "report.json")
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    same = (
        (report.get("provenance") or {}).get("git") == code
        and report.get("algorithm") == spec.algorithm
        and report.get("config") == json.loads(json.dumps(spec.config_dict()))
        and report.get("backbones") == spec.node_backbones()
        and (report.get("scenario"), report.get("seed"), report.get("rounds"))
        == (spec.data.scenario, spec.seed, spec.rounds)
        and (report.get("samples_per_class"), report.get("test_per_class"))
        == (spec.data.samples_per_class, spec.data.test_per_class)
        and report.get("poisoners", []) == list(spec.poisoners)
        and (report.get("attack") or {}).get("kind", spec.attack) == spec.attack
        and (report.get("attack") or {}).get("factor", spec.attack_factor) == spec.attack_factor
        and (report.get("slow") or {}).get("nodes", []) == list(spec.slow_nodes())
        and (report.get("slow") or {}).get("factor") == (spec.slow.factor if spec.slow else None)
        and report.get("schedule", asdict(Schedule())) == asdict(spec.schedule)
    )
    return report if same else None


def write_summary(reports: list[dict], keys: Sequence[str], path: Path) -> None:
    """The named parts of every report, in one JSON file."""
    path.write_text(json.dumps([{key: report[key] for key in keys} for report in reports], indent=1))
