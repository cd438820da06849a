"""`bench` (tools/bench/) and `protocol-demo` (tools/protocol_demo.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .arguments import positive_float, positive_int


def _bench(args: argparse.Namespace) -> int:
    from tools.bench.command import run

    return run(args)


def _demo(args: argparse.Namespace) -> int:
    from tools.protocol_demo import run

    return run(Path(args.out))


def add_parsers(commands) -> None:
    bench = commands.add_parser("bench", help="run a benchmark")
    benches = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for name, summary, trials, seconds, quick_seconds in (
        ("protocol", "signed-envelope encode/decode rate next to bare Ed25519 sign/verify", 9, 0.1, 0.02),
        (
            "transport",
            "signed messages between two transports under trio, next to blocking pyzmq; under a user's default "
            "[transport] limits and with the rate limit lifted, side by side; refusals reported, never a hang",
            3,
            1.0,
            0.02,
        ),
        ("adapters", "raw frames through each trio-ZeroMQ integration, next to blocking pyzmq", 3, 0.5, 0.1),
    ):
        command = benches.add_parser(name, help=summary)
        command.add_argument("--json", action="store_true", help="print the report as JSON")
        command.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE")
        command.add_argument("--runs", type=positive_int, default=1, help="consecutive runs, each printed (default 1)")
        command.add_argument(
            "--save",
            metavar="NAME",
            help="write the runs and their provenance to tools/bench/results/NAME.json (BENCHMARKS.md's tables)",
        )
        command.add_argument(
            "--sizes",
            type=positive_int,
            nargs="+",
            metavar="BYTES",
            help="payload sizes (default: 1 KiB, 20 KiB, 200 KiB)",
        )
        command.add_argument(
            "--trials", type=positive_int, default=trials, help=f"interleaved trials per candidate (default {trials})"
        )
        command.add_argument(
            "--seconds", type=positive_float, default=seconds, help=f"seconds per measurement (default {seconds:g})"
        )
        command.add_argument(
            "--quick", action="store_true", help="a few seconds in all; for smoke tests, not for numbers"
        )
        if name == "transport":
            command.add_argument(
                "--presigned",
                action="store_true",
                help="both senders send frames signed beforehand: the receive path alone",
            )
        command.set_defaults(run=_bench, quick_seconds=quick_seconds)

    demo = commands.add_parser(
        "protocol-demo", help="two identities exchange every message type; tampered frames get rejected"
    )
    demo.add_argument(
        "--out", default="demo-out", metavar="DIR", help="where the demo keeps its keys (default demo-out)"
    )
    demo.set_defaults(run=_demo)
