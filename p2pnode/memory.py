"""Give memory back to the operating system after a burst.

A flood of large frames (or one large model) leaves glibc's heap arenas holding freed pages:
the process keeps them as RSS although nothing uses them. `malloc_trim(0)` returns the free
pages of every arena; the node calls it now and then (`trim_now`), which costs a few
milliseconds and changes nothing about how memory is allocated. Elsewhere than glibc it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["trim_now", "resident_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


_TRIM = _malloc_trim()


def trim_now() -> bool:
    """Return free heap memory to the system; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def resident_bytes() -> int:
    """This process's resident memory now, in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0
