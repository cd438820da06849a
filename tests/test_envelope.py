"""Frames: conformance with docs/protocol.md, every rejection reason, tampering, limits."""

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    DOMAIN_TAG,
    HEADER_MAX_BYTES,
    Decoder,
    Encoder,
    Head,
    Limits,
    MessageType,
    Model,
    Ping,
    ProtocolError,
    Prototypes,
    Reason,
    seal_raw,
)

from . import vectors
from .conftest import NETWORK, NOW_US
from .wire import TAG, bodies, frame_from_spec, hello_bodies, widest

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it


def ping_envelope(identity, **overrides):
    fields = dict(
        version=1,
        network=NETWORK,
        type="PING",
        sender=identity.public_key,
        seq=7,
        ts=NOW_US,
        round=3,
        body={"nonce": 9},
    )
    fields.update(overrides)
    return list(fields.values())


def refused(decoder, frame, reason: Reason) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        decoder.decode(frame)
    assert caught.value.reason is reason, caught.value
    return caught.value


# --- conformance ---------------------------------------------------------------------------


def test_frame_layout_matches_the_spec(alice, encoder):
    frame = encoder.encode(Ping(nonce=9), seq=7, timestamp_us=NOW_US, round=3)
    assert frame.startswith(DOMAIN_TAG) and DOMAIN_TAG == TAG
    assert frame == frame_from_spec(alice, ping_envelope(alice))


def test_test_vectors(alice, encoder, decoder):
    assert alice.public_key.hex() == vectors.PUBLIC_KEY and alice.node_id == vectors.NODE_ID
    ping = bytes.fromhex(vectors.PING_FRAME)
    assert encoder.encode(Ping(nonce=9), seq=7, timestamp_us=NOW_US, round=3) == ping
    envelope = decoder.decode(ping)
    assert (envelope.sender, envelope.seq, envelope.timestamp_us, envelope.round) == (alice.public_key, 7, NOW_US, 3)
    assert envelope.body == Ping(nonce=9)
    assert envelope.type is MessageType.PING and envelope.size == len(ping) == 143
    assert envelope.sender_id == vectors.NODE_ID

    prototypes = Prototypes(classes=(3,), counts=(25,), prototypes=np.array([[0.5, -1.0]], np.float32))
    frame = bytes.fromhex(vectors.PROTOTYPES_FRAME)
    assert encoder.encode(prototypes, seq=8, timestamp_us=NOW_US, round=3) == frame
    assert decoder.decode(frame).body == prototypes


@given(st.data())
def test_every_message_type_round_trips(alice, encoder, decoder, data):
    hello = encoder.encode(data.draw(hello_bodies()), seq=1, timestamp_us=NOW_US, round=0)
    body = data.draw(bodies(hello))
    seq, ts, rnd = (
        data.draw(st.integers(0, 2**64 - 1)),
        data.draw(st.integers(0, 2**64 - 1)),
        data.draw(st.integers(0, 2**32 - 1)),
    )
    frame = encoder.encode(body, seq=seq, timestamp_us=ts, round=rnd)
    envelope = decoder.decode(frame)
    assert envelope.body == body
    assert (envelope.sender, envelope.seq, envelope.timestamp_us, envelope.round) == (alice.public_key, seq, ts, rnd)


def test_signature_is_over_the_received_bytes_not_a_re_encoding(alice, encoder, decoder):
    frame = encoder.encode(Ping(nonce=9), seq=7, timestamp_us=NOW_US, round=3)
    # Same logical envelope, non-canonical msgpack (widest int/str/map forms), old signature.
    envelope = msgpack.unpackb(frame[len(TAG) : -64], raw=False)
    rewritten = TAG + widest(envelope) + frame[-64:]
    assert msgpack.unpackb(rewritten[len(TAG) : -64], raw=False) == envelope
    refused(decoder, rewritten, Reason.BAD_SIGNATURE)
    # Signed by the key holder, the non-canonical encoding is a valid frame: the signature
    # binds the bytes as sent, whatever their form.
    assert decoder.decode(frame_from_spec(alice, envelope, packed=widest(envelope))).body == Ping(nonce=9)


