"""A node's X25519 (CURVE) key pair, derived from its Ed25519 identity.

The conversion is libsodium's (crypto_sign_ed25519_sk_to_curve25519 and
crypto_sign_ed25519_pk_to_curve25519), so any peer can compute the transport key of a node from
the key that signs its frames, and no second key needs distributing or binding:

- secret: the first 32 bytes of SHA-512(Ed25519 seed), clamped (the scalar Ed25519 signs with);
- public: the Montgomery u of the Ed25519 point, u = (1 + y) / (1 - y) mod 2^255 - 19, y read
  little-endian with the sign bit of x cleared.

A public key that does not decode to a curve point, or decodes to a point of small order, has
no transport key (ValueError), as in libsodium. Unlike libsodium, points with a small-order
component are not refused: that check costs a scalar multiplication, and such a key cannot sign
a frame that verifies anyway. docs/protocol.md, "Transport encryption and session binding".

The map also runs backwards, y = (u - 1) / (u + 1), which is how a receiver checks that a frame's
sender owns the connection it came on: one inversion per connection key, then a comparison of
bytes per frame, however many keys the frames claim (the forward map checks that y decodes,
~0.25 ms per key in Python: more than the signature check the comparison saves).
"""

from __future__ import annotations

import hashlib

__all__ = [
    "curve_secret_from_seed",
    "curve_public_from_ed25519",
    "ed25519_y_of_curve_public",
    "ed25519_y",
    "CURVE_KEY_SIZE",
]

CURVE_KEY_SIZE = 32
_P = 2**255 - 19
_D = (-121665 * pow(121666, -1, _P)) % _P
# Montgomery u of the points of order 1, 2, 4 and 8: their keys would give an all-zero secret.
_SMALL_ORDER_U = frozenset(
    {
        0,
        1,
        325606250916557431795983626356110631294008115727848805560023387167927233504,
        39382357235489614581723060781553021112529911719440698176882885853963445705823,
    }
)


def curve_secret_from_seed(seed: bytes) -> bytes:
    """The X25519 secret key of the Ed25519 key with this 32-byte seed."""
    if len(seed) != 32:
        raise ValueError(f"an Ed25519 seed has 32 bytes, got {len(seed)}")
    scalar = bytearray(hashlib.sha512(seed).digest()[:32])
    scalar[0] &= 248
    scalar[31] &= 127
    scalar[31] |= 64
    return bytes(scalar)


def curve_public_from_ed25519(public_key: bytes) -> bytes:
    """The X25519 public key of a raw Ed25519 public key; ValueError if it has none."""
    if len(public_key) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, got {len(public_key)}")
    y = int.from_bytes(public_key, "little") & ((1 << 255) - 1)
    if y >= _P:
        raise ValueError("not an Ed25519 public key: y is not reduced")
    yy = y * y % _P
    xx = (yy - 1) * pow(_D * yy + 1, -1, _P) % _P  # d·y² + 1 is never 0: d is not a square
    if xx and pow(xx, (_P - 1) // 2, _P) != 1:
        raise ValueError("not an Ed25519 public key: no point has this y")
    if y == 1:
        raise ValueError("not an Ed25519 public key: the neutral point")
    u = (1 + y) * pow(1 - y, -1, _P) % _P
    if u in _SMALL_ORDER_U:
        raise ValueError("not an Ed25519 public key: a point of small order")
    return u.to_bytes(32, "little")


def ed25519_y(public_key: bytes) -> bytes:
    """An Ed25519 public key with the sign bit of x cleared: all that the transport key depends on."""
    return public_key[:31] + bytes((public_key[31] & 0x7F,))


def ed25519_y_of_curve_public(curve_public: bytes) -> bytes:
    """The Ed25519 key, as `ed25519_y` gives it, whose transport key is exactly `curve_public`;
    ValueError if none is (a u that is not reduced, or -1)."""
    if len(curve_public) != CURVE_KEY_SIZE:
        raise ValueError(f"an X25519 public key has {CURVE_KEY_SIZE} bytes, got {len(curve_public)}")
    u = int.from_bytes(curve_public, "little")
    if u >= _P - 1:  # not what the forward map gives (u is reduced), or u + 1 = 0
        raise ValueError("no Ed25519 key has this X25519 key")
    return ((u - 1) * pow(u + 1, -1, _P) % _P).to_bytes(32, "little")
