"""Benchmark results as data: each published table of BENCHMARKS.md is rendered from one file
under tools/bench/results/, which carries the figures and where they came from.

A result file is JSON:

    {"name": ..., "renderer": "tools.bench.protocol",   # module whose render(result) draws the table
     "provenance": {...},                                 # capture(): commit, machine, command, ...
     "data": {...}}                                       # what the benchmark measured

`provenance` says everything a reader needs to run the same thing and judge the figure: the
commit and whether the tree was dirty, the date, the machine (CPU model, cores, load average
before and after), the command line, every setting that differs from what a user gets by
default, the seeds, torch threads and number of runs. tools/bench/render.py draws the tables
into BENCHMARKS.md between `<!-- result: NAME -->` and `<!-- /result -->`, and
tests/test_bench_results.py fails when a table and its file disagree.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testnet.reporting.provenance import cpu, git_state, versions

__all__ = ["RESULTS", "REQUIRED", "capture", "save", "publish", "load", "machine"]

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[2]
# What every result's provenance holds (tests/test_bench_results.py checks it).
REQUIRED = ("commit", "dirty", "date", "machine", "command", "settings", "seeds", "threads", "runs")


def machine() -> dict[str, Any]:
    """The machine a figure was measured on, and the packages that can change it."""
    return {
        "cpu": (found := cpu())["model"],
        "instruction_set": {"torch": found["torch_capability"], "flags": found["flags"]},
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": versions(),
    }


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


@contextmanager
def capture(
    command: str | Sequence[str] | None = None,
    *,
    settings: Mapping[str, Any] | None = None,
    seeds: Sequence[int] = (),
    threads: int | None = None,
    runs: int = 1,
) -> Iterator[dict[str, Any]]:
    """The provenance of what runs inside the `with` block: filled in before it (commit, date,
    machine, load average) and completed after it (load average after). `command`: what a reader
    runs to get the figure (default: this process's command line); `settings`: every setting
    that differs from a user's default, as "section.key": value (none: {})."""
    if command is None:
        # `p2pnode ...` whether run as the script or as `python -m p2pnode_cli` (its __main__.py)
        cli = sys.argv[0].endswith("p2pnode") or Path(sys.argv[0]).parent.name == "p2pnode_cli"
        command = ["p2pnode" if cli else "python", *sys.argv[1:]]
    # A result file being written is not a change to the code that measured it.
    git = git_state(ROOT, ignore=(f"{RESULTS.relative_to(ROOT)}/",)) or {"commit": None, "dirty": None}
    provenance = {
        "commit": git["commit"],
        "dirty": git["dirty"],
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {**machine(), "load_before": _load()},
        "command": command if isinstance(command, str) else shlex.join(command),
        "settings": dict(settings or {}),
        "seeds": list(seeds),
        "threads": threads,
        "runs": runs,
    }
    yield provenance
    provenance["machine"]["load_after"] = _load()


def save(name: str, renderer: str, provenance: Mapping[str, Any], data: Any, directory: Path = RESULTS) -> Path:
    """Write result `name` (tools/bench/results/NAME.json); `renderer` is the module whose
    render(result) draws its table."""
    missing = [key for key in REQUIRED if key not in provenance]
    if missing:
        raise ValueError(f"result {name}: provenance lacks {', '.join(missing)}")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    result = {"name": name, "renderer": renderer, "provenance": dict(provenance), "data": data}
    path.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    return path


def publish(rows: list, table: str, provenance: dict[str, Any], save_as: str | None, renderer: str, data: Any) -> int:
    """A bench's end: its row count in the provenance, its table printed, and with `save_as`
    (`--save NAME`) the result file written; the exit code (0)."""
    provenance["runs"] = len(rows)
    print(table)
    if save_as:
        print(f"wrote {save(save_as, renderer, provenance, data)}")
    return 0


def load(name: str, directory: Path = RESULTS) -> dict[str, Any]:
    return json.loads((directory / f"{name}.json").read_text())
