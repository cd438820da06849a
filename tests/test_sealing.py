"""Frames sealed for a relay to carry (protocol/sealing.py): only the target opens them, only
from their origin, and nobody else can make one that opens."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    SEAL_OVERHEAD,
    Decoder,
    Encoder,
    Ping,
    ProtocolError,
    Prototypes,
    Reason,
    Relay,
    Sealing,
    opened_header,
)

from . import vectors
from .conftest import NETWORK, NOW_US, fixed_identity

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

A, B, C = fixed_identity(1), fixed_identity(2), fixed_identity(3)


def frame(identity, seq, body=None):
    return Encoder(identity, NETWORK).encode(body or Ping(nonce=seq), seq=seq, timestamp_us=NOW_US, round=0)


def refusal(call, *args):
    with pytest.raises(ProtocolError) as caught:
        call(*args)
    return caught.value.reason


@given(seq=st.integers(0, 2**64 - 1), payload=st.binary(max_size=2000))
def test_the_target_opens_what_the_origin_sealed_to_it(seq, payload):
    sealed = Sealing(A, NETWORK).seal(B.public_key, seq, payload)
    assert len(sealed) == len(payload) + SEAL_OVERHEAD
    assert Sealing(B, NETWORK).open(A.public_key, sealed) == (seq, payload)


def test_nobody_else_opens_it_and_no_bit_of_it_changes_unnoticed():
    sealed = Sealing(A, NETWORK).seal(B.public_key, 7, frame(A, 7))
    assert refusal(lambda: Sealing(C, NETWORK).open(A.public_key, sealed)) is Reason.BAD_SEAL  # another target
    assert refusal(lambda: Sealing(B, NETWORK).open(C.public_key, sealed)) is Reason.BAD_SEAL  # another origin
    assert refusal(lambda: Sealing(B, "other").open(A.public_key, sealed)) is Reason.BAD_SEAL  # another network
    assert refusal(lambda: Sealing(A, NETWORK).open(B.public_key, sealed)) is Reason.BAD_SEAL  # back the other way
    for index in (0, 7, 8, len(sealed) // 2, len(sealed) - 1):  # the nonce, the text, the tag
        flipped = bytearray(sealed)
        flipped[index] ^= 1
        assert refusal(Sealing(B, NETWORK).open, A.public_key, bytes(flipped)) is Reason.BAD_SEAL
    assert refusal(lambda: Sealing(B, NETWORK).open(A.public_key, sealed[: SEAL_OVERHEAD - 1])) is Reason.BAD_SEAL
    assert refusal(lambda: Sealing(B, NETWORK).open(b"\x00" * 32, sealed)) is Reason.BAD_SEAL  # no such key


def test_the_target_cannot_pass_the_origins_frame_on_as_the_origins():
    original = frame(A, 7)
    decoder = Decoder(NETWORK)
    # B opened A's frame; sealed on to C under B's own key, it opens, but as B's, and the frame inside is A's.
    resealed = Sealing(B, NETWORK).seal(C.public_key, 7, original)
    assert refusal(lambda: Sealing(C, NETWORK).open(A.public_key, resealed)) is Reason.BAD_SEAL
    seq, inner = Sealing(C, NETWORK).open(B.public_key, resealed)
    assert refusal(lambda: opened_header(decoder, B.public_key, seq, inner)) is Reason.BAD_SEAL


def test_the_opened_frame_must_be_the_origins_under_the_sealed_sequence_number():
    decoder = Decoder(NETWORK)
    for seq, inner in ((7, frame(A, 7)), (9, frame(A, 9, Prototypes(classes=(), counts=(), prototypes=_empty())))):
        sealed = Sealing(A, NETWORK).seal(B.public_key, seq, inner)
        opened_seq, opened = Sealing(B, NETWORK).open(A.public_key, sealed)
        header = opened_header(decoder, A.public_key, opened_seq, opened)
        assert (header.sender, header.seq) == (A.public_key, seq)
        assert decoder.decode(opened).sender == A.public_key
    # Sealed under another number than the frame's own: a nonce its origin may use again.
    sealed = Sealing(A, NETWORK).seal(B.public_key, 8, frame(A, 7))
    assert refusal(lambda: opened_header(decoder, A.public_key, *Sealing(B, NETWORK).open(A.public_key, sealed)))
    # A relaying frame inside another: relays do not nest.
    nested = frame(A, 10, Relay(target=C.public_key, sealed=b"\x00" * 64))
    assert refusal(lambda: opened_header(decoder, A.public_key, 10, nested)) is Reason.BAD_SEAL
    assert refusal(lambda: opened_header(decoder, A.public_key, 7, b"not a frame")) is Reason.MALFORMED


def test_sealing_is_deterministic_and_each_direction_has_its_own_key():
    one = Sealing(A, NETWORK).seal(B.public_key, 7, b"frame")
    assert one == Sealing(A, NETWORK).seal(B.public_key, 7, b"frame")  # a second relay, a retry: same bytes
    assert one != Sealing(B, NETWORK).seal(A.public_key, 7, b"frame")


def test_the_x25519_secret_is_libsodiums():
    nacl = pytest.importorskip("nacl.bindings")
    a_secret, a_public = A.curve_keypair()
    b_secret, b_public = B.curve_keypair()
    assert nacl.crypto_scalarmult(a_secret, b_public) == nacl.crypto_scalarmult(b_secret, a_public)


def test_the_documented_sealed_vector():
    """docs/protocol.md §12: the PING vector, sealed by key 01…20 to key 02…21."""
    sealed = Sealing(A, "test").seal(B.public_key, 7, bytes.fromhex(vectors.PING_FRAME))
    assert sealed.hex() == vectors.SEALED_PING
    assert B.public_key.hex() == vectors.SECOND_PUBLIC_KEY


def test_keys_are_kept_for_the_peers_used_last():
    sealing = Sealing(A, NETWORK, max_keys=2)
    for peer in (B, C, B, fixed_identity(4)):
        sealing.seal(peer.public_key, 1, b"x")
    assert [peer for peer, _ in sealing._keys] == [B.public_key, fixed_identity(4).public_key]


def _empty():
    import numpy as np

    return np.zeros((0, 4), np.float32)
