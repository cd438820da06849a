"""The process's memory: how much it holds, and giving freed heap back to the system.

A flood of large frames (or one large model) leaves glibc's heap arenas holding freed pages:
the process keeps them as RSS although nothing uses them. `malloc_trim(0)` returns the free
pages of every arena; the node calls it (`trim_now`) after taking in many bytes, once learning
is set up (the dataset its shard was cut from is freed) and after each round (its activations
and gradients are), which costs a few milliseconds and changes nothing about how memory is
allocated. Elsewhere than glibc it is a no-op.

`resident_bytes` is the cheapest read of the size now (one small file), for polling it often;
`process_memory` reads the resident set now and at its peak (VmRSS, VmHWM in /proc/self/status):
what `p2pnode status` shows and the learning testnet reports per daemon. Not getrusage's
ru_maxrss: Linux carries that across exec, so a daemon spawned by a launcher holding 300 MB
would report the launcher's peak as its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["PAGE_BYTES", "trim_now", "limit_arenas", "resident_bytes", "process_memory"]

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MIB = 1 << 20


def _libc_function(name: str):
    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name, None) if library else None
    except OSError:
        return None


_TRIM = _libc_function("malloc_trim")
_MALLOPT = _libc_function("mallopt")
_M_ARENA_MAX = -8  # malloc.h


def limit_arenas(count: int) -> bool:
    """Let at most `count` glibc heap arenas serve the process's threads from now on (glibc's own
    bound is 8 per core). Each arena keeps the pages its thread freed: one fewer thread-local
    heap is memory the process does not hold. Call it before the threads start; False where the
    C library cannot."""
    if _MALLOPT is None or count < 1:
        return False
    return bool(_MALLOPT(_M_ARENA_MAX, count))


def trim_now() -> bool:
    """Return free heap memory to the system; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def resident_bytes(pid: int | str = "self") -> int:
    """A process's resident memory now, in bytes, this one's by default (0 where /proc is not
    there, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def process_memory(status: str = "/proc/self/status") -> dict[str, float | None]:
    """This process's resident memory now (`rss_mb`) and the most it has held since it started
    (`peak_rss_mb`), in MiB; None where the system does not say (no /proc)."""
    found: dict[str, float] = {}
    try:
        with open(status) as file:
            for line in file:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    name, kib, _unit = line.split()
                    found[name] = round(int(kib) / 1024, 1)
    except (OSError, ValueError):
        found = {}
    return {"rss_mb": found.get("VmRSS:"), "peak_rss_mb": found.get("VmHWM:")}
