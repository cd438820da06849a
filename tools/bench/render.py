"""Draw BENCHMARKS.md's tables from their result files (tools/bench/results.py).

    python -m tools.bench.render            # rewrite every table from its file (make bench-report)
    python -m tools.bench.render --check    # exit 1, naming them, if any table differs from its file

A table lives between `<!-- result: NAME -->` and `<!-- /result -->`: what is between is the
renderer's table for tools/bench/results/NAME.json, then one line of provenance, so a table
cannot drift from its data or hide a setting.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .results import RESULTS, ROOT, load

__all__ = ["render_result", "render_document", "provenance_line", "blocks"]

BENCHMARKS = ROOT / "BENCHMARKS.md"
_BLOCK = re.compile(r"(<!-- result: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /result -->)", re.DOTALL)


def blocks(text: str) -> list[str]:
    """The result names a document draws, in order."""
    return [match["name"] for match in _BLOCK.finditer(text)]


def provenance_line(name: str, provenance: Mapping[str, Any]) -> str:
    machine = provenance["machine"]
    commit = provenance["commit"] or "no git"
    dirty = " with uncommitted changes" if provenance["dirty"] else ""
    settings = provenance["settings"]
    changed = ", ".join(f"`{key} = {value}`" for key, value in settings.items()) or "none"
    seeds = ", ".join(map(str, provenance["seeds"])) or "—"
    threads = provenance["threads"] if provenance["threads"] is not None else "—"
    gpu = f", {machine['gpu']}" if machine.get("gpu") else ""
    isa = (machine.get("instruction_set") or {}).get("torch")  # older results do not say
    cpu = f"{machine['cpu']}, torch on {isa}" if isa else machine["cpu"]
    load = f"load {machine['load_before'][0]:g} → {machine.get('load_after', ['?'])[0]:g}"
    return (
        f"<sub>From `tools/bench/results/{name}.json`: `{provenance['command']}` at {commit[:10]}{dirty}, "
        f"{provenance['date']}, {cpu} ({machine['cores']} cores{gpu}, {load}); "
        f"settings other than a user's defaults: {changed}; seeds {seeds}; torch threads {threads}; "
        f"runs {provenance['runs']}.</sub>"
    )


def render_result(name: str, directory: Path = RESULTS) -> str:
    """The block body for result `name`: its renderer's table, then its provenance."""
    result = load(name, directory)
    renderer = importlib.import_module(result["renderer"])
    table = renderer.render(result).rstrip("\n")
    return f"{table}\n\n{provenance_line(name, result['provenance'])}\n"


def render_document(text: str, directory: Path = RESULTS) -> str:
    return _BLOCK.sub(lambda m: m.group(1) + render_result(m["name"], directory) + m.group(4), text)


def stale(text: str, directory: Path = RESULTS) -> list[str]:
    """The blocks whose text is not what their result file renders (or that have no file)."""
    return [
        m["name"]
        for m in _BLOCK.finditer(text)
        if not (directory / f"{m['name']}.json").exists() or m["body"] != render_result(m["name"], directory)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check: exit 1 if a table differs from its file")
    parser.add_argument("document", nargs="?", type=Path, default=BENCHMARKS)
    args = parser.parse_args(argv)
    text = args.document.read_text()
    if args.check:
        names = stale(text)
        for name in names:
            print(
                f"{args.document.name}: the table of {name} differs from tools/bench/results/{name}.json",
                file=sys.stderr,
            )
        return 1 if names else 0
    missing = [name for name in blocks(text) if not (RESULTS / f"{name}.json").exists()]
    if missing:
        print(f"{args.document.name}: no result file for {', '.join(missing)} in {RESULTS}", file=sys.stderr)
        return 1
    rendered = render_document(text)
    if rendered != text:
        args.document.write_text(rendered)
    print(f"{args.document.name}: {len(blocks(text))} tables drawn from tools/bench/results/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
