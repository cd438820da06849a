import math

import msgpack
import numpy as np
import pytest
from hypothesis import given

from protocol import DEFAULT_LIMITS, Limits, ProtocolError, Reason
from protocol.tensors import WIRE_DTYPES, decode_tensor, encode_tensor

from .wire import arrays

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it


def roundtrip(array, limits=DEFAULT_LIMITS):
    obj = msgpack.unpackb(msgpack.packb(encode_tensor(array, limits)), raw=False)
    return decode_tensor(obj, limits)


def wire_obj(dtype="float32", shape=(2,), data=None):
    if data is None:
        data = np.zeros(shape, WIRE_DTYPES[dtype]).tobytes()
    return {"dtype": dtype, "shape": list(shape), "data": data}


def rejected(obj, limits=DEFAULT_LIMITS, kinds="fiub") -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        decode_tensor(obj, limits, "t", kinds)
    assert caught.value.reason is Reason.BAD_TENSOR
    return caught.value


@given(arrays())
def test_every_dtype_and_shape_round_trips(array):
    decoded = roundtrip(array)
    assert decoded.dtype == array.dtype.newbyteorder("<") or decoded.dtype == array.dtype
    assert decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)
    assert not decoded.flags.writeable  # a view of the received bytes, not a private copy


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">i4", ">i8", ">f2", ">i2"])
def test_big_endian_input_travels_little_endian(dtype):
    array = np.arange(12, dtype=dtype).reshape(3, 4)
    wire = encode_tensor(array, DEFAULT_LIMITS)
    assert bytes(wire["data"]) == array.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    np.testing.assert_array_equal(roundtrip(array), array)


def test_non_contiguous_input_is_packed_in_c_order():
    array = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2].T
    np.testing.assert_array_equal(roundtrip(array), array)


@pytest.mark.parametrize(
    "array",
    [
        np.zeros(2, np.complex64),
        np.zeros(2, object),
        np.array(["a"]),
        np.zeros(2, np.float128) if hasattr(np, "float128") else np.zeros(2, np.uint64),
    ],
)
def test_dtypes_without_a_wire_form_are_refused_on_encode(array):
    with pytest.raises(ProtocolError) as caught:
        encode_tensor(array, DEFAULT_LIMITS)
    assert caught.value.reason is Reason.BAD_TENSOR


def test_encode_refuses_non_arrays():
    with pytest.raises(ProtocolError):
        encode_tensor([1.0, 2.0], DEFAULT_LIMITS)


@pytest.mark.parametrize(
    "obj",
    [
        {**wire_obj(), "dtype": "float128"},
        {**wire_obj(), "dtype": "object"},
        {**wire_obj(), "dtype": 4},
        {**wire_obj(), "shape": (2,)},  # a tuple is not what msgpack gives: only lists pass
        {**wire_obj(), "shape": [2.0]},
        {**wire_obj(), "shape": [True, True]},
        {**wire_obj(), "shape": [-2]},
        {**wire_obj(), "data": "\x00" * 8},
        {**wire_obj(), "data": b"\x00" * 7},
        {**wire_obj(), "data": b"\x00" * 9},
        {"dtype": "float32", "shape": [2]},
        {**wire_obj(), "extra": 1},
        [wire_obj()],
    ],
    ids=[
        "f128",
        "object",
        "dtype-int",
        "shape-tuple",
        "shape-float",
        "shape-bool",
        "negative-dim",
        "data-str",
        "data-short",
        "data-long",
        "missing-key",
        "extra-key",
        "not-a-map",
    ],
)
def test_malformed_tensors_are_refused(obj):
    rejected(obj)


def test_rank_bound():
    limits = Limits(max_tensor_rank=3)
    rejected(wire_obj(shape=(1, 1, 1, 1)), limits)
    assert decode_tensor(wire_obj(shape=(1, 1, 1)), limits).shape == (1, 1, 1)


def test_element_bound_applies_before_any_allocation():
    # 2^62 elements claimed with 8 bytes of data: refused on the count, nothing is allocated.
    error = rejected(wire_obj(shape=(2**31, 2**31), data=b"\x00" * 8), Limits(max_tensor_elements=1000))
    assert "exceeds 1000 elements" in error.detail


def test_empty_tensors_with_huge_dimensions_are_refused():
    # Zero elements, but numpy cannot represent the shape (found by the fuzz tests).
    rejected(wire_obj(shape=(0, 1_518_494_220, 1_518_506_280), data=b""))
    assert decode_tensor(wire_obj(shape=(0, 1000), data=b""), DEFAULT_LIMITS).shape == (0, 1000)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_are_refused_in_every_float_dtype(dtype, value):
    data = np.array([1.0, value, 2.0], WIRE_DTYPES[dtype]).tobytes()
    error = rejected(wire_obj(dtype, (3,), data))
    assert "NaN or Inf" in error.detail
    with pytest.raises(ProtocolError):
        encode_tensor(np.array([value], WIRE_DTYPES[dtype]), DEFAULT_LIMITS)


def test_norm_bound():
    limits = Limits(max_tensor_norm=10.0)
    ok = np.full(4, 4.99, np.float32)  # norm 9.98
    assert roundtrip(ok, limits).shape == (4,)
    error = rejected(wire_obj("float32", (4,), np.full(4, 5.01, np.float32).tobytes()), limits)
    assert "norm" in error.detail
    rejected(wire_obj("int64", (2,), np.array([8, 8], np.int64).tobytes()), limits)


def test_huge_finite_floats_are_not_mistaken_for_inf():
    # Squares of 1e30 overflow float32; the check must then look again in float64.
    array = np.array([1e30, -1e30], np.float32)
    assert roundtrip(array, Limits(max_tensor_norm=math.inf)).shape == (2,)
    error = rejected(wire_obj("float32", (2,), array.tobytes()))
    assert "norm" in error.detail


def test_bool_tensors_hold_only_zero_and_one():
    rejected(wire_obj("bool", (3,), b"\x00\x01\x02"))
    np.testing.assert_array_equal(
        decode_tensor(wire_obj("bool", (3,), b"\x00\x01\x01"), DEFAULT_LIMITS), [False, True, True]
    )


def test_dtype_kinds_restrict_a_field():
    rejected(wire_obj("int32", (2,)), kinds="f")
