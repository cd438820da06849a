"""Field codecs: one object per field describes its wire form and checks both directions.

A message body declares each field once, with `wire(codec)`; encoding, decoding and validation
all follow from that declaration, so the encoder can never emit what the decoder refuses.
Every decode check is explicit: msgpack's own leniency (bool is an int in Python, floats may be
NaN, maps may repeat keys) is closed here or in the unpacker hooks.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import ProtocolError, Reason

if TYPE_CHECKING:
    import numpy as np

    from .limits import Limits

__all__ = [
    "Codec",
    "Scalar",
    "UInt",
    "Real",
    "Text",
    "Choice",
    "Blob",
    "ListOf",
    "Nullable",
    "Tensor",
    "TensorMap",
]


def is_array(value: Any) -> bool:
    """Whether `value` is a numpy array. One can exist only once numpy is imported, and numpy
    is imported only where tensors are coded (tensors.py): a node that learns nothing never
    loads it (15 MB of its resident memory)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


def malformed(path: str, detail: str) -> ProtocolError:
    return ProtocolError(Reason.MALFORMED, f"{path}: {detail}")


class Codec:
    """Converts one field between its Python value and its msgpack object, validating both ways."""

    def encode(self, value: Any, limits: Limits, path: str) -> Any:
        raise NotImplementedError

    def decode(self, obj: Any, limits: Limits, path: str) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        """One line for docs/protocol.md and error messages."""
        raise NotImplementedError


