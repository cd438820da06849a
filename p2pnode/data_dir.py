"""The node's data directory: an exclusive lock, and small state that must survive restarts.

State is written atomically (files.py): after a crash at any moment the state file holds
either the old or the new content, never a mix. Every failed write (a full disk, a read-only
file system) becomes a DataDirError saying what and why, and leaves the old content in place.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

from .files import describe_os_error, write_atomically

__all__ = ["DataDir", "DataDirError", "DATA_DIR_MODE"]

log = logging.getLogger("p2pnode.state")

# The directory holds the sequence reservation, the checkpoints and the control socket (which
# stops the node): only the node's own user may reach any of them.
DATA_DIR_MODE = 0o700


class DataDirError(Exception):
    """The data directory cannot be used; the message says why. `unwritable`: writing to it
    failed (full, read-only, ...), so another directory would do."""

    def __init__(self, message: str, *, unwritable: bool = False) -> None:
        super().__init__(message)
        self.unwritable = unwritable


class DataDir:
    """Holds the lock on a data directory for as long as the node runs (`with DataDir(...)`)."""

    STATE = "state.json"
    LOCK = "node.lock"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None

    def __enter__(self) -> DataDir:
        try:
            self.path.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise DataDirError(
                f"cannot create data directory {self.path}: {describe_os_error(exc)}", unwritable=True
            ) from None
        _make_private(self.path)
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise DataDirError(_not_writable(self.path), unwritable=True)
        lock = self.path / self.LOCK
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise DataDirError(f"cannot open the lock file {lock}: {describe_os_error(exc)}", unwritable=True) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirError(f"another p2pnode (pid {holder}) is running with data directory {self.path}") from None
        try:
            # The pid only tells a second node who holds the lock; flock is the lock.
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:
            os.close(fd)  # releases the lock: nothing of this node stays behind
            raise DataDirError(
                f"cannot write the lock file {lock}: {describe_os_error(exc)}", unwritable=True
            ) from None
        self._lock_fd = fd
        self._remove_orphans()
        return self

    def _remove_orphans(self) -> None:
        """Temporary files of atomic writes a killed node left (files.py names them .NAME.PID.tmp):
        a checkpoint's is as large as the model, and each kill during one would leave another.
        Under the lock no other node writes here, so none of them is in use."""
        for orphan in self.path.glob(".*.*.tmp"):
            try:
                orphan.unlink()
            except OSError:
                pass  # the writes that follow say what is wrong with the directory

    def __exit__(self, *exc_info: object) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None

    def load_state(self) -> dict[str, Any]:
        path = self.path / self.STATE
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise DataDirError(f"state file {path} is unreadable ({exc}); move it away to start fresh") from None
        if not isinstance(state, dict):
            raise DataDirError(f"state file {path} does not hold a JSON object; move it away to start fresh")
        return state

    def save_state(self, state: dict[str, Any]) -> None:
        """Replace the state file; on failure the old one stays as it was."""
        path = self.path / self.STATE
        try:
            write_atomically(path, json.dumps(state, sort_keys=True).encode())
        except OSError as exc:
            raise DataDirError(
                f"cannot write the state file {path}: {describe_os_error(exc)}", unwritable=True
            ) from None


def _make_private(path: Path) -> None:
    """Leave `path` mode 0700 and this user's: a directory made before (by hand, by an older
    version, under a loose umask) is tightened, and said so; one that belongs to another user,
    or whose mode cannot be changed, stops the start."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise DataDirError(f"cannot read data directory {path}: {describe_os_error(exc)}", unwritable=True) from None
    user = os.geteuid()
    if info.st_uid != user:
        raise DataDirError(
            f"data directory {path} belongs to uid {info.st_uid}, not to this user (uid {user}): chown it to this user",
            unwritable=True,
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode == DATA_DIR_MODE:
        return
    try:
        os.chmod(path, DATA_DIR_MODE)
    except OSError as exc:
        raise DataDirError(
            f"cannot make data directory {path} private (mode 0700, it is {mode:04o}): {describe_os_error(exc)}",
            unwritable=True,
        ) from None
    kept = stat.S_IMODE(os.stat(path).st_mode)
    if kept != DATA_DIR_MODE:  # a file system without Unix modes (FAT, some network mounts)
        raise DataDirError(
            f"data directory {path} stays mode {kept:04o} after chmod 0700: its file system ignores modes; "
            "use one with Unix permissions",
            unwritable=True,
        )
    log.warning("data directory %s had mode %04o: made it 0700, for this user only", path, mode)


def _not_writable(path: Path) -> str:
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return f"data directory {path} is on a read-only file system: remount it read-write"
    return f"data directory {path} is not writable by this user (uid {os.getuid()}): give it write access"
