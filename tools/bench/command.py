"""`p2pnode bench protocol|transport|adapters`: run one of the micro-benchmarks `--runs` times
in a row, print each run's table and, with `--save NAME`, write the runs as result NAME
(tools/bench/results.py) for BENCHMARKS.md to draw its table from."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from .results import capture, save

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    bench = importlib.import_module(f"tools.bench.{args.bench}")
    sizes = tuple(args.sizes) if args.sizes else bench.DEFAULT_SIZES
    trials, seconds = (2, args.quick_seconds) if args.quick else (args.trials, args.seconds)
    options = {"presigned": args.presigned} if args.bench == "transport" else {}
    with capture(settings=bench.settings(**options), runs=args.runs) as provenance:
        reports = []
        for _ in range(args.runs):
            reports.append(bench.run(sizes, trials=trials, seconds=seconds, **options))
            print(json.dumps(reports[-1], indent=2) if args.json else bench.format_table(reports[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(reports[0] if args.runs == 1 else reports, indent=2) + "\n")
    if args.save:
        print(f"wrote {save(args.save, bench.__name__, provenance, {'runs': reports})}")
    return 0
