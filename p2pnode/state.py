"""The node's data directory: an exclusive lock, and small state that must survive restarts.

State is written atomically (files.py): after a crash at any moment the state file holds
either the old or the new content, never a mix.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from .files import write_atomically

__all__ = ["DataDir", "DataDirError"]


class DataDirError(Exception):
    """The data directory cannot be used; the message says why."""


class DataDir:
    """Holds the lock on a data directory for as long as the node runs (`with DataDir(...)`)."""

    STATE = "state.json"
    LOCK = "node.lock"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None

    def __enter__(self) -> DataDir:
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise DataDirError(f"cannot create data directory {self.path}: {exc.strerror or exc}") from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise DataDirError(f"data directory {self.path} is not writable")
        fd = os.open(self.path / self.LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirError(f"another p2pnode (pid {holder}) is running with data directory {self.path}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        return self

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
        write_atomically(self.path / self.STATE, json.dumps(state, sort_keys=True).encode())
