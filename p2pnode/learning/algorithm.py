"""The node's algorithm, built over its data and model on its device (slow: the round driver
builds it in a worker thread), and the log lines that describe its data."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..discovery.capabilities import labels_capability
from ..memory import trim_now

if TYPE_CHECKING:
    import torch

    from algorithms.interface import Algorithm, NodeSetup
    from algorithms.models.user_backbone import BackboneFiles

    from .settings import LearningConfig, ModelSettings

__all__ = [
    "LearningSetupError",
    "backbone_files",
    "build_algorithm",
    "build_local_baseline",
    "class_list_text",
    "data_summary",
]

log = logging.getLogger("p2pnode.learning")

DAMAGED_SHOWN = 5  # skipped images named in the log line that counts them


class LearningSetupError(Exception):
    """Learning cannot start (data, model, algorithm or checkpoint); the message names the part."""


def build_algorithm(config: LearningConfig, node_id: str) -> Algorithm:
    """The node's algorithm, its share of the configured data and its model (slow: loads data
    and builds the model; run it in a worker thread)."""
    from algorithms.data.setup import forget_scenarios
    from algorithms.models.device import set_cpu_threads
    from algorithms.models.user_backbone import BackboneError
    from algorithms.registry import make_algorithm, run_config

    model, algorithm = config.model, config.algorithm
    set_cpu_threads(model.threads)
    settings = run_config(algorithm.name, dict(algorithm.settings), algorithm.rounds)
    setup = dataclasses.replace(_node_setup(config, node_id), backbone_files=backbone_files(config))
    # The node keeps its own tensors only: the dataset they were cut from, and what loading
    # it left in the heap, go back to the system (docs/daemon.md, "Memory").
    forget_scenarios()
    try:
        built = make_algorithm(algorithm.name, setup, settings)
    except BackboneError as exc:
        raise LearningSetupError(f"[model]: {exc}") from None
    trim_now()
    return built


def backbone_files(config: LearningConfig) -> BackboneFiles:
    """`[model].code` (default: the config file's folder) and `[model].weights`."""
    from algorithms.models.user_backbone import BackboneFiles

    return BackboneFiles(code=config.model.code or config.source.resolve().parent, weights=config.model.weights)


def build_local_baseline(algorithm: Algorithm, overrides: Mapping[str, str]) -> Algorithm:
    """`[algorithm].local_baseline`: the `local` algorithm (no communication) on `algorithm`'s
    own setup, so on the same data, split, backbone and device, configured with those of the
    node's `[algorithm].settings` that Local has (its `training.*`), as `simulate --baselines`
    configures it."""
    from algorithms.registry import applicable_overrides, apply_overrides, default_config, make_algorithm

    return make_algorithm(
        "local", algorithm.setup, apply_overrides(default_config("local"), applicable_overrides("local", overrides))
    )


def _node_setup(config: LearningConfig, node_id: str) -> NodeSetup:
    """The node's data (its own files, its shard of them, or its shard of the configured
    dataset) on its device."""
    from algorithms.data.own_data import OwnDataError
    from algorithms.data.setup import build_setup, own_data_setup

    data, model = config.data, config.model
    device, mixed_precision = _placement(model)
    own, scenario = data.own_data(), data.scenario_spec()
    try:
        if scenario is not None:
            return build_setup(
                scenario,
                data.node_index or 0,
                node_id,
                backbone=model.backbone,
                classes=data.classes,
                device=device,
                mixed_precision=mixed_precision,
            )
        damaged: list[str] = []
        setup = own_data_setup(
            node_id, own, backbone=model.backbone, device=device, mixed_precision=mixed_precision, damaged=damaged
        )
    except OwnDataError as exc:  # found only when decoding: a damaged image, a NaN pixel
        hint = "" if own.skip_damaged else " ([data].skip_damaged = true skips such images)"
        raise LearningSetupError(f"[data].{exc.field}: {exc}{hint}") from None
    if damaged:
        log.warning(
            "[data].skip_damaged: %d image(s) skipped, unreadable: %s%s",
            len(damaged),
            "; ".join(damaged[:DAMAGED_SHOWN]),
            "; ..." if len(damaged) > DAMAGED_SHOWN else "",
            extra={"damaged_images": len(damaged)},
        )
    summary = data_summary(own.class_names, setup.data.train_labels.cpu(), setup.data.test_labels.cpu())
    # The class list's fingerprint is what peers name when theirs differs (`learning_verdict`).
    log.info("[data].path %s: %s; class list %s", own.path, summary, labels_capability(own.class_names)[0])
    return setup


def _placement(model: ModelSettings) -> tuple[torch.device, bool]:
    """The device `[model].device` names on this machine, and whether to train there with mixed
    precision. Raises LearningSetupError if that device is not here."""
    from algorithms.models.device import DeviceError, placement

    try:
        device, mixed_precision = placement(model.device, model.mixed_precision)
    except DeviceError as exc:
        raise LearningSetupError(f"[model].device: {exc}") from None
    if model.mixed_precision and not mixed_precision:
        log.warning("[model].mixed_precision: %s has none; training in float32", device)
    log.info("the model trains on %s%s", device, " with mixed precision" if mixed_precision else "")
    return device, mixed_precision


CLASSES_SHOWN = 12  # class names a log line lists before it counts the rest


def class_list_text(class_names: tuple[str, ...]) -> str:
    """`[data].class_names` for a log line, long lists cut short."""
    shown = ", ".join(repr(name) for name in class_names[:CLASSES_SHOWN])
    more = f", ... ({len(class_names)} in all)" if len(class_names) > CLASSES_SHOWN else ""
    return f"[{shown}{more}]"


def data_summary(class_names: tuple[str, ...], train_labels, test_labels) -> str:
    """One line on a node's own data: images per class found, and of them held out for testing
    (class ids are positions in `class_names`; a class the node lacks is left out)."""
    import numpy as np

    size = len(class_names)
    train = np.bincount(np.asarray(train_labels), minlength=size)
    test = np.bincount(np.asarray(test_labels), minlength=size)
    held = [k for k in range(size) if train[k] + test[k]]
    per_class = ", ".join(f"{class_names[k]!r} {train[k] + test[k]} ({test[k]})" for k in held[:CLASSES_SHOWN])
    more = f", ... ({len(held)} classes in all)" if len(held) > CLASSES_SHOWN else ""
    return (
        f"{int(train.sum() + test.sum())} images of {len(held)}/{size} classes, {int(test.sum())} held out "
        f"for testing; per class, found (held out): {per_class}{more}"
    )
