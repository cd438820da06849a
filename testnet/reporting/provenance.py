"""Where and with what a run ran: the `provenance` of a report, so a figure can be traced back to
the code, the packages and the machine that produced it (docs/learning.md, "Report")."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["PACKAGES", "cpu", "provenance", "git_state", "versions"]

# Distributions whose version can change a result (the learning stack, the wire, the plots).
PACKAGES = (
    "p2pnode",
    "torch",
    "torchvision",
    "numpy",
    "pyzmq",
    "msgpack",
    "trio",
    "cryptography",
    "networkx",
    "mlxtend",
    "scikit-learn",
    "matplotlib",
)
CODE_ROOT = Path(__file__).resolve().parent.parent
# The CPU features that change which kernels torch runs, and so the digits of a seeded run
# (the same commit and seed gave Local 93.47 here and 94.27 on another CPU: issue #44).
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "amx_bf16",
    "amx_int8",
    "neon",
    "asimd",
)
GIT_TIMEOUT_S = 5.0


def provenance(seed: int, device: str = "cpu", *, root: Path = CODE_ROOT) -> dict[str, Any]:
    """What to record at the start of a run; `device`: where the models train, as resolved on
    this machine (algorithms/models/device.py)."""
    return {
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": list(sys.argv),
        "seed": seed,
        "device": device,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu": cpu(),
        "python": platform.python_version(),
        "packages": versions(),
        "git": git_state(root),
    }


def cpu() -> dict[str, Any]:
    """The CPU's model, the instruction set torch's kernels use on it, and its flags among ISA_FLAGS."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key.strip() in ("flags", "Features"):  # x86, arm
                flags |= set(value.split())
    except OSError:
        pass
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        capability = None
    return {"model": model, "torch_capability": capability, "flags": [flag for flag in ISA_FLAGS if flag in flags]}


def versions() -> dict[str, str | None]:
    """The versions of PACKAGES installed here."""
    return {name: _version(name) for name in PACKAGES}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_state(root: Path, ignore: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """{commit, dirty} of the checkout `root` is in, or None when it is none (an installed
    package, a tarball) or git is missing. Untracked files (reports, data) do not count as dirty,
    nor changes under the folders in `ignore` (a benchmark's own result files)."""
    try:
        commit = _git(root, "rev-parse", "HEAD")
        changes = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    changed = [line[3:] for line in changes.splitlines()]
    return {"commit": commit, "dirty": any(not path.startswith(ignore) for path in changed)}


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=True
    )
    return done.stdout.rstrip("\n")  # not strip(): a porcelain line may begin with a space
