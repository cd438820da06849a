"""Ray, the optional extra of `--engine ray` (`simulate` and `testnet`): whether it is here, asked
without importing it anywhere else, so that the default paths never load it.

It sits at the top of testnet/, in none of its rooms: both ask it, the launcher for its Ray
placement (testnet/launch/choose_placement.py) and the simulator for its Ray hosts
(testnet/simulation/rayhosts.py), and neither room may import the other's way of running Ray."""

from __future__ import annotations

__all__ = ["RAY_EXTRA", "ray_missing"]

RAY_EXTRA = "pip install 'p2pnode[ray]'"


def ray_missing() -> str | None:
    """Why the ray engine cannot run here, or None if it can."""
    try:
        import ray  # noqa: F401  (a broken install raises something else, and is not hidden)
    except ImportError:
        return f"--engine ray needs Ray, an optional extra: {RAY_EXTRA}"
    return None
