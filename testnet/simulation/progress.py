"""A one-line progress bar on stderr for learning runs (rewritten in place on a terminal)."""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["RoundProgress"]


class RoundProgress:
    def __init__(self, label: str, stream: TextIO | None = None, width: int = 24) -> None:
        self.label = label
        self.stream = stream = stream or sys.stderr  # of the moment, not of the import
        self.width = width
        self.interactive = stream.isatty()

    def __call__(self, result) -> None:
        done = result.round / result.rounds
        filled = int(done * self.width)
        eta = result.elapsed_s / done - result.elapsed_s if done else 0.0
        line = (
            f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] round {result.round}/{result.rounds}"
            f"  acc {result.accuracy * 100:5.1f} %  in-cluster w {result.within_cluster_mass:.2f}"
            f"  {result.bytes / 2**20:7.1f} MiB  {result.elapsed_s:5.0f} s (eta {eta:.0f} s)"
        )
        if self.interactive:
            end = "\n" if result.round == result.rounds else ""
            print(f"\r{line}\x1b[K", end=end, file=self.stream, flush=True)
        elif result.round == result.rounds or result.round % max(1, result.rounds // 10) == 0:
            print(line, file=self.stream, flush=True)
