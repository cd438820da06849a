"""Give memory back to the operating system after a burst.

A flood of large frames (or one large model) leaves glibc's heap arenas holding freed pages:
the process keeps them as RSS although nothing uses them. `malloc_trim(0)` returns the free
pages of every arena; the node calls it now and then (`trim_now`), which costs a few
milliseconds and changes nothing about how memory is allocated. Elsewhere than glibc it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["trim_now"]


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
