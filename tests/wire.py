"""Test-side tools for the wire format, written from docs/protocol.md and independent of the
package's encoder: a frame builder, a deliberately non-canonical msgpack writer, and the
hypothesis strategies for tensors and bodies."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocol import (
    Bye,
    Head,
    Hello,
    Identity,
    Model,
    Peers,
    Ping,
    Pong,
    Prototypes,
    Score,
)

TAG = b"\xadp2pnode.frame"  # msgpack str "p2pnode.frame", per docs/protocol.md


def frame_from_spec(identity: Identity, envelope: list, packed: bytes | None = None) -> bytes:
    """TAG || msgpack(envelope) || Ed25519(TAG || msgpack(envelope)), as the spec says."""
    body = packed if packed is not None else msgpack.packb(envelope, use_bin_type=True)
    return TAG + body + identity.sign(TAG + body)


def widest(obj) -> bytes:
    """msgpack with the widest form of every value: valid msgpack, never the canonical bytes."""
    if obj is None:
        return b"\xc0"
    if obj is True or obj is False:
        return b"\xc3" if obj else b"\xc2"
    if isinstance(obj, int):
        return b"\xcf" + struct.pack(">Q", obj) if obj >= 0 else b"\xd3" + struct.pack(">q", obj)
    if isinstance(obj, float):
        return b"\xcb" + struct.pack(">d", obj)
    if isinstance(obj, str):
        raw = obj.encode()
        return b"\xdb" + struct.pack(">I", len(raw)) + raw
    if isinstance(obj, (bytes, bytearray, memoryview)):
        raw = bytes(obj)
        return b"\xc6" + struct.pack(">I", len(raw)) + raw
    if isinstance(obj, (list, tuple)):
        return b"\xdd" + struct.pack(">I", len(obj)) + b"".join(widest(x) for x in obj)
    if isinstance(obj, dict):
        return b"\xdf" + struct.pack(">I", len(obj)) + b"".join(widest(k) + widest(v) for k, v in obj.items())
    raise TypeError(type(obj))


# --- strategies --------------------------------------------------------------------------

FLOAT_DTYPES = ("float16", "float32", "float64")
ALL_DTYPES = (*FLOAT_DTYPES, "int8", "uint8", "int16", "int32", "int64", "bool")


def arrays(dtypes=ALL_DTYPES, min_dims=0, max_dims=4, max_side=5, shape=None):
    """Arrays whose values keep the L2 norm far below the default bound (1e6)."""

    def build(dtype_name):
        dtype = np.dtype(dtype_name)
        if dtype.kind == "f":
            elements = st.floats(-100, 100, width=dtype.itemsize * 8, allow_nan=False, allow_infinity=False)
        elif dtype.kind == "b":
            elements = st.booleans()
        else:
            info = np.iinfo(dtype)
            elements = st.integers(max(info.min, -1000), min(info.max, 1000))
        shapes = (
            shape
            if shape is not None
            else hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=max_side)
        )
        return hnp.arrays(dtype, shapes, elements=elements)

    return st.sampled_from(dtypes).flatmap(build)


tokens = st.from_regex(r"[a-z0-9][a-z0-9._:-]{0,20}", fullmatch=True)
u64 = st.integers(0, 2**64 - 1)
hosts = st.sampled_from(["127.0.0.1", "localhost", "node-3.example.org", "[::1]", "[fe80::1]", "10.0.0.7"])
addresses = st.builds(lambda h, p: f"tcp://{h}:{p}", hosts, st.integers(1, 65535))
param_names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,30}", fullmatch=True)


@st.composite
def prototypes(draw):
    classes = draw(st.lists(st.integers(0, 65535), max_size=12, unique=True))
    dim = draw(st.integers(0, 16))
    rows = draw(arrays(FLOAT_DTYPES, shape=st.just((len(classes), dim))))
    counts = draw(st.lists(st.integers(0, 2**32 - 1), min_size=len(classes), max_size=len(classes)))
    head_rows = max(classes, default=-1) + 1 + draw(st.integers(0, 3))
    # A head has a row per class id up to the largest: with ids up to 65535 it can outgrow the
    # PROTOTYPES bound (4 MiB), which no valid body does; such bodies get none.
    fits = head_rows * dim * 8 <= 1 << 20
    head = draw(st.none() | arrays(FLOAT_DTYPES, shape=st.just((head_rows, dim)))) if fits else None
    return Prototypes(classes=tuple(classes), counts=tuple(counts), prototypes=rows, head=head)


@st.composite
def heads(draw):
    rows, dim = draw(st.integers(0, 12)), draw(st.integers(0, 16))
    weight = draw(arrays(FLOAT_DTYPES, shape=st.just((rows, dim))))
    bias = draw(st.none() | arrays(FLOAT_DTYPES, shape=st.just((rows,))))
    return Head(weight=weight, bias=bias)


def hello_bodies():
    return st.builds(
        Hello,
        address=addresses,
        capabilities=st.lists(tokens, max_size=6, unique=True).map(tuple),
        dataset_size=u64,
        protocol_versions=st.lists(st.integers(0, 255), min_size=1, max_size=4, unique=True).map(tuple),
    )


def bodies(hello_frame: bytes):
    """Every message type. PEERS relays copies of `hello_frame` (a real signed HELLO)."""
    return st.one_of(
        hello_bodies(),
        st.builds(Peers, hellos=st.lists(st.just(hello_frame), max_size=4).map(tuple)),
        st.builds(Ping, nonce=u64),
        st.builds(Pong, nonce=u64),
        st.builds(Bye, reason=tokens),
        prototypes(),
        heads(),
        st.builds(
            Score,
            kind=st.sampled_from(["log_likelihood", "similarity"]),
            subject=st.binary(min_size=32, max_size=32),
            subject_seq=u64,
            value=st.floats(allow_nan=False, allow_infinity=False),
            samples=st.integers(0, 2**32 - 1),
        ),
        st.builds(
            Model,
            kind=st.sampled_from(["params", "delta"]),
            tensors=st.dictionaries(param_names, arrays(), max_size=4),
        ),
    )


# Arbitrary msgpack-able values: what a hostile but correctly signing peer could put anywhere.
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=8) | st.binary(max_size=4), children, max_size=5)
    ),
    max_leaves=20,
)
