"""Algorithms by name, their configurations, and `section.key=value` overrides of those."""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import catalog
from .interface import Algorithm, NodeSetup

__all__ = [
    "ALGORITHMS",
    "AlgorithmInfo",
    "ConfigOverrideError",
    "default_config",
    "apply_overrides",
    "applicable_overrides",
    "checked_config",
    "run_config",
    "make_algorithm",
    "config_as_dict",
]


@dataclass(frozen=True)
class AlgorithmInfo:
    cls: type[Algorithm]
    summary: str
    pooled_training_data: bool = False  # the driver hands the node its true cluster's pooled shard

    @property
    def homogeneous(self) -> bool:
        return self.cls.homogeneous


def _load(path: str) -> type[Algorithm]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


# The catalog's list, with each class loaded.
ALGORITHMS: Mapping[str, AlgorithmInfo] = {
    name: AlgorithmInfo(_load(entry.cls), entry.summary, entry.pooled_training_data)
    for name, entry in catalog.ALGORITHMS.items()
}


class ConfigOverrideError(ValueError):
    pass


def _info(name: str) -> AlgorithmInfo:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigOverrideError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHMS)}") from None


def default_config(name: str) -> Any:
    return _info(name).cls.config_type()


def _coerce(text: str, kind: Any, key: str) -> Any:
    origin = typing.get_origin(kind)
    optional = [t for t in typing.get_args(kind) if t is not type(None)] if origin is types.UnionType else []
    if len(optional) == 1:  # `int | None`: "none" is None (the setting's own default, as a rule)
        return None if text.lower() == "none" else _coerce(text, optional[0], key)
    try:
        if kind is bool:
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError(text)
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if kind is str:
            return text
        if origin is tuple:
            parts = [p for p in text.replace("(", "").replace(")", "").split(",") if p.strip()]
            return tuple(_coerce(p.strip(), t, key) for p, t in zip(parts, typing.get_args(kind), strict=True))
    except ValueError:
        raise ConfigOverrideError(f"{key}: {text!r} is not a valid {getattr(kind, '__name__', kind)}") from None
    raise ConfigOverrideError(f"{key}: cannot set a field of type {kind}")


def apply_overrides(config: Any, overrides: Mapping[str, str]) -> Any:
    """Return `config` with dotted keys replaced, e.g. {"graph.l2_weight": "2", "warmup_rounds": "5"}.

    Values are parsed to the field's type; the dataclass then validates them.
    """
    for key, text in overrides.items():
        config = _replace(config, key.split("."), text, key)
    return config


def applicable_overrides(algorithm: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """Those of `overrides` that `algorithm`'s configuration has (MAPL's `training.*` for Local,
    not SCooL's): how a baseline beside another algorithm's run is configured."""
    kept = {}
    for key, value in overrides.items():
        try:
            apply_overrides(default_config(algorithm), {key: value})
        except ValueError:
            continue
        kept[key] = value
    return kept


def _replace(config: Any, path: list[str], text: str, key: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(config)}
    name = path[0]
    if name not in fields:
        raise ConfigOverrideError(f"{key}: no setting {name!r} here; known: {', '.join(sorted(fields))}")
    current = getattr(config, name)
    if dataclasses.is_dataclass(current):
        if len(path) == 1:
            raise ConfigOverrideError(f"{key} is a section; set one of its keys, e.g. {key}.<name>=value")
        value = _replace(current, path[1:], text, key)
    else:
        if len(path) > 1:
            raise ConfigOverrideError(f"{key}: {name} is not a section")
        hints = typing.get_type_hints(type(config))
        value = _coerce(text, hints[name], key)
    try:
        return dataclasses.replace(config, **{name: value})
    except ValueError as exc:
        raise ConfigOverrideError(f"{key}: {exc}") from None


# Hyper-parameters naming the round from which an algorithm that learns its graph does
# something: a run that ends first never does it, which is never what was meant.
_FROM_ROUND = (
    ("warmup_rounds", "the graph is never learned"),
    ("distill_after", "nothing is ever distilled"),
    ("prune_round", "the neighbours are never pruned (prune_round=0: never prune)"),
)


# Rounds left unset (None) in an algorithm's defaults that a run sets to this share of its rounds.
_SHARE_OF_RUN = (("refit_round", 2 / 3),)  # MAPL-Auto: the choice is made, the held-out images train


def run_config(name: str, overrides: Mapping[str, str], rounds: int) -> Any:
    """The configuration algorithm `name` runs `rounds` rounds with: its defaults with
    `overrides`, where a round named in `_FROM_ROUND` left at its default takes at most a third
    of the run (MAPL's warm-up of 20 in a run of 60 or more; the paper's is a quarter of 400), so
    a short run learns its graph too, and one in `_SHARE_OF_RUN` left unset takes its share.
    What is given is kept: `checked_config` says if it does not fit."""
    config = apply_overrides(default_config(name), overrides)
    fitted = {}
    for key, _ in _FROM_ROUND:
        value = getattr(config, key, None)
        if key not in overrides and value:  # None and 0 mean "never" or "as warm-up": kept
            fitted[key] = min(value, max(1, rounds // 3))
    for key, share in _SHARE_OF_RUN:
        if key not in overrides and hasattr(config, key) and getattr(config, key) is None:
            fitted[key] = max(1, round(rounds * share))
    return dataclasses.replace(config, **fitted) if fitted else config


def checked_config(name: str, overrides: Mapping[str, str], rounds: int, rounds_name: str = "rounds") -> Any:
    """The configuration of algorithm `name` for a run of `rounds` (`run_config`), checked
    against the run (`rounds_name` is how the caller's user sets it). The daemon's config check
    and `simulate` / `testnet` all come here; ConfigOverrideError says what is wrong."""
    config = run_config(name, overrides, rounds)
    problems = []
    if name in catalog.GRAPH_LEARNING:
        for key, otherwise in _FROM_ROUND:
            value = getattr(config, key, None)
            if value is not None and value >= rounds and not (key == "prune_round" and value == 0):
                given = "given" if key in overrides else f"{name}'s default; set it lower with {key}=N"
                problems.append(f"{key}={value} ({given}) must be below {rounds_name} ({rounds}), or {otherwise}")
    if problems:
        raise ConfigOverrideError("; ".join(problems))
    return config


def config_as_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def make_algorithm(name: str, setup: NodeSetup, config: Any | None = None) -> Algorithm:
    info = _info(name)
    return info.cls(setup, config if config is not None else info.cls.config_type())
