"""`p2pnode report --files`: which of a node's own images it held out for testing, and what it
predicts for each, as CSV (issue #45: the checkpoint kept predictions and labels, not names).

The names come from the node's data as it splits it (algorithms/data/own_data.py
`held_out_files`), the predictions from its checkpoint's last evaluation (`HeldOut`), in the
same order; where the two disagree on the labels (an image skipped as damaged only when decoded
shifts the split), the node's file is not written and the reason is given instead.
"""

from __future__ import annotations

import csv
from pathlib import Path

from algorithms.catalog import DATASET_FROM_PATH
from algorithms.data.own_data import OwnDataError, held_out_files
from p2pnode.config import Config
from p2pnode.learning.checkpoint import CHECKPOINT_NAME, Checkpoint, CheckpointError

__all__ = ["write_held_out"]

COLUMNS = ("file", "class", "predicted", "correct")


def write_held_out(config: Config, out: Path) -> Path:
    """Write `out` (CSV, COLUMNS: class names where the node has them) for the node of `config`;
    raises ValueError saying why it cannot."""
    own = config.data.own_data()
    if own is None or config.data.dataset == DATASET_FROM_PATH:
        raise ValueError("its data is a benchmark's shard, not files of its own: nothing to name")
    path = config.node.data_dir / CHECKPOINT_NAME
    try:
        held_out = Checkpoint.load(path, config.algorithm.name).held_out
    except (OSError, CheckpointError) as exc:
        raise ValueError(f"no checkpoint to read the predictions from ({exc})") from None
    if held_out is None:
        raise ValueError(f"{path} keeps no evaluation image by image (written by an older version)")
    try:
        files = held_out_files(own)
    except OwnDataError as exc:
        raise ValueError(f"[data]: {exc}") from None
    if tuple(k for _, k in files) != held_out.labels:
        raise ValueError("its held-out images' classes differ from its evaluation's (images skipped as damaged?)")
    names = own.class_names
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for (name, label), predicted in zip(files, held_out.predicted, strict=True):
            writer.writerow([name, names[label], names[predicted], int(label == predicted)])
    return out
