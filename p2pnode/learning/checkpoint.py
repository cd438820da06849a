"""The learning checkpoint: everything a restarted node needs to carry on, written atomically
after every round (`[algorithm].checkpoint`), read back with `torch.load(weights_only=True)`
so that a tampered file cannot run code.

Tensors are written from CPU copies and read onto the CPU, whatever device the node trains on:
a checkpoint of a GPU node loads on a machine without one, and the algorithm's
`load_state_dict` puts each tensor where its model now is ([model].device)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import write_atomically
from .rounds import RoundRecord

__all__ = [
    "CHECKPOINT_NAME",
    "CHECKPOINT_FORMAT",
    "Checkpoint",
    "CheckpointError",
    "HeldOut",
    "save_checkpoint",
    "load_checkpoint",
    "on_cpu",
]

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = 2  # 2: history entries are RoundRecords


class CheckpointError(Exception):
    """A checkpoint exists but cannot be used; the message says why (the node does not start)."""


@dataclass(frozen=True)
class HeldOut:
    """The last evaluation, image by image: the class the node predicted for each image of its
    test split (`Evaluation.predicted`) and its true class, in the split's order. What
    `p2pnode predict` and the exported model agree with; a report's confusion matrix."""

    predicted: tuple[int, ...]
    labels: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.predicted) != len(self.labels):
            raise ValueError(f"{len(self.predicted)} held-out predictions for {len(self.labels)} images")


@dataclass(frozen=True)
class Checkpoint:
    algorithm: str
    round: int  # the last round completed
    state: dict[str, Any]  # Algorithm.state_dict()
    history: tuple[RoundRecord, ...]
    # `[algorithm].local_baseline`'s model beside the algorithm's: Local's state_dict (None: none)
    local_baseline: dict[str, Any] | None = None
    held_out: HeldOut | None = None  # of the last round's evaluation (absent in older checkpoints)

    def save(self, path: Path) -> int:
        """Write it atomically; returns its size in bytes."""
        baseline = {} if self.local_baseline is None else {"local_baseline": self.local_baseline}
        return save_checkpoint(
            path,
            {
                "format": CHECKPOINT_FORMAT,
                "algorithm": self.algorithm,
                "round": self.round,
                "state": self.state,
                "history": [record.to_dict() for record in self.history],
                **baseline,
                **(
                    {}
                    if self.held_out is None
                    else {
                        "held_out": {"predicted": list(self.held_out.predicted), "labels": list(self.held_out.labels)}
                    }
                ),
            },
        )

    @classmethod
    def load(cls, path: Path, algorithm: str) -> Checkpoint:
        """The checkpoint at `path`, which `algorithm` must have written in this format."""
        saved = load_checkpoint(path)
        if saved.get("format") != CHECKPOINT_FORMAT or saved.get("algorithm") != algorithm:
            raise CheckpointError(
                f"{path} was written by another algorithm or format ({saved.get('algorithm')!r}, format "
                f"{saved.get('format')!r}; this node runs {algorithm!r}, format {CHECKPOINT_FORMAT}); "
                "move it away to start afresh"
            )
        try:
            history = tuple(RoundRecord.from_dict(entry) for entry in saved.get("history", []))
            held_out = saved.get("held_out")
            if held_out is not None:
                held_out = HeldOut(tuple(map(int, held_out["predicted"])), tuple(map(int, held_out["labels"])))
            return cls(algorithm, int(saved["round"]), saved["state"], history, saved.get("local_baseline"), held_out)
        except (KeyError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{path}: {exc}; move it away to start afresh") from None


def save_checkpoint(path: Path, state: dict[str, Any]) -> int:
    import torch

    buffer = io.BytesIO()
    torch.save(on_cpu(state), buffer)
    data = buffer.getvalue()
    write_atomically(path, data)
    return len(data)


def on_cpu(value: Any) -> Any:
    """`value` with every tensor in it (in dicts, lists and tuples) on the CPU; tensors already
    there are not copied."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        copied = type(value)((key, on_cpu(item)) for key, item in value.items())
        if hasattr(value, "_metadata"):  # a module's state_dict: its layers' versions, for loading
            copied._metadata = value._metadata
        return copied
    if isinstance(value, (list, tuple)):
        return type(value)(on_cpu(item) for item in value)
    return value


def load_checkpoint(path: Path) -> dict[str, Any]:
    import torch

    try:
        # weights_only: tensors and plain containers only; a tampered file cannot run code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a damaged file
        raise CheckpointError(
            f"{path} cannot be read ({type(exc).__name__}: {exc}); move it away to start afresh"
        ) from None
    if not isinstance(state, dict) or "round" not in state or "state" not in state:
        raise CheckpointError(f"{path} is not a p2pnode checkpoint")
    return state