def test_every_bit_flip_in_a_signed_frame_is_refused(encoder, decoder):
    frame = encoder.encode(Ping(nonce=9), seq=7, timestamp_us=NOW_US, round=3)
    reasons = set()
    for bit in range(len(frame) * 8):
        mutated = bytearray(frame)
        mutated[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(ProtocolError) as caught:
            decoder.decode(bytes(mutated))
        reasons.add(caught.value.reason)
    assert Reason.BAD_SIGNATURE in reasons and Reason.MALFORMED in reasons


@given(st.data())
def test_bit_flips_in_a_tensor_frame_are_refused(encoder, decoder, data):
    frame = encoder.encode(
        Prototypes(classes=tuple(range(10)), counts=(5,) * 10, prototypes=np.ones((10, 32), np.float32)),
        seq=1,
        timestamp_us=NOW_US,
        round=1,
    )
    bit = data.draw(st.integers(0, len(frame) * 8 - 1))
    mutated = bytearray(frame)
    mutated[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(ProtocolError):
        decoder.decode(bytes(mutated))


# --- one test per rejection reason ---------------------------------------------------------


def test_too_large_globally_before_anything_else(decoder):
    small = Decoder(NETWORK, Limits(max_frame_bytes=1000))
    refused(small, b"\x00" * 1001, Reason.TOO_LARGE)


def test_too_large_per_type_on_decode_before_the_signature(alice, encoder):
    frame = encoder.encode(
        Model(kind="params", tensors={"w": np.zeros(3000, np.float32)}), seq=1, timestamp_us=NOW_US, round=0
    )
    strict = Decoder(NETWORK, Limits(frame_bytes_by_type={MessageType.MODEL: 10_000}))
    refused(strict, frame, Reason.TOO_LARGE)
    # The per-type bound is checked before the signature: a forged oversize frame costs no verify.
    refused(strict, frame[:-64] + bytes(64), Reason.TOO_LARGE)
    assert strict.decode(encoder.encode(Ping(nonce=1), seq=2, timestamp_us=NOW_US, round=0)).body == Ping(nonce=1)


def test_too_large_per_type_on_encode(alice):
    encoder = Encoder(alice, NETWORK, Limits(frame_bytes_by_type={MessageType.HEAD: 1000}))
    with pytest.raises(ProtocolError) as caught:
        encoder.encode(Head(weight=np.zeros((10, 64), np.float32), bias=None), seq=1, timestamp_us=NOW_US, round=0)
    assert caught.value.reason is Reason.TOO_LARGE
    # A failed encode leaves the encoder usable.
    assert encoder.encode(Ping(nonce=1), seq=1, timestamp_us=NOW_US, round=0)


def test_per_type_bounds_never_exceed_the_global_one():
    limits = Limits(max_frame_bytes=5000, frame_bytes_by_type={MessageType.MODEL: 10**9})
    assert limits.max_frame_bytes_for(MessageType.MODEL) == 5000


@pytest.mark.parametrize(
    "frame",
    [b"", b"\xadp2pnode.frame", b"\x00" * 200, b"\xadp2pnode.fram\x00" + b"\x00" * 100, TAG + b"\x91" + bytes(64)],
    ids=["empty", "tag-only", "zeros", "wrong-tag", "tiny"],
)
def test_malformed_not_a_frame(decoder, frame):
    refused(decoder, frame, Reason.MALFORMED)


@pytest.mark.parametrize(
    "envelope",
    [
        {"not": "an array"},
        [1, NETWORK, "PING"],
        "just a string",
    ],
    ids=["map", "short-array", "string"],
)
def test_malformed_envelope_shape(alice, decoder, envelope):
    refused(decoder, seal_raw(alice, envelope), Reason.MALFORMED)


def test_malformed_envelope_arity(alice, decoder):
    refused(decoder, seal_raw(alice, [*ping_envelope(alice), None]), Reason.MALFORMED)
    refused(decoder, seal_raw(alice, ping_envelope(alice)[:7]), Reason.MALFORMED)


@pytest.mark.parametrize(
    "field, value",
    [
        ("version", "1"),
        ("version", True),
        ("network", b"test"),
        ("type", 3),
        ("sender", "x" * 32),
        ("sender", b"\x01" * 31),
        ("seq", -1),
        ("seq", 1.0),
        ("ts", None),
        ("round", 2**32),
        ("round", False),
    ],
)
def test_malformed_header_fields(alice, decoder, field, value):
    refused(decoder, seal_raw(alice, ping_envelope(alice, **{field: value})), Reason.MALFORMED)


def test_malformed_header_longer_than_its_budget(alice, decoder):
    # A 200-character "network id" pushes the header past HEADER_MAX_BYTES.
    frame = seal_raw(alice, ping_envelope(alice, network="n" * 200))
    assert refused(decoder, frame, Reason.MALFORMED).detail.endswith(f"longer than {HEADER_MAX_BYTES} bytes")


def test_malformed_trailing_bytes_after_the_envelope(alice, decoder):
    signed = TAG + msgpack.packb(ping_envelope(alice)) + b"\xc0"
    refused(decoder, signed + alice.sign(signed), Reason.MALFORMED)


def test_malformed_truncated_body(alice, decoder):
    packed = msgpack.packb(ping_envelope(alice))[:-2]
    refused(decoder, TAG + packed + alice.sign(TAG + packed), Reason.MALFORMED)


@pytest.mark.parametrize(
    "body",
    [
        msgpack.ExtType(5, b"abc"),
        {"nonce": msgpack.ExtType(1, b"")},
        msgpack.Timestamp(1, 0),
        {"nonce": 9, b"nonce": 9},  # str and bin keys: two keys, one unexpected
        {"nonce": float("nan")},
        {"nonce": 9, "extra": 1},
        {},
        [9],
    ],
    ids=["ext", "empty-ext", "timestamp", "bin-key", "nan", "extra-field", "missing-field", "array-body"],
)
def test_malformed_bodies_with_valid_signatures(alice, decoder, body):
    refused(decoder, seal_raw(alice, ping_envelope(alice, body=body)), Reason.MALFORMED)


def test_malformed_duplicate_map_keys(alice, decoder):
    # msgpack would keep the last value silently; a repeated key is refused.
    envelope = msgpack.packb(ping_envelope(alice))
    body_start = envelope.rindex(b"\x81\xa5nonce")
    packed = envelope[:body_start] + b"\x82\xa5nonce\x09\xa5nonce\x0a"
    refused(decoder, TAG + packed + alice.sign(TAG + packed), Reason.MALFORMED)


def test_malformed_invalid_utf8(alice, decoder):
    packed = msgpack.packb(ping_envelope(alice, body={"nonce": 9})).replace(b"\xa5nonce", b"\xa5non\xffe")
    refused(decoder, TAG + packed + alice.sign(TAG + packed), Reason.MALFORMED)


def test_malformed_non_string_map_keys(alice, decoder):
    refused(decoder, seal_raw(alice, ping_envelope(alice, body={1: 9})), Reason.MALFORMED)


def test_malformed_deeply_nested_body(alice, decoder):
    # 5000 nested arrays (the msgpack packer itself would refuse to build them).
    packed = (
        msgpack.packb(ping_envelope(alice, type="MODEL", body=None))[:-1] + b"\x81\xa4kind" + b"\x91" * 5000 + b"\x09"
    )
    assert "StackError" in refused(decoder, TAG + packed + alice.sign(TAG + packed), Reason.MALFORMED).detail


def test_unsupported_version(alice, decoder):
    refused(decoder, seal_raw(alice, ping_envelope(alice, version=2)), Reason.UNSUPPORTED_VERSION)


def test_wrong_network(alice, decoder):
    refused(
        decoder,
        Encoder(alice, "other-net").encode(Ping(nonce=1), seq=1, timestamp_us=NOW_US, round=0),
        Reason.WRONG_NETWORK,
    )


def test_unknown_type(alice, decoder):
    refused(decoder, seal_raw(alice, ping_envelope(alice, type="GOSSIP")), Reason.UNKNOWN_TYPE)
    refused(decoder, seal_raw(alice, ping_envelope(alice, type="ping")), Reason.UNKNOWN_TYPE)


def test_not_allowed_before_the_signature_is_checked(alice, bob, encoder):
    allowed = {bob.public_key}
    decoder = Decoder(NETWORK, allowed_senders=allowed)
    frame = encoder.encode(Ping(nonce=1), seq=1, timestamp_us=NOW_US, round=0)
    refused(decoder, frame, Reason.NOT_ALLOWED)
    refused(decoder, frame[:-64] + bytes(64), Reason.NOT_ALLOWED)  # no verify spent on strangers
    allowed.add(alice.public_key)  # the decoder sees changes to the allowlist it was given
    assert decoder.decode(frame).body == Ping(nonce=1)


def test_bad_signature_from_a_key_claiming_another_sender(alice, bob, decoder):
    # Signed by bob, claiming to be alice.
    refused(decoder, frame_from_spec(bob, ping_envelope(alice)), Reason.BAD_SIGNATURE)


def test_bad_signature_on_an_invalid_public_key(alice, decoder):
    refused(decoder, frame_from_spec(alice, ping_envelope(alice, sender=b"\xff" * 32)), Reason.BAD_SIGNATURE)


def test_bad_tensor_in_a_signed_frame(alice, decoder):
    nan = np.array([[np.nan, 1.0]], np.float32)
    body = {
        "classes": [0],
        "counts": [1],
        "prototypes": {"dtype": "float32", "shape": [1, 2], "data": nan.tobytes()},
        "head": None,
    }
    refused(decoder, seal_raw(alice, ping_envelope(alice, type="PROTOTYPES", body=body)), Reason.BAD_TENSOR)


def test_encoder_refuses_bad_arguments(alice, encoder):
    with pytest.raises(ValueError):
        Encoder(alice, "Bad Network!")
    for kwargs in (dict(seq=-1), dict(seq=2**64), dict(round=2**32), dict(timestamp_us=1.5), dict(seq=True)):
        arguments = dict(seq=1, timestamp_us=NOW_US, round=0) | kwargs
        with pytest.raises(ValueError):
            encoder.encode(Ping(nonce=1), **arguments)


def test_encoder_refuses_what_a_peer_would_refuse(encoder):
    with pytest.raises(ProtocolError) as caught:
        encoder.encode(Head(weight=np.full((2, 2), np.inf, np.float32), bias=None), seq=1, timestamp_us=NOW_US, round=0)
    assert caught.value.reason is Reason.BAD_TENSOR


def test_limits_are_validated():
    for bad in (
        dict(max_frame_bytes=0),
        dict(max_str_len=-1),
        dict(max_tensor_norm=float("nan")),
        dict(max_array_len=1.5),
    ):
        with pytest.raises(ValueError):
            Limits(**bad)
    with pytest.raises(ValueError):
        Limits(frame_bytes_by_type={"GOSSIP": 10})
    assert Limits(frame_bytes_by_type={"PING": 10}).max_frame_bytes_for(MessageType.PING) == 10


def test_protocol_error_survives_pickling_across_threads():
    import pickle

    error = pickle.loads(pickle.dumps(ProtocolError(Reason.REPLAY, "seq 3 already seen")))
    assert error.reason is Reason.REPLAY and error.detail == "seq 3 already seen"
