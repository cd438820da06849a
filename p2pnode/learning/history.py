"""The node's result on disk: `<data_dir>/history.jsonl`, one JSON line per finished round (its
`RoundRecord`), kept across restarts, for `p2pnode report` (testnet/reporting/deployment.py).

    {"start": {...}}          the driver starts its rounds: node, algorithm, classes, and
                              `resumed_from`, the checkpoint's round (null: a fresh start)
    {"round": 7, ...}         RoundRecord.to_dict() of a finished round

Restarts: a round re-run after a restart from an older checkpoint is appended again, and a start
line says from which round the node went on. Reading (`read_history`), a start line discards the
records of rounds after its `resumed_from` (their state was lost, whether they are re-run or
skipped by a catch-up), and of one round the last record wins, so the report has one record per
round: the one whose state the node carried on from.

Durability: each line is flushed and fsync'ed before the round's checkpoint is written, so a
checkpoint never covers a round whose record is not on disk. A line torn by a crash is skipped by
the reader (counted), and the next append starts on a fresh line.

Bound: when appending would take the file past `max_bytes`, it is renamed `history.jsonl.1`
(replacing an older one) and a new file begins with a copy of the last start line; the reader
reads both, so at most 2 × `max_bytes` are on disk and the latest rounds are always there.

A write that fails (a full disk) is counted and logged, never raised: learning goes on, and that
round is missing from the report.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import describe_os_error
from .rounds import RoundRecord

__all__ = ["HISTORY_NAME", "HistoryFile", "History", "read_history", "history_paths"]

HISTORY_NAME = "history.jsonl"
ROTATED_SUFFIX = ".1"

log = logging.getLogger("p2pnode.history")


def history_paths(path: Path) -> tuple[Path, Path]:
    """(the rotated file, the current one), in the order they were written."""
    return path.with_name(path.name + ROTATED_SUFFIX), path


class HistoryFile:
    """Appends the node's start and round lines to `path`, as the module docstring says."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.failures = 0  # lines not written (a full disk): those rounds are missing from the report
        self.error: str | None = None  # why the last write failed; None once one succeeds
        self.rotations = 0
        self._start: dict[str, Any] | None = None  # the last start line, repeated at the top after a rotation
        self._torn = self._ends_mid_line()

    def _ends_mid_line(self) -> bool:
        """Whether the file's last line lacks its newline (a crash cut it short)."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(-1, os.SEEK_END)
                return handle.read(1) != b"\n"
        except OSError:  # no file yet, or empty
            return False

    def start(self, details: Mapping[str, Any]) -> None:
        """The driver starts its rounds; `details` has `resumed_from` (the checkpoint's round or None)."""
        self._start = dict(details)
        self._append({"start": self._start})

    def append(self, record: RoundRecord) -> None:
        self._append(record.to_dict())

    def _append(self, entry: Mapping[str, Any]) -> None:
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        try:
            self._rotate_for(len(line))
            with self.path.open("ab") as handle:
                handle.write((b"\n" if self._torn else b"") + line)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            self._torn = True  # part of the line may be there: the next one starts afresh
            self.failures += 1
            first = self.error is None
            self.error = (
                f"{'round ' + str(entry['round']) if 'round' in entry else 'start line'}: {describe_os_error(exc)}"
            )
            # Once per streak of failures at ERROR (a full disk fails every round), the rest at DEBUG.
            log.log(
                logging.ERROR if first else logging.DEBUG,
                "[node].data_dir: history line not written to %s (%s); learning goes on, the round is missing "
                "from `p2pnode report`",
                self.path,
                self.error,
            )
            return
        if self.error is not None:
            log.warning("history lines written to %s again, after %d failures", self.path, self.failures)
        self._torn, self.error = False, None

    def _rotate_for(self, size: int) -> None:
        """Start a new file if `size` more bytes would take this one past the bound."""
        try:
            current = self.path.stat().st_size
        except FileNotFoundError:
            return
        if current + size <= self.max_bytes or current == 0:
            return
        os.replace(self.path, history_paths(self.path)[0])
        self.rotations += 1
        self._torn = False
        log.info("%s reached [algorithm].history_max_bytes (%d): renamed %s", self.path, self.max_bytes, ROTATED_SUFFIX)
        if self._start is not None:
            again = (json.dumps({"start": {**self._start, "continued": True}}, separators=(",", ":")) + "\n").encode()
            with self.path.open("ab") as handle:
                handle.write(again)

    def status(self) -> dict[str, Any]:
        return {
            "history_path": str(self.path),
            "history_failures": self.failures,
            "history_error": self.error,
            "history_rotations": self.rotations,
        }


@dataclass
class History:
    """What a history file holds: one record per round, and the start lines."""

    records: list[RoundRecord] = field(default_factory=list)  # by round
    starts: list[dict[str, Any]] = field(default_factory=list)
    unreadable: int = 0  # lines that are not JSON or not a record (a line torn by a crash)
    replaced: int = 0  # records a later one of the same round, or a restart, superseded


def read_history(path: Path) -> History:
    """The records of the history file at `path` (and its rotated part), one per round, as the
    module docstring says; raises FileNotFoundError if neither exists."""
    parts = [part for part in history_paths(path) if part.exists()]
    if not parts:
        raise FileNotFoundError(f"{path}: no history file (has this node finished a round?)")
    return _parse(line for part in parts for line in part.read_bytes().splitlines())


def _parse(lines: Iterable[bytes]) -> History:
    history = History()
    by_round: dict[int, RoundRecord] = {}
    for line in lines:
        try:
            entry = json.loads(line)
            if "start" in entry:
                start = dict(entry["start"])
            else:
                record = RoundRecord.from_dict(entry)
        except (ValueError, TypeError, AttributeError):
            history.unreadable += bool(line.strip())
            continue
        if "start" not in entry:
            history.replaced += record.round in by_round
            by_round[record.round] = record
            continue
        history.starts.append(start)
        resumed = start.get("resumed_from")
        if not start.get("continued"):
            lost = [r for r in by_round if resumed is None or r > resumed]
            history.replaced += len(lost)
            for r in lost:
                del by_round[r]
    history.records = [by_round[r] for r in sorted(by_round)]
    return history
