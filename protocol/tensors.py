"""Tensor codec: numpy arrays as dtype name, shape and raw little-endian bytes.

Wire form (a msgpack map with exactly these keys):
    {"dtype": str, "shape": [uint, ...], "data": bin}
`len(data)` must equal prod(shape) * itemsize. Floats must be finite and every tensor's L2 norm
must stay under `Limits.max_tensor_norm`. No pickle, no object dtypes, no byte-order flag: the
wire is always little-endian. Decoded arrays are read-only views of the received bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ProtocolError, Reason

if TYPE_CHECKING:
    from .limits import Limits

__all__ = ["WIRE_DTYPES", "encode_tensor", "decode_tensor", "check_tensor"]

WIRE_DTYPES: Mapping[str, np.dtype] = MappingProxyType(
    {
        "float16": np.dtype("<f2"),
        "float32": np.dtype("<f4"),
        "float64": np.dtype("<f8"),
        "int8": np.dtype("i1"),
        "uint8": np.dtype("u1"),
        "int16": np.dtype("<i2"),
        "int32": np.dtype("<i4"),
        "int64": np.dtype("<i8"),
        "bool": np.dtype("?"),
    }
)
_KEYS = frozenset(("dtype", "shape", "data"))
# Wire name by numpy dtype, both byte orders; `dtype.name` would do, but costs ~1.4 µs a call.
_NAME_BY_DTYPE = {dtype.newbyteorder(order): name for name, dtype in WIRE_DTYPES.items() for order in "<>"}


def _bad(path: str, detail: str) -> ProtocolError:
    return ProtocolError(Reason.BAD_TENSOR, f"{path}: {detail}")


def check_tensor(array: np.ndarray, limits: Limits, path: str, kinds: str = "fiub") -> None:
    """Rank, element count, dtype kind, finiteness and norm checks shared by both directions."""
    if array.dtype.kind not in kinds:
        raise _bad(path, f"dtype {array.dtype.name} not allowed here")
    if array.ndim > limits.max_tensor_rank:
        raise _bad(path, f"rank {array.ndim} exceeds {limits.max_tensor_rank}")
    if array.size > limits.max_tensor_elements:
        raise _bad(path, f"{array.size} elements exceed {limits.max_tensor_elements}")
    if array.size == 0:
        return
    flat = array.reshape(-1)
    kind = flat.dtype.kind
    if kind == "f":
        if flat.dtype.itemsize < 4:
            flat = flat.astype(np.float32)
        # One BLAS pass: a finite sum of squares proves every element finite. Only when it is
        # not (NaN/Inf present, or float overflow of huge values) look closer. Overflow here is
        # expected input, not a bug: keep numpy from warning about it.
        with np.errstate(over="ignore", invalid="ignore"):
            square_sum = float(np.dot(flat, flat))
        if not math.isfinite(square_sum):
            if not np.isfinite(flat).all():
                raise _bad(path, "contains NaN or Inf")
            wide = flat.astype(np.float64)
            square_sum = float(np.dot(wide, wide))
    elif kind == "b":
        as_bytes = flat.view(np.uint8)
        if as_bytes.max() > 1:
            raise _bad(path, "bool tensor holds bytes other than 0 and 1")
        square_sum = float(np.count_nonzero(as_bytes))
    else:
        wide = flat.astype(np.float64)
        square_sum = float(np.dot(wide, wide))
    if math.sqrt(square_sum) > limits.max_tensor_norm:
        raise _bad(path, f"L2 norm {math.sqrt(square_sum):.4g} exceeds {limits.max_tensor_norm:.4g}")


def encode_tensor(array: Any, limits: Limits, path: str = "tensor", kinds: str = "fiub") -> dict:
    if not isinstance(array, np.ndarray):
        raise _bad(path, f"expected a numpy array, got {type(array).__name__}")
    name = _NAME_BY_DTYPE.get(array.dtype)
    if name is None:
        raise _bad(path, f"dtype {array.dtype} has no wire form (allowed: {', '.join(WIRE_DTYPES)})")
    wire = np.asarray(array, dtype=WIRE_DTYPES[name], order="C")  # no copy if already LE, C-order
    check_tensor(wire, limits, path, kinds)
    # A flat byte view: msgpack packs it as bin without an intermediate bytes copy.
    return {"dtype": name, "shape": list(wire.shape), "data": memoryview(wire.reshape(-1).view(np.uint8))}


def decode_tensor(obj: Any, limits: Limits, path: str = "tensor", kinds: str = "fiub") -> np.ndarray:
    if not isinstance(obj, dict) or obj.keys() != _KEYS:
        raise _bad(path, "expected a map with exactly the keys dtype, shape, data")
    name, shape, data = obj["dtype"], obj["shape"], obj["data"]
    dtype = WIRE_DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise _bad(path, f"unknown dtype {name!r}")
    if not isinstance(shape, list) or len(shape) > limits.max_tensor_rank:
        raise _bad(path, f"shape must be a list of at most {limits.max_tensor_rank} dimensions")
    elements = extent = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise _bad(path, f"shape {shape!r} holds something other than a non-negative integer")
        elements *= dim
        extent *= max(dim, 1)
    # Bounding the product with zero dimensions counted as 1 also keeps an empty tensor such as
    # [0, 2**40, 2**40] out: numpy refuses to even describe it.
    if extent > limits.max_tensor_elements:
        raise _bad(path, f"shape {shape} exceeds {limits.max_tensor_elements} elements (zero dimensions counted as 1)")
    if not isinstance(data, bytes):
        raise _bad(path, "data must be bin")
    if len(data) != elements * dtype.itemsize:
        raise _bad(
            path, f"data has {len(data)} bytes, shape {shape} x {dtype.itemsize} needs {elements * dtype.itemsize}"
        )
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    check_tensor(array, limits, path, kinds)
    return array
