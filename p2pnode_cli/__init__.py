"""The `p2pnode` command line, above everything it runs: the daemon (p2pnode/), the launcher
(testnet/launch/), the simulator (testnet/simulation/) and its reports (testnet/reporting/), the
benchmarks (tools/). One module per command group; nothing imports this package.

Exit codes: 0 success; 1 the command failed (the message says why and what to do); 2 bad usage,
an invalid configuration file or a key file that cannot be used (p2pnode/exits.py).
"""

from __future__ import annotations

import argparse
import os
import sys

from p2pnode import __version__

from . import bench, keys, node, simulate, testnet
from .errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CommandError

__all__ = ["main", "build_parser", "CommandError", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="p2pnode", description="Peer-to-peer daemon for decentralized personalized learning."
    )
    parser.add_argument("--version", action="version", version=f"p2pnode {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    node.add_parsers(commands)  # start, status, doctor, stop, predict, export, init, report
    testnet.add_parser(commands)
    simulate.add_parser(commands)
    keys.add_parsers(commands)  # keygen, keyinfo
    bench.add_parsers(commands)  # bench, protocol-demo
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except CommandError as exc:
        print(f"p2pnode: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("p2pnode: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `p2pnode status | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
