"""Where a node's model runs: the one place a device name becomes a `torch.device`.

The daemon (`[model].device`), the simulator and the testnet (`--device`) all resolve the name
here, and the result travels to the algorithm in its `NodeSetup` (`device`, `mixed_precision`):
models, optimiser state, the node's data, payloads from peers and every tensor a training step
creates live there. Random generators stay on the CPU and their draws are moved, so a node
draws the same batches and augmentations whatever its device.
"""

from __future__ import annotations

import re

import torch
from threadpoolctl import threadpool_limits

from ..catalog import DEVICE_FORMS, DEVICE_PATTERN

__all__ = ["CPU", "DeviceError", "resolve_device", "supports_mixed_precision", "placement", "set_cpu_threads"]

CPU = torch.device("cpu")


class DeviceError(ValueError):
    """A device name that is malformed, or names a device this machine does not have."""


def resolve_device(name: str) -> torch.device:
    """The device `name` means on this machine. "auto" is the current CUDA device if torch sees
    one, else Apple's MPS if present, else the CPU; a named device must exist (DeviceError)."""
    if not isinstance(name, str) or not re.fullmatch(DEVICE_PATTERN, name):
        raise DeviceError(f"{name!r} is not a device; use {DEVICE_FORMS}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps") if _mps_available() else CPU
    device = torch.device(name)
    if device.type == "cuda":
        return _cuda(name, device.index)
    if device.type == "mps" and not _mps_available():
        raise DeviceError('"mps": Apple\'s Metal backend is not available on this machine; use "cpu" or "auto"')
    return device


def _cuda(name: str, index: int | None) -> torch.device:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        why = "this torch is built without CUDA" if torch.version.cuda is None else "torch sees no CUDA GPU"
        raise DeviceError(f'"{name}": no CUDA device on this machine ({why}); use "cpu" or "auto"')
    index = torch.cuda.current_device() if index is None else index
    if index >= count:
        raise DeviceError(f'"{name}": this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}')
    return torch.device("cuda", index)


def _mps_available() -> bool:
    return torch.backends.mps.is_available()


def supports_mixed_precision(device: torch.device) -> bool:
    """Whether training on `device` can use mixed precision here (autocast to float16 with a
    gradient scaler): CUDA only; the CPU and MPS train in float32."""
    return device.type == "cuda"


def placement(name: str, mixed_precision: bool) -> tuple[torch.device, bool]:
    """The device `name` means here (`resolve_device`), and whether training there uses mixed
    precision: asked for, and the device has it (the caller says so when it does not)."""
    device = resolve_device(name)
    return device, mixed_precision and supports_mixed_precision(device)


def set_cpu_threads(threads: int) -> None:
    """Run torch's CPU kernels and numpy's BLAS (the graph and prototype maths) on `threads`
    threads each; 0 leaves both as they are. Each defaults to a thread per core, and its idle
    threads spin: several nodes on one machine (a testnet, a simulator's workers, a test suite)
    each want 1. On 2 cores, numpy's second thread cost a simulated SCooL run a third more CPU for
    the same wall time, alone on the machine; beside other work it crawls."""
    if threads:
        torch.set_num_threads(threads)
        threadpool_limits(threads, user_api="blas")  # for the process's life, as torch's
