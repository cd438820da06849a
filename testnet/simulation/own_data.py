"""`p2pnode simulate` and `testnet` on the user's own data: `--data PATH` (one folder or `.npz`,
dealt out by the scenario like a benchmark) or `--data-per-node DIR` (one folder or `.npz` per
node, each node's own data, split as its daemon would split it).

Both take exactly what a daemon's `[data].path` takes and are checked by the same code
(algorithms/data/own_data.py), so they fail with the daemon's messages, naming the command line's
flags where the daemon names its settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from algorithms.data.own_data import MAX_SIDE, MIN_SIDE, OwnDataError, OwnDataSpec, folder_class_names, inspect_own_data

__all__ = ["DataArgumentError", "OwnDataArguments", "own_data_specs"]

# The daemon's settings, as the command line names them.
FLAGS = {
    "class_names": "--class-names",
    "image_size": "--image-size",
    "channels": "--channels",
    "test_fraction": "--test-fraction",
    "max_memory_mb": "--max-memory-mb",
}


class DataArgumentError(ValueError):
    """The own-data arguments cannot be used; the message starts with the flag to look at."""


@dataclass(frozen=True)
class OwnDataArguments:
    data: str | None = None  # --data
    data_per_node: str | None = None  # --data-per-node
    class_names: tuple[str, ...] = ()  # empty: the class folders' names
    image_size: int | None = None
    channels: int | None = None
    test_fraction: float | None = None  # --data-per-node only
    max_memory_mb: int | None = None

    def out_of_bounds(self) -> str | None:
        """The first setting outside the bounds `[data]` gives it (p2pnode/learning/settings.py), said so."""
        bounds = {
            "image_size": (MIN_SIDE, MAX_SIDE),
            "test_fraction": (0.01, 0.9),
            "max_memory_mb": (1, 1 << 20),
        }
        for key, (low, high) in bounds.items():
            value = getattr(self, key)
            if value is not None and not low <= value <= high:
                return f"{FLAGS[key]}: must be from {low} to {high}, got {value}"
        return None

    def given(self) -> list[str]:
        """The flags of the settings given, which describe own data."""
        return [flag for key, flag in FLAGS.items() if getattr(self, key) not in (None, ())]


def own_data_specs(
    arguments: OwnDataArguments, nodes: int, seed: int
) -> tuple[OwnDataSpec | None, tuple[OwnDataSpec, ...]]:
    """(`--data`'s spec, or None; `--data-per-node`'s specs in node order, or none), checked as a
    daemon's config check checks `[data].path` (listing, headers, labels; no pixels decoded)."""
    if arguments.data is None and arguments.data_per_node is None:
        if arguments.given():
            raise DataArgumentError(f"{arguments.given()[0]}: applies only with --data or --data-per-node")
        return None, ()
    if arguments.data is not None and arguments.data_per_node is not None:
        raise DataArgumentError("--data-per-node: give either --data (one data set, partitioned) or --data-per-node")
    flag = "--data" if arguments.data is not None else "--data-per-node"
    if arguments.out_of_bounds():
        raise DataArgumentError(arguments.out_of_bounds())
    if arguments.data is not None and arguments.test_fraction is not None:
        raise DataArgumentError(
            "--test-fraction: goes with --data-per-node; with --data the partition holds out "
            "--test-per-class images of each own class"
        )
    try:
        paths = [Path(arguments.data)] if arguments.data is not None else _entries(Path(arguments.data_per_node), nodes)
        specs = [_spec(arguments, path, _class_names(arguments, paths), seed) for path in paths]
        for spec in specs:
            inspect_own_data(spec)
    except OwnDataError as exc:
        raise DataArgumentError(_in_flags(f"{FLAGS.get(exc.field, flag)}: {exc}")) from None
    return (specs[0], ()) if arguments.data is not None else (None, tuple(specs))


def _entries(folder: Path, nodes: int) -> list[Path]:
    """One folder or .npz per node, in sorted order; `nodes` must count them."""
    if not folder.is_dir():
        raise OwnDataError(f"{folder} is not a folder holding one folder or .npz per node")
    entries = sorted(entry for entry in folder.iterdir() if not entry.name.startswith("."))
    odd = [entry.name for entry in entries if not (entry.is_dir() or entry.suffix.lower() == ".npz")]
    if odd:
        raise OwnDataError(f"{folder} holds {', '.join(odd)}: only one folder or .npz per node belongs there")
    if len(entries) != nodes:
        listed = ", ".join(entry.name for entry in entries) or "nothing"
        raise OwnDataError(
            f"{folder} holds {len(entries)} nodes' data ({listed}), but --nodes is {nodes}: give --nodes {len(entries)}"
        )
    return entries


def _class_names(arguments: OwnDataArguments, paths: list[Path]) -> tuple[str, ...]:
    """--class-names, or the class folders' names (of every node's folder), sorted."""
    if arguments.class_names:
        if len(arguments.class_names) < 2 or len(set(arguments.class_names)) != len(arguments.class_names):
            raise OwnDataError("the network's classes, at least 2, each named once", field="class_names")
        return arguments.class_names
    names: set[str] = set()
    for path in paths:
        names.update(folder_class_names(path))
    return tuple(sorted(names))


def _spec(arguments: OwnDataArguments, path: Path, class_names: tuple[str, ...], seed: int) -> OwnDataSpec:
    if path.suffix.lower() == ".npz":
        for key in ("image_size", "channels"):
            if getattr(arguments, key) is not None:
                raise OwnDataError("applies to an image folder only; a .npz's images keep their shape", field=key)
    given = {key: getattr(arguments, key) for key in ("image_size", "channels", "max_memory_mb")}
    return OwnDataSpec(
        path=path,
        class_names=class_names,
        test_fraction=arguments.test_fraction,
        seed=seed,
        **{key: value for key, value in given.items() if value is not None},
    )


def _in_flags(message: str) -> str:
    """The loader's message, with the command line's flags for the daemon's settings."""
    for key, flag in FLAGS.items():
        message = message.replace(f"[data].{key}", flag)
    return message
