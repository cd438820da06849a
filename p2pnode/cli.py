"""The `p2pnode` command line.

Exit codes: 0 success, 1 the command failed (the message says why and what to do), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A failure the user can act on; printed as `p2pnode: error: <message>`, exit code 1."""


def _keygen(args: argparse.Namespace) -> int:
    from protocol import Identity

    from .keystore import KeyFileError, write_key

    identity = Identity.generate()
    try:
        path = write_key(args.out, identity, overwrite=args.force)
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None
    print(identity.node_id)  # stdout holds only the node id, for scripts: ID=$(p2pnode keygen ...)
    print(f"wrote {path} (mode 0600); public key {identity.public_key.hex()}", file=sys.stderr)
    return EXIT_OK


def _keyinfo(args: argparse.Namespace) -> int:
    from .keystore import KeyFileError, load_key

    try:
        identity = load_key(args.key)
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None
    print(json.dumps({"node_id": identity.node_id, "public_key": identity.public_key.hex()}))
    return EXIT_OK


def _bench(args: argparse.Namespace) -> int:
    from .bench import protocol as bench

    sizes = tuple(args.sizes) if args.sizes else bench.DEFAULT_SIZES
    if args.quick:
        report = bench.run(sizes, trials=3, target_seconds=0.02)
    else:
        report = bench.run(sizes, trials=args.trials, target_seconds=args.seconds)
    text = json.dumps(report, indent=2) if args.json else bench.format_table(report)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from .protocol_demo import run

    return run(Path(args.out))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="p2pnode", description="Peer-to-peer daemon for decentralized personalized learning."
    )
    parser.add_argument("--version", action="version", version=f"p2pnode {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    keygen = commands.add_parser("keygen", help="create a node key (Ed25519, PEM, mode 0600) and print its node id")
    keygen.add_argument("--out", required=True, metavar="PATH", help="key file to create")
    keygen.add_argument("--force", action="store_true", help="replace an existing key file")
    keygen.set_defaults(run=_keygen)

    keyinfo = commands.add_parser("keyinfo", help="print the node id and public key of a key file, as JSON")
    keyinfo.add_argument("key", metavar="PATH")
    keyinfo.set_defaults(run=_keyinfo)

    bench = commands.add_parser("bench", help="run a benchmark")
    benches = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    protocol = benches.add_parser(
        "protocol", help="signed-envelope encode/decode rate next to bare Ed25519 sign/verify"
    )
    protocol.add_argument("--json", action="store_true", help="print the report as JSON")
    protocol.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE")
    protocol.add_argument("--sizes", type=_positive_int, nargs="+", metavar="BYTES", help="payload sizes (default: 1 KiB, 20 KiB, 200 KiB)")
    protocol.add_argument("--trials", type=_positive_int, default=9, help="interleaved trials per candidate (default 9)")
    protocol.add_argument("--seconds", type=_positive_float, default=0.1, help="seconds per measurement (default 0.1)")
    protocol.add_argument("--quick", action="store_true", help="a few seconds in all; for smoke tests, not for numbers")
    protocol.set_defaults(run=_bench)

    demo = commands.add_parser(
        "protocol-demo", help="two identities exchange every message type; tampered frames get rejected"
    )
    demo.add_argument("--out", default="demo-out", metavar="DIR", help="where the demo keeps its keys (default demo-out)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except CommandError as exc:
        print(f"p2pnode: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("p2pnode: interrupted", file=sys.stderr)
        return 130
