"""[data], [model] and [algorithm]: what a node learns from, with which model, and how.

Their names come from modules that import no torch, so a config loads fast; the hyper-parameters
are checked against the algorithm's own dataclass, and that one import of torch happens only for
a node that learns (`AlgorithmSettings.check`). Each section's rules are its `check`; the rules
that also need another section (`[algorithm].start_peers` and `[discovery].max_peers`, ...) are
in config/checks.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

# Names only: the data modules import numpy (15 MB), which a node that learns nothing never needs.
from algorithms.catalog import (
    ALGORITHM_NAMES,
    BACKBONE_FORMS,
    BACKBONE_PATTERN,
    DATASET_FROM_PATH,
    DATASETS,
    DEVICE_FORMS,
    DEVICE_PATTERN,
    FLOAT32_ONLY_DEVICES,
    SCENARIOS,
)

from ..options import (
    CheckContext,
    FilePath,
    Flag,
    Integer,
    IntegerChoice,
    ListOf,
    Number,
    Overrides,
    Section,
    Text,
    option,
)

if TYPE_CHECKING:
    from algorithms.data.own_data import OwnDataSpec
    from algorithms.data.setup import ScenarioSpec


# What cuts a benchmark's partition, and what describes a device's own data: never both, except
# that `dataset = "path"` deals out the images at `path` by a partition, and `node_index` numbers
# a device with its own data (it seeds its model).
_BENCHMARK_KEYS = (
    "dataset",
    "root",
    "scenario",
    "nodes",
    "node_index",
    "classes",
    "clusters",
    "samples_per_class",
    "test_per_class",
)
_OWN_DATA_KEYS = ("class_names", "image_size", "channels", "test_fraction", "max_memory_mb", "skip_damaged")
_NOT_WITH_PATH_DATASET = ("root", "classes", "test_fraction")


@dataclass(frozen=True, kw_only=True)
class DataSettings(Section):
    dataset: str = option(
        Text(choices=(*DATASETS, DATASET_FROM_PATH)),
        "mnist5k",
        "dataset; `mnist5k` and `digits` ship with Python packages, the others are read from `root`; "
        '`"path"`: the images at `path`, dealt out by the partition like a benchmark\'s (every node '
        "holds them all under the same folder or file name, which keys the partition's draws)",
    )
    root: Path | None = option(
        FilePath(),
        None,
        "local root of the torchvision datasets (never downloaded: the config check wants its files there)",
    )
    scenario: str = option(Text(choices=SCENARIOS), "1", "non-IID partition of the network (docs/learning.md)")
    nodes: int = option(
        Integer(1, 100_000), 1, "nodes the partition is cut for; every node of one network uses the same value"
    )
    node_index: int | None = option(
        Integer(0, 99_999),
        None,
        "this node's shard of the partition, 0 ≤ node_index < nodes (unset: 0); with `path` alone: the "
        "device's number, which seeds its model as that node of a simulation (unset: its node id does)",
    )
    classes: tuple[int, ...] = option(
        ListOf(Integer(0, 4095), 4096),
        (),
        "instead of a shard: train on these classes (`samples_per_class` images of "
        "each, drawn with `seed` and the node index); such nodes may share images",
    )
    clusters: int = option(Integer(0, 100_000), 0, "ground-truth clusters (0: the scenario's default), at most `nodes`")
    samples_per_class: int = option(Integer(1, 1_000_000), 25, "training samples per class of this node")
    test_per_class: int = option(Integer(1, 1_000_000), 15, "test samples per own class of this node")
    seed: int = option(
        Integer(0, 2**31 - 1), 0, "seed of the partition and of the models; the same on every node of a network"
    )
    # A device's own data ("Your own data" in docs/config.md) instead of a benchmark's shard.
    path: Path | None = option(
        FilePath(),
        None,
        "this device's own data: a folder with one sub-folder of images per class, or a `.npz` "
        '(x, y, optionally x_test, y_test); replaces `dataset` and its partition, unless `dataset = "path"`',
    )
    class_names: tuple[str, ...] = option(
        ListOf(Text(r"[^./\x00][^/\x00]{0,254}", what="a class name (no '/', not starting with '.')"), 4096),
        (),
        "with `path`, required: the network's classes, the same list on every node; a class's id is "
        "its position (folders are named after classes; .npz labels are ids)",
    )
    image_size: int | None = option(
        Integer(8, 1024), None, "with an image folder: images are resized to this side (default 28)"
    )
    channels: int | None = option(
        IntegerChoice(1, 3), None, "with an image folder: 1 (grayscale, the default) or 3 (RGB)"
    )
    test_fraction: float | None = option(
        Number(0.01, 0.9),
        None,
        "with `path`: the share of each class held out for testing, chosen with `seed` "
        "(default 0.2; not with a .npz that has x_test)",
    )
    max_memory_mb: int = option(
        Integer(1, 1 << 20), 1024, "with `path`: bound on the images in memory (float32); more is a config error"
    )
    skip_damaged: bool = option(
        Flag(),
        False,
        "with an image folder: an image that cannot be read or decoded is skipped, and the skipped ones "
        "counted and named in the log, instead of stopping the node",
    )

    def check(self, context: CheckContext) -> list[str]:
        """The own-data rules, then, for a node that learns, the partition's and the data itself as
        far as it can be checked without decoding it (algorithms/data/own_data.py)."""
        problems = self._own_data_rules(context.given)
        if not context.learns:
            return problems
        own_alone = self.path is not None and self.dataset != DATASET_FROM_PATH  # no partition: any number
        if (self.node_index or 0) >= self.nodes and not own_alone:
            problems.append(f"[data].node_index: must be below [data].nodes ({self.nodes}), got {self.node_index}")
        if self.clusters > self.nodes:
            problems.append(f"[data].clusters: cannot exceed [data].nodes ({self.nodes}), got {self.clusters}")
        from algorithms.data.datasets import missing_files

        missing = missing_files(self.dataset, self.root)
        if missing is not None:
            problems.append(f"[data].root: {missing}")
        if self.path is None or len(self.class_names) < 2:
            return problems
        from algorithms.data.own_data import OwnDataError, inspect_own_data

        try:
            inspect_own_data(self.own_data())
        except OwnDataError as exc:
            problems.append(f"[data].{exc.field}: {exc}")
        return problems

    def _own_data_rules(self, given: frozenset[str]) -> list[str]:
        """`path` against the benchmark options (by the keys the file gives), and what `path` needs
        whether a partition deals it out or not: class names, settings that fit the kind of data."""
        if self.path is None:
            problems = [
                f"[data].{key}: applies only with [data].path (a device's own data)"
                for key in _OWN_DATA_KEYS
                if key in given
            ]
            if self.dataset == DATASET_FROM_PATH:
                problems.append('[data].dataset: "path" deals out the images at [data].path: set [data].path')
            return problems
        if self.dataset == DATASET_FROM_PATH:
            problems = [
                f'[data].{key}: does not apply with [data].dataset = "path" (the partition holds out '
                "test_per_class images of each own class)"
                for key in _NOT_WITH_PATH_DATASET
                if key in given
            ]
        else:
            problems = [
                f"[data].{key}: a benchmark option, but [data].path gives this node its own data: remove one of them"
                for key in _BENCHMARK_KEYS
                if key in given and key != "node_index"
            ]
        if len(self.class_names) < 2:
            problems.append(
                "[data].class_names: required with [data].path: the network's classes, at least 2, "
                "the same list on every node"
            )
        if self.path.suffix.lower() == ".npz":
            problems += [
                f"[data].{key}: applies to an image folder only; a .npz's images keep their shape"
                for key in ("image_size", "channels")
                if key in given
            ]
        return problems

    def own_data(self) -> OwnDataSpec | None:
        """The own-data settings, defaults filled in; None for a benchmark dataset."""
        if self.path is None:
            return None
        from algorithms.data.own_data import OwnDataSpec

        given = {"image_size": self.image_size, "channels": self.channels}
        return OwnDataSpec(
            path=self.path,
            class_names=self.class_names,
            test_fraction=self.test_fraction,
            max_memory_mb=self.max_memory_mb,
            skip_damaged=self.skip_damaged,
            seed=self.seed,
            node=None if self.dataset == DATASET_FROM_PATH else self.node_index,
            **{key: value for key, value in given.items() if value is not None},
        )

    def scenario_spec(self) -> ScenarioSpec | None:
        """The network's data, which this node takes shard `node_index` of: the same object the
        simulator's spec holds and the testnet writes this section from (testnet/launch/learning.py
        `data_table`); None where the node's own data (`path` alone) is all it learns from."""
        if self.path is not None and self.dataset != DATASET_FROM_PATH:
            return None
        from algorithms.data.setup import ScenarioSpec

        return ScenarioSpec(
            dataset=self.dataset,
            scenario=self.scenario,
            nodes=self.nodes,
            seed=self.seed,
            clusters=self.clusters or None,  # 0: the scenario's default
            samples_per_class=self.samples_per_class,
            test_per_class=self.test_per_class,
            root=None if self.root is None else str(self.root),
            own=self.own_data(),
        )


