"""Key files on disk: an Ed25519 private key as unencrypted PKCS#8 PEM, mode 0600.

Like ssh, loading refuses a key that group or others can access: a node's key is its identity,
and a readable key is a key that may already be someone else's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from protocol import Identity

from ..files import write_atomically

__all__ = ["KeyFileError", "write_key", "load_key", "KEY_FILE_MODE"]

KEY_FILE_MODE = 0o600
_MAX_KEY_FILE_BYTES = 64 * 1024  # a PEM Ed25519 key is 119 bytes; anything huge is not one


class KeyFileError(Exception):
    """A key file cannot be written or used; the message says what to do about it."""


def write_key(path: str | os.PathLike, identity: Identity, *, overwrite: bool = False) -> Path:
    """Write `identity` to `path` atomically with mode 0600; never clobber unless `overwrite`."""
    path = Path(path)
    if path.is_dir():
        raise KeyFileError(f"{path} is a directory; give the path of the key file to create")
    if path.exists() and not overwrite:
        raise KeyFileError(f"{path} already exists; refusing to replace a key (pass --force to overwrite it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_atomically(path, identity.to_pem(), mode=KEY_FILE_MODE, overwrite=overwrite)
    except FileExistsError:  # someone created it between our check and the link
        raise KeyFileError(f"{path} already exists; refusing to replace a key (pass --force to overwrite it)") from None
    except OSError as exc:
        raise KeyFileError(f"cannot write key file {path}: {exc.strerror or exc}") from None
    return path


def load_key(path: str | os.PathLike) -> Identity:
    """Load a key written by `write_key` (or any unencrypted PKCS#8 Ed25519 PEM) and check it."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise KeyFileError(f"key file {path} does not exist; create one with: p2pnode keygen --out {path}") from None
    except OSError as exc:
        raise KeyFileError(f"cannot open key file {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)  # the file we opened, not whatever the path points to later
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"key file {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise KeyFileError(
                f"key file {path} is accessible by group or others (mode {mode:04o}); "
                f"a node key must be private. Fix it with: chmod 600 {path}"
            )
        data = os.read(fd, _MAX_KEY_FILE_BYTES)
    finally:
        os.close(fd)
    try:
        return Identity.from_pem(data)
    except ValueError as exc:
        raise KeyFileError(f"key file {path} is not usable: {exc}") from None
