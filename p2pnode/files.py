"""Crash-safe file writes: after a crash at any moment a file holds its old or its new
content, never a mix, and never a half-written key."""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["write_atomically", "describe_os_error"]

# What a shell user can do about a failed write, by errno.
_REMEDIES = {
    errno.ENOSPC: "free space on its file system",
    errno.EDQUOT: "raise this user's disk quota or free space",
    errno.EROFS: "remount its file system read-write",
    errno.EACCES: "give this user write access to it",
    errno.EPERM: "give this user write access to it",
}


def describe_os_error(exc: OSError) -> str:
    """The problem in words with its number, and the remedy where there is an obvious one:
    'no space left on device (errno 28): free space on its file system'."""
    if exc.errno is None:
        return str(exc)
    words = exc.strerror or os.strerror(exc.errno)
    problem = f"{words[:1].lower()}{words[1:]} (errno {exc.errno})"
    return f"{problem}: {_REMEDIES.get(exc.errno, 'check its file system')}"


def write_atomically(path: Path, data: bytes, *, mode: int = 0o600, overwrite: bool = True) -> None:
    """Write a temporary file (fsync'ed, `mode` regardless of the umask), then move it into
    place: rename when `overwrite`, else link, which fails with FileExistsError if `path` exists.
    The directory is fsync'ed too, so the new name survives a power cut. On any error (a full
    disk, say) the temporary file is removed and `path` keeps its old content."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # the umask may have cleared bits
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if overwrite:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    except OSError:
        pass  # some file systems refuse fsync on directories; the file itself is synced
    finally:
        os.close(directory)
