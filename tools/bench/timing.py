"""Interleaved timing: every candidate is measured in every trial, round-robin, so a slow
stretch of the machine hits all of them alike; the median over trials is reported."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping


def per_call_seconds(fn: Callable[[], object], loops: int) -> float:
    start = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - start) / loops


def calibrate(fn: Callable[[], object], target_seconds: float) -> int:
    """Loops per measurement so that one measurement takes about `target_seconds`."""
    fn()  # warm-up
    loops = 1
    while True:
        elapsed = per_call_seconds(fn, loops) * loops
        if elapsed >= target_seconds / 4 or loops >= 1 << 20:
            return max(1, int(loops * target_seconds / max(elapsed, 1e-9)))
        loops *= 4


def interleaved(candidates: Mapping[str, Callable[[], object]], trials: int, target_seconds: float) -> dict[str, float]:
    """Median seconds per call of each candidate."""
    loops = {name: calibrate(fn, target_seconds) for name, fn in candidates.items()}
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(trials):
            for name, fn in candidates.items():
                samples[name].append(per_call_seconds(fn, loops[name]))
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}