@dataclass(frozen=True, kw_only=True)
class ModelSettings(Section):
    backbone: str = option(
        Text(BACKBONE_PATTERN, what=BACKBONE_FORMS),
        "convnet",
        "this node's backbone; nodes may differ, except under mapl+, dfedavgm, scool-* and sfmtl. Your own: "
        '`"module:callable"`, a callable of no arguments returning a torch `nn.Module` that maps an image batch '
        "to features, imported from `code` (docs/own-model.md)",
    )
    code: Path | None = option(
        FilePath(), None, "the folder a `module:callable` backbone is imported from first (default: this file's)"
    )
    weights: Path | None = option(
        FilePath(),
        None,
        "a state dict the backbone starts from (`torch.save(module.state_dict(), PATH)`; for your own backbone, "
        "of the module your callable returns), e.g. pretrained weights saved on the device: nothing is downloaded",
    )
    device: str = option(
        Text(DEVICE_PATTERN, what=DEVICE_FORMS),
        "auto",
        "where the model trains: `auto` is CUDA if torch sees a GPU, else Apple's MPS, else the CPU; "
        "a named device that this machine lacks stops the node at start (exit 1)",
    )
    mixed_precision: bool = option(
        Flag(),
        False,
        "CUDA only: local steps under float16 autocast with a gradient scaler; refused with `cpu` or `mps`, "
        "ignored with a warning where `auto` finds no GPU",
    )
    threads: int = option(
        Integer(0, 1024),
        1,
        "CPU threads of torch and of numpy's BLAS each (0: their defaults, a thread per core); several "
        "daemons on one machine want 1",
    )

    def check(self, context: CheckContext) -> list[str]:
        """For a node that learns: a user backbone's module and callable, found (not yet called: that
        builds it, at start); `weights` a file. Whether they fit the node's images is known when its
        model is built."""
        if not context.learns:
            return []
        problems = []
        if self.mixed_precision and self.device in FLOAT32_ONLY_DEVICES:
            problems.append(
                f'[model].mixed_precision: needs a CUDA device, not "{self.device}"; set it false '
                'or [model].device = "cuda" (or "auto")'
            )
        if self.weights is not None and not self.weights.is_file():
            problems.append(f"[model].weights: {self.weights} is not a file")
        if ":" in self.backbone:
            from algorithms.models.user_backbone import BackboneError, user_builder

            try:
                user_builder(self.backbone, self.code or context.base)
            except BackboneError as exc:
                problems.append(f"[model].backbone: {exc}")
        if self.code is not None and not self.code.is_dir():
            problems.append(f"[model].code: {self.code} is not a folder")
        return problems


