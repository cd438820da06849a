"""Node identity: an Ed25519 key pair, and the node id derived from its public key.

The node id is a short, human-friendly name for logs and status tables; the full 32-byte public
key is what the protocol authenticates. Files are the daemon's business (p2pnode/wire/keystore.py):
this module only turns PEM bytes into keys and back.
"""

from __future__ import annotations

import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .curve import curve_public_from_ed25519, curve_secret_from_seed
from .messages import PUBLIC_KEY_SIZE

__all__ = ["Identity", "node_id", "NODE_ID_LENGTH"]

NODE_ID_LENGTH = 16  # hex characters: the first 64 bits of a domain-separated SHA-256
_NODE_ID_TAG = b"p2pnode.node-id\x00"


def node_id(public_key: bytes) -> str:
    """The node id of a raw 32-byte Ed25519 public key."""
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise ValueError(f"an Ed25519 public key has {PUBLIC_KEY_SIZE} bytes, got {len(public_key)}")
    return hashlib.sha256(_NODE_ID_TAG + bytes(public_key)).hexdigest()[:NODE_ID_LENGTH]


class Identity:
    """An Ed25519 signing key with its raw public key and node id precomputed."""

    __slots__ = ("_private_key", "node_id", "public_key")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError(f"expected an Ed25519 private key, got {type(private_key).__name__}")
        self._private_key = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.node_id: str = node_id(self.public_key)

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, data: bytes) -> Identity:
        """Parse an unencrypted PKCS#8 PEM key; ValueError if it is not an Ed25519 private key."""
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not an unencrypted PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"expected an Ed25519 key, found {type(key).__name__.lstrip('_')}")
        return cls(key)

    def to_pem(self) -> bytes:
        return self._private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def curve_keypair(self) -> tuple[bytes, bytes]:
        """This node's raw 32-byte X25519 (ZeroMQ CURVE) secret and public key, derived from its
        Ed25519 key (protocol/curve.py), so its signing key also names its transport key."""
        seed = self._private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return curve_secret_from_seed(seed), curve_public_from_ed25519(self.public_key)

    def sign(self, data: bytes | bytearray | memoryview) -> bytes:
        return self._private_key.sign(data)

    def __repr__(self) -> str:
        return f"Identity(node_id={self.node_id!r})"