class Scalar(Codec):
    """A codec whose wire form is the value itself: both directions run the same check."""

    def check(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def encode(self, value, limits, path):
        return self.check(value, path)

    def decode(self, obj, limits, path):
        return self.check(obj, path)


class UInt(Scalar):
    def __init__(self, bits: int = 64) -> None:
        self.max = (1 << bits) - 1
        self.bits = bits

    def check(self, value: Any, path: str) -> int:
        if type(value) is not int:  # also refuses bool, which Python counts as an int
            raise malformed(path, f"expected an unsigned integer, got {type(value).__name__}")
        if not 0 <= value <= self.max:
            raise malformed(path, f"{value} outside 0..2^{self.bits}-1")
        return value

    def describe(self):
        return f"uint{self.bits}"


class Real(Codec):
    """A finite float (msgpack float32 or float64)."""

    def encode(self, value, limits, path):
        if type(value) not in (int, float):
            raise malformed(path, f"expected a number, got {type(value).__name__}")
        return self.decode(float(value), limits, path)

    def decode(self, obj, limits, path):
        if type(obj) is not float:
            raise malformed(path, f"expected a float, got {type(obj).__name__}")
        if not math.isfinite(obj):
            raise malformed(path, "NaN or Inf")
        return obj

    def describe(self):
        return "finite float"


class Text(Scalar):
    def __init__(
        self, max_len: int, pattern: str | None = None, rule: Callable[[str], str | None] | None = None
    ) -> None:
        self.max_len = max_len
        self.pattern = re.compile(pattern) if pattern else None
        self.rule = rule  # returns a complaint, or None when the text is fine

    def check(self, value: Any, path: str) -> str:
        if type(value) is not str:
            raise malformed(path, f"expected a string, got {type(value).__name__}")
        if len(value) > self.max_len:
            raise malformed(path, f"longer than {self.max_len} characters")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise malformed(path, f"{value!r} does not match {self.pattern.pattern}")
        complaint = self.rule(value) if self.rule else None
        if complaint:
            raise malformed(path, complaint)
        return value

    def describe(self):
        pattern = f" matching `{self.pattern.pattern}`" if self.pattern else ""
        return f"str, at most {self.max_len} characters{pattern}"


class Choice(Scalar):
    def __init__(self, *values: str) -> None:
        self.values = frozenset(values)

    def check(self, value: Any, path: str) -> str:
        if type(value) is not str or value not in self.values:
            raise malformed(path, f"expected one of {sorted(self.values)}, got {value!r}")
        return value

    def describe(self):
        return "str, one of " + ", ".join(repr(v) for v in sorted(self.values))


class Blob(Codec):
    """Raw bytes (msgpack bin) of an exact size, or of at most `max_len(limits)` bytes."""

    def __init__(self, size: int | None = None, max_len: Callable[[Limits], int] | None = None, what: str = "") -> None:
        self.size = size
        self.max_len = max_len
        self.what = what

    def _check(self, value: Any, limits: Limits, path: str) -> bytes:
        if self.size is not None and len(value) != self.size:
            raise malformed(path, f"expected {self.size} bytes, got {len(value)}")
        if self.max_len is not None and len(value) > self.max_len(limits):
            raise malformed(path, f"{len(value)} bytes exceed {self.max_len(limits)}")
        return value

    def encode(self, value, limits, path):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise malformed(path, f"expected bytes, got {type(value).__name__}")
        return self._check(bytes(value), limits, path)

    def decode(self, obj, limits, path):
        if type(obj) is not bytes:
            raise malformed(path, f"expected bin, got {type(obj).__name__}")
        return self._check(obj, limits, path)

    def describe(self):
        size = f", exactly {self.size} bytes" if self.size is not None else ""
        return f"bin{size}" + (f": {self.what}" if self.what else "")


class ListOf(Codec):
    """A msgpack array; decodes to a tuple."""

    def __init__(self, item: Codec, max_len: int, min_len: int = 0, unique: bool = False) -> None:
        self.item, self.max_len, self.min_len, self.unique = item, max_len, min_len, unique

    def _check_len(self, n: int, path: str) -> None:
        if not self.min_len <= n <= self.max_len:
            raise malformed(path, f"{n} items, expected {self.min_len}..{self.max_len}")

    def _check_unique(self, items: tuple, path: str) -> tuple:
        if self.unique and len(set(items)) != len(items):
            raise malformed(path, "items repeat")
        return items

    def encode(self, value, limits, path):
        if not isinstance(value, (list, tuple)):
            raise malformed(path, f"expected a list or tuple, got {type(value).__name__}")
        self._check_len(len(value), path)
        items = [self.item.encode(v, limits, f"{path}[{i}]") for i, v in enumerate(value)]
        self._check_unique(tuple(items), path)
        return items

    def decode(self, obj, limits, path):
        if type(obj) is not list:
            raise malformed(path, f"expected an array, got {type(obj).__name__}")
        self._check_len(len(obj), path)
        return self._check_unique(tuple(self.item.decode(v, limits, f"{path}[{i}]") for i, v in enumerate(obj)), path)

    def describe(self):
        unique = ", no repeats" if self.unique else ""
        return f"array of {self.min_len}..{self.max_len} × ({self.item.describe()}){unique}"


class Nullable(Codec):
    def __init__(self, inner: Codec) -> None:
        self.inner = inner

    def encode(self, value, limits, path):
        return None if value is None else self.inner.encode(value, limits, path)

    def decode(self, obj, limits, path):
        return None if obj is None else self.inner.decode(obj, limits, path)

    def describe(self):
        return f"nil or {self.inner.describe()}"


class Tensor(Codec):
    """A tensor (see tensors.py); `rank` fixes the number of dimensions, `kinds` the dtype kinds."""

    def __init__(self, rank: int | None = None, kinds: str = "f") -> None:
        self.rank, self.kinds = rank, kinds

    def _check_rank(self, array: np.ndarray, path: str) -> np.ndarray:
        if self.rank is not None and array.ndim != self.rank:
            raise ProtocolError(Reason.BAD_TENSOR, f"{path}: expected rank {self.rank}, got shape {array.shape}")
        return array

    def encode(self, value, limits, path):
        from .tensors import encode_tensor  # numpy: only where tensors are coded (is_array)

        if is_array(value):
            self._check_rank(value, path)
        return encode_tensor(value, limits, path, self.kinds)

    def decode(self, obj, limits, path):
        from .tensors import decode_tensor

        return self._check_rank(decode_tensor(obj, limits, path, self.kinds), path)

    def describe(self):
        kinds = "float" if self.kinds == "f" else "any dtype"
        rank = f"rank {self.rank}" if self.rank is not None else "any rank"
        return f"tensor ({kinds}, {rank})"


class TensorMap(Codec):
    """Named tensors, in order (a msgpack map from name to tensor)."""

    def __init__(self, key: Text, value: Tensor, max_len: int) -> None:
        self.key, self.value, self.max_len = key, value, max_len

    def encode(self, value, limits, path):
        if not isinstance(value, dict):
            raise malformed(path, f"expected a dict, got {type(value).__name__}")
        return self._convert(value, limits, path, self.key.encode, self.value.encode)

    def decode(self, obj, limits, path):
        if type(obj) is not dict:
            raise malformed(path, f"expected a map, got {type(obj).__name__}")
        return self._convert(obj, limits, path, self.key.decode, self.value.decode)

    def _convert(self, mapping: dict, limits: Limits, path: str, key: Callable, value: Callable) -> dict:
        if len(mapping) > self.max_len:
            raise malformed(path, f"{len(mapping)} entries exceed {self.max_len}")
        return {key(k, limits, f"{path} key"): value(v, limits, f"{path}[{k!r}]") for k, v in mapping.items()}

    def describe(self):
        return f"map of at most {self.max_len} × ({self.key.describe()} → {self.value.describe()})"