@dataclass(frozen=True, kw_only=True)
class AlgorithmSettings(Section):
    name: str = option(
        Text(choices=("none", *ALGORITHM_NAMES)), "none", "learning algorithm; `none` runs discovery only"
    )
    rounds: int = option(Integer(1, 10_000_000), 60, "rounds to run; afterwards the node keeps serving until stopped")
    start_peers: int = option(
        Integer(0, 4096), 0, "wait for this many admitted peers (at most `[discovery].max_peers`) before round 0 ..."
    )
    start_timeout_s: float = option(
        Number(0, 86400),
        60.0,
        "... or this long, whichever comes first; until then the first round waits for its peers' payloads "
        "(they may still be loading), even past `round_deadline_s`",
    )
    round_deadline_s: float = option(
        Number(0.01, 86400), 30.0, "after publishing, wait at most this long for the neighbours' payloads of the round"
    )
    quorum: float = option(Number(0, 1), 1.0, "once this fraction of the expected neighbours' payloads has arrived ...")
    straggler_grace_s: float = option(
        Number(0, 86400),
        2.0,
        "... wait at most this much longer for the rest (late payloads "
        "still count next round); 1.0 waits for all, up to the deadline",
    )
    deadline: str = option(
        Text(choices=("fixed", "adaptive")),
        "fixed",
        "sync: `fixed` waits up to `round_deadline_s`; `adaptive` up to the largest, over the expected neighbours, "
        "of median + `deadline_mads` × MAD of each one's arrival delays in its last `deadline_window` rounds "
        "(at least `deadline_min_s`, at most `round_deadline_s`; fixed until a neighbour has 3)",
    )
    deadline_mads: float = option(Number(0, 100), 4.0, "`deadline = adaptive`: MADs above the median delay")
    deadline_window: int = option(Integer(3, 10_000), 20, "`deadline = adaptive`: rounds of delays kept per neighbour")
    deadline_min_s: float = option(Number(0.001, 86400), 0.5, "`deadline = adaptive`: the shortest deadline")
    schedule: str = option(
        Text(choices=("sync", "async")),
        "sync",
        "`sync`: each round waits for the neighbours' payloads of that round (quorum, grace, deadline); "
        "`async`: a round waits at most `async_gather_s`, then mixes the latest payload of each neighbour, "
        "of any round, weighted by its age (docs/learning.md); no catch-up, every node at its own pace",
    )
    async_gather_s: float = option(
        Number(0.001, 86400),
        0.1,
        "`schedule = async`: the longest a round waits for its neighbours' payloads (at most `round_deadline_s`)",
    )
    staleness_decay: float = option(
        Number(0.001, 1),
        0.9,
        "`schedule = async`: λ; a neighbour's weight w_ij is multiplied by λ^age (age: this round − the "
        "payload's round, 0 if ahead), then the row is renormalised",
    )
    max_staleness: int = option(
        Integer(0, 1000), 80, "`schedule = async`: payloads more than this many rounds old are not used"
    )
    overtime_rounds: int = option(
        Integer(0, 1_000_000),
        40,
        "`schedule = async`: after its `rounds` a node goes on, at most this many rounds more, while a neighbour "
        "it gives weight has not sent its last round yet and its latest payload is within `max_staleness` "
        "(a fast node keeps learning from neighbours that still run instead of ending on their old payloads); "
        "0: every node ends at `rounds`",
    )
    max_rounds_ahead: int = option(
        Integer(0, 1000),
        2,
        "payloads for up to this many rounds ahead of ours are buffered; "
        "further ones count as `round_ahead`; a node that was down may skip the rounds it missed ...",
    )
    catch_up_quorum: float = option(
        Number(0, 1),
        0.5,
        "... as far as this fraction of the peers it learns from, and at least 2 of them, have all reached, "
        "and never further than its own pace fits into the time it was down (a node that ran without a break "
        "skips nothing, whatever its peers say)",
    )
    inbox_frames: int = option(
        Integer(1, 1_000_000),
        4096,
        "payloads held between rounds; beyond it they are dropped and counted (`inbox_full`) ...",
    )
    peer_inbox_frames: int = option(
        Integer(1, 1_000_000),
        64,
        "... and at most this many for any one peer (`peer_inbox_full`), so no peer crowds out the others' "
        "(at most `inbox_frames`; with `[discovery].max_peers` × this within it, every peer always has room)",
    )
    checkpoint: bool = option(
        Flag(), True, "save the learning state after every round (atomically) and resume from it on start"
    )
    history_rounds: int = option(
        Integer(1, 1_000_000), 10_000, "per-round records kept for `status` (accuracy, weights, traffic)"
    )
    history_max_bytes: int = option(
        Integer(4096, 1 << 40),
        64 << 20,
        "`[node].data_dir`/history.jsonl, one line per round for `p2pnode report`, grows to this size; "
        "then it is renamed history.jsonl.1 (replacing the older one) and a new one begins, so the "
        "latest rounds are always kept in at most twice this",
    )
    local_baseline: bool = option(
        Flag(),
        False,
        "also train the `local` algorithm's model (no communication) on the same data and split, "
        "evaluated every round and checkpointed: the report says what collaboration gained over it "
        "(about doubles the local training time)",
    )
    settings: Mapping[str, str] = option(Overrides(), {}, "hyper-parameters overriding the algorithm's defaults")

    def check(self, context: CheckContext) -> list[str]:
        if not context.learns:
            return []
        problems = []
        if self.name == "oracle":
            problems.append(
                "[algorithm].name: `oracle` trains on its whole cluster's data, which no P2P node has; "
                "it exists in `p2pnode simulate` only"
            )
        if self.async_gather_s > self.round_deadline_s:
            problems.append(
                f"[algorithm].async_gather_s: must not exceed [algorithm].round_deadline_s ({self.round_deadline_s}), "
                f"got {self.async_gather_s}"
            )
        if self.peer_inbox_frames > self.inbox_frames:
            problems.append(
                f"[algorithm].peer_inbox_frames: must not exceed [algorithm].inbox_frames ({self.inbox_frames}), "
                f"got {self.peer_inbox_frames}: it is one peer's share of that queue"
            )
        from algorithms.registry import ConfigOverrideError, checked_config

        try:  # the one import of torch: a node that learns nothing never needs it
            checked_config(self.name, dict(self.settings), self.rounds, "[algorithm].rounds")
        except ConfigOverrideError as exc:
            problems.append(f"[algorithm].settings: {exc}")
        return problems


class LearningConfig(Protocol):
    """What learning reads of a node's configuration (config.Config is one): its sections above,
    and the file it came from (relative paths are the file's folder's)."""

    source: Path
    data: DataSettings
    model: ModelSettings
    algorithm: AlgorithmSettings
