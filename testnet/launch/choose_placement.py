"""`--engine`: which placement runs a testnet's daemons. Importing this module never imports
Ray; `--engine ray` does, and says which extra to install where Ray is missing."""

from __future__ import annotations

import sys

from ..ray_extra import ray_missing
from .placement import LocalPlacement

__all__ = ["ENGINES", "EngineUnavailable", "open_placement"]

ENGINES = ("local", "ray")


class EngineUnavailable(RuntimeError):
    """The engine asked for is not installed (a usage error: exit 2)."""


def open_placement(engine: str, *, ray_address: str | None = None, progress=None):
    """The placement of `--engine`: `local` (children of this process), or `ray` (a local Ray
    instance, or the cluster at `ray_address`). Close it (`with`) once the cluster has stopped."""
    if engine == "local":
        return LocalPlacement()
    if engine != "ray":
        raise ValueError(f"unknown engine {engine!r}: expected one of {', '.join(ENGINES)}")
    missing = ray_missing()
    if missing:
        raise EngineUnavailable(missing)
    from .raynodes import RayPlacement

    return RayPlacement.connect(ray_address, progress=progress or sys.stderr)
