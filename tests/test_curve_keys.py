"""The X25519 (CURVE) keys derived from Ed25519 identities (protocol/curve.py)."""

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from protocol import Identity
from protocol.curve import curve_public_from_ed25519, ed25519_y, ed25519_y_of_curve_public

from .conftest import fixed_identity
from .helpers import VECTORS

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it


def x25519_public_of(secret: bytes) -> bytes:
    key = X25519PrivateKey.from_private_bytes(secret).public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@given(st.binary(min_size=32, max_size=32))
def test_the_public_key_of_the_derived_secret_is_the_map_of_the_ed25519_key(seed):
    identity = Identity(Ed25519PrivateKey.from_private_bytes(seed))
    secret, public = identity.curve_keypair()
    assert x25519_public_of(secret) == public == curve_public_from_ed25519(identity.public_key)
    assert secret[0] & 7 == 0 and secret[31] & 0xC0 == 0x40  # clamped
    # The backward map finds the Ed25519 key again, up to the sign bit of x.
    assert ed25519_y_of_curve_public(public) == ed25519_y(identity.public_key)


def test_documented_vectors():
    for seed, (ed_public, curve_secret, curve_public) in enumerate(VECTORS, start=1):
        identity = fixed_identity(seed)
        assert identity.public_key.hex() == ed_public
        assert identity.curve_keypair() == (bytes.fromhex(curve_secret), bytes.fromhex(curve_public))


def test_keys_without_a_transport_key_are_refused():
    one = (1).to_bytes(32, "little")  # y = 1: the neutral point, 1 - y = 0
    minus_one = (2**255 - 20).to_bytes(32, "little")  # y = -1: order 2, u = 0
    unreduced = (2**255 - 18).to_bytes(32, "little")  # y >= p
    no_point = (2).to_bytes(32, "little")  # (y² - 1) / (d y² + 1) is not a square for y = 2
    for key in (one, minus_one, unreduced, no_point, b"\x01" * 31):
        with pytest.raises(ValueError):
            curve_public_from_ed25519(key)
    for key in ((2**255 - 20).to_bytes(32, "little"), b"\xff" * 32, b"\x00" * 31):  # u = -1, unreduced, short
        with pytest.raises(ValueError):
            ed25519_y_of_curve_public(key)
