"""Running many simulations for a benchmark: each in a worker process with one torch thread
(so runs repeat exactly, and `workers` of them share the machine), its report written to its
own folder, and a summary of them all."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from testnet.simulator import SimulationSpec

__all__ = ["simulate_all", "write_summary"]


def _simulate(job: tuple[SimulationSpec, str]) -> dict:
    import torch

    from testnet.report import write_report
    from testnet.simulator import run_simulation

    spec, out = job
    torch.set_num_threads(1)
    report = run_simulation(spec)
    write_report(report, Path(out))
    return report


def simulate_all(jobs: Sequence[tuple[SimulationSpec, str]], workers: int) -> list[dict]:
    """Run each (spec, output folder); returns the reports in the order of `jobs`."""
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_simulate, jobs))


def write_summary(reports: list[dict], keys: Sequence[str], path: Path) -> None:
    """The named parts of every report, in one JSON file."""
    path.write_text(json.dumps([{key: report[key] for key in keys} for report in reports], indent=1))
