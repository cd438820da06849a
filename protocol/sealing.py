"""Frames sealed end to end, for a relay to carry without reading them (docs/protocol.md, "Relays").

CURVE encrypts per connection, so a relay, which ends one connection and begins the next, would
read every frame it forwards. Before a frame goes to a relay its origin seals it to the target:

- key: HKDF-SHA256 over X25519(origin's transport secret, target's transport key), both derived
  from the Ed25519 keys (protocol/curve.py), so sealing needs no key of its own; `info` names the
  network, the origin and the target, so each direction has its own key;
- `sealed` = seq (8 bytes, big-endian) ‖ ChaCha20-Poly1305(key, nonce = 4 zero bytes ‖ seq, frame).

`seq` is the sealed frame's own sequence number, which its signer never reuses (§7), so a nonce
never repeats under one key; sealing one frame twice gives the same bytes. Only the origin and
the target hold the key: the relay can neither read, alter nor forge a sealed frame, and the
target cannot re-seal the origin's frame to a third node as the origin. No forward secrecy: the
keys are static, and whoever later steals either node's key opens what a relay recorded.
"""

from __future__ import annotations

from collections import OrderedDict

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .curve import curve_public_from_ed25519
from .envelope import Decoder, Header
from .errors import ProtocolError, Reason
from .identity import Identity
from .kinds import RELAY_TYPES

__all__ = ["SEAL_OVERHEAD", "Sealing", "opened_header"]

_INFO = b"p2pnode.seal.v1\0"
_AAD = b"p2pnode.seal.v1"
_SEQ_BYTES = 8
_TAG_BYTES = 16
SEAL_OVERHEAD = _SEQ_BYTES + _TAG_BYTES  # sealed bytes beyond the frame's own


class Sealing:
    """One node's sealing keys towards its peers, derived once per peer and direction and kept
    for the `max_keys` peers used last (as the decoder keeps verified keys)."""

    def __init__(self, identity: Identity, network_id: str, max_keys: int = 4096) -> None:
        self._secret = X25519PrivateKey.from_private_bytes(identity.curve_keypair()[0])
        self._own = identity.public_key
        self._network = network_id.encode()
        self._max_keys = max_keys
        self._keys: OrderedDict[tuple[bytes, bool], ChaCha20Poly1305] = OrderedDict()

    def seal(self, target: bytes, seq: int, frame: bytes) -> bytes:
        """`frame` (signed by this node with sequence number `seq`) sealed to `target`; ValueError
        if `target` is no node's key."""
        nonce = seq.to_bytes(_SEQ_BYTES, "big")
        return nonce + self._key(target, outgoing=True).encrypt(bytes(4) + nonce, frame, _AAD)

    def open(self, origin: bytes, sealed: bytes) -> tuple[int, bytes]:
        """(seq, frame) of what `origin` sealed to this node; `bad_seal` if it did not."""
        if len(sealed) < SEAL_OVERHEAD:
            raise ProtocolError(Reason.BAD_SEAL, f"{len(sealed)} sealed bytes, at least {SEAL_OVERHEAD} expected")
        nonce = sealed[:_SEQ_BYTES]
        try:
            frame = self._key(origin, outgoing=False).decrypt(bytes(4) + nonce, sealed[_SEQ_BYTES:], _AAD)
        except InvalidTag:
            raise ProtocolError(Reason.BAD_SEAL, "does not open: not sealed by its origin to this node") from None
        except ValueError as exc:  # an origin key with no transport key
            raise ProtocolError(Reason.BAD_SEAL, f"the origin's key: {exc}") from None
        return int.from_bytes(nonce, "big"), frame

    def _key(self, peer: bytes, outgoing: bool) -> ChaCha20Poly1305:
        slot = (bytes(peer), outgoing)
        key = self._keys.get(slot)
        if key is not None:
            self._keys.move_to_end(slot)
            return key
        shared = self._secret.exchange(X25519PublicKey.from_public_bytes(curve_public_from_ed25519(peer)))
        origin, target = (self._own, peer) if outgoing else (peer, self._own)
        info = _INFO + self._network + b"\0" + origin + target
        key = ChaCha20Poly1305(HKDF(hashes.SHA256(), 32, salt=None, info=info).derive(shared))
        self._keys[slot] = key
        if len(self._keys) > self._max_keys:
            self._keys.popitem(last=False)
        return key


def opened_header(decoder: Decoder, origin: bytes, seq: int, frame: bytes) -> Header:
    """The header of an opened frame, checked as any frame's (`Decoder.peek`) and against the
    seal: signed by `origin` with the sequence number it was sealed under (else `bad_seal`),
    and no relaying frame inside another. Its signature is still to be checked."""
    header = decoder.peek(frame)
    if header.sender != origin or header.seq != seq:
        raise ProtocolError(Reason.BAD_SEAL, "the sealed frame's sender or sequence number is not the seal's")
    if header.type in RELAY_TYPES:
        raise ProtocolError(Reason.BAD_SEAL, f"a {header.type.value} frame sealed inside another")
    return header
