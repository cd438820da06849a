"""Signed frames: `Encoder` turns a typed body into bytes, `Decoder` turns received bytes back.

Frame layout (docs/protocol.md has the full specification):

    frame     = DOMAIN_TAG || envelope || signature
    DOMAIN_TAG = msgpack str "p2pnode.frame"                            (14 bytes: AD 70 32 ...)
    envelope  = msgpack array [version, network_id, type, sender, seq, timestamp_us, round, body]
    signature = Ed25519(sender's key, DOMAIN_TAG || envelope)          (64 bytes)

The signature covers the exact bytes received (everything but its own 64 bytes); the decoder
verifies those bytes and never a re-encoding. Decoding runs in the order that spends least on
bad input: size, tag, header (read from at most HEADER_MAX_BYTES), version, network, type and
its size bound, allowlist (all of which `Decoder.peek` does alone, cheaply), signature, and only
then the body.

Both classes hold configuration only, checked once at construction; `Decoder.decode` reads no
clock and shares no mutable state, so the daemon can run it in worker threads. Replay and
clock-skew checks need state and a clock: see replay.py.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .errors import ProtocolError, Reason
from .identity import Identity, node_id
from .limits import DEFAULT_LIMITS, Limits
from .messages import BODY_TYPES, PUBLIC_KEY_SIZE, Body, MessageType
from .schema import malformed

__all__ = [
    "DOMAIN_TAG",
    "PROTOCOL_VERSION",
    "SIGNATURE_SIZE",
    "HEADER_MAX_BYTES",
    "Header",
    "Envelope",
    "Encoder",
    "Decoder",
    "check_network_id",
    "seal_raw",
]

# The domain-separation tag is also the magic that marks a p2pnode frame. It is itself a msgpack
# value, so the encoder packs tag and envelope into one buffer and signs that buffer in place.
_TAG_TEXT = "p2pnode.frame"
DOMAIN_TAG = msgpack.packb(_TAG_TEXT)
assert DOMAIN_TAG == b"\xadp2pnode.frame"
PROTOCOL_VERSION = 1
SIGNATURE_SIZE = 64
# Every envelope field but the body must fit in this many bytes. The decoder reads the header
# from them first, so the per-type size bound applies before the body is looked at.
HEADER_MAX_BYTES = 192
_ENVELOPE_ARITY = 8
_MIN_FRAME = len(DOMAIN_TAG) + 1 + SIGNATURE_SIZE
_NETWORK_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1
# A packer per thread is reused across frames: a fresh msgpack.Packer allocates its 256 KiB
# buffer every time, which alone cost 60 µs per 200 KB frame. Buffers past this size are dropped
# after use so that one 40 MB model does not stay allocated for good.
_KEEP_PACKER_BYTES = 1 << 20
_KEY_CACHE_SIZE = 4096


def check_network_id(network_id: str) -> str:
    if not isinstance(network_id, str) or not _NETWORK_ID.fullmatch(network_id):
        raise ValueError(f"network id must match {_NETWORK_ID.pattern}, got {network_id!r}")
    return network_id


def _is_uint(value: Any, maximum: int) -> bool:
    return type(value) is int and 0 <= value <= maximum  # `type(...) is int` refuses bool


@dataclass(frozen=True, slots=True)
class Header:
    """What a frame claims before its signature is checked: enough to decide whether to check it."""

    type: MessageType
    sender: bytes  # claimed, not yet verified
    seq: int
    timestamp_us: int
    round: int
    size: int


@dataclass(frozen=True, slots=True)
class Envelope:
    """A verified frame: who sent it, its ordering fields, and the typed body."""

    sender: bytes  # raw Ed25519 public key, 32 bytes
    seq: int
    timestamp_us: int
    round: int
    body: Body
    network_id: str
    version: int
    size: int  # bytes on the wire

    @property
    def type(self) -> MessageType:
        return self.body.TYPE

    @property
    def sender_id(self) -> str:
        return node_id(self.sender)

    def __repr__(self) -> str:
        return (
            f"Envelope({self.type.value} from {self.sender_id}, seq={self.seq}, round={self.round}, "
            f"timestamp_us={self.timestamp_us}, {self.size} bytes, body={self.body!r})"
        )


class Encoder:
    """Validates, encodes and signs outgoing messages for one identity on one network."""

    def __init__(self, identity: Identity, network_id: str, limits: Limits = DEFAULT_LIMITS) -> None:
        self.identity = identity
        self.network_id = check_network_id(network_id)
        self.limits = limits
        self._local = threading.local()

    def encode(self, body: Body, *, seq: int, timestamp_us: int, round: int) -> bytes:
        """One signed frame. Raises ProtocolError if a peer with the same limits would refuse it
        (NaN in a tensor, too large), ValueError for out-of-range envelope fields."""
        if not (_is_uint(seq, _U64_MAX) and _is_uint(timestamp_us, _U64_MAX) and _is_uint(round, _U32_MAX)):
            raise ValueError(
                f"seq and timestamp_us must be uint64 and round uint32, got {seq!r}, {timestamp_us!r}, {round!r}"
            )
        kind = body.TYPE
        header = [PROTOCOL_VERSION, self.network_id, kind.value, self.identity.public_key, seq, timestamp_us, round]
        envelope = [*header, body.to_wire(self.limits)]
        packer = getattr(self._local, "packer", None) or msgpack.Packer(autoreset=False, use_bin_type=True)
        packer.reset()
        packer.pack(_TAG_TEXT)
        packer.pack(envelope)
        bound = self.limits.max_frame_bytes_for(kind)
        with packer.getbuffer() as signed:
            size = len(signed) + SIGNATURE_SIZE
            # The one copy of the payload: tag and envelope are signed where they were packed.
            frame = b"".join((signed, self.identity.sign(signed))) if size <= bound else None
        self._local.packer = packer if size <= _KEEP_PACKER_BYTES else None
        if frame is None:
            raise ProtocolError(Reason.TOO_LARGE, f"{kind.value} frame of {size} bytes exceeds {bound}")
        return frame


def seal_raw(identity: Identity, envelope: list) -> bytes:
    """Sign an arbitrary envelope array with no validation at all.

    For tests, fuzzing and interoperability tools that must produce frames a correct encoder
    never would (unknown types, other versions, malformed bodies with valid signatures).
    """
    signed = DOMAIN_TAG + msgpack.packb(envelope, use_bin_type=True)
    return signed + identity.sign(signed)


class Decoder:
    """Checks and decodes received frames for one network.

    `allowed_senders`, if given, holds the raw public keys whose frames are accepted; the
    decoder keeps a reference, so changes to that collection apply to later frames.
    """

    def __init__(
        self,
        network_id: str,
        limits: Limits = DEFAULT_LIMITS,
        allowed_senders: Collection[bytes] | None = None,
    ) -> None:
        self.network_id = check_network_id(network_id)
        self.limits = limits
        self.allowed_senders = allowed_senders
        # Parsed public keys of senders whose signatures verified (saves ~0.8 µs a frame).
        # Bounded: cleared when full. Plain dict operations are atomic, so threads may share it.
        self._verified_keys: dict[bytes, Ed25519PublicKey] = {}
        self._unpack_options = dict(
            raw=False,  # str must be valid UTF-8; bin stays bytes
            use_list=True,
            strict_map_key=True,  # map keys are str or bin, never containers
            object_pairs_hook=_map_without_duplicates,
            ext_hook=_refuse_ext,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_frame_bytes,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=0,  # no extension types at all, msgpack's Timestamp included
        )

    def peek(self, frame: bytes | memoryview) -> Header:
        """Every check that needs no signature work: size, tag, header fields, the type's size
        bound, the allowlist. The daemon runs it on the event loop to decide, before paying for
        a signature, whether a frame may come from where it came. Raises ProtocolError."""
        return self._header(frame)[0]

    def decode(self, frame: bytes) -> Envelope:
        """Raises ProtocolError, and nothing else, for any frame it refuses."""
        header, signed, signature, body_bytes = self._header(frame)
        sender = header.sender
        public_key = self._verified_keys.get(sender)
        try:
            if public_key is None:
                public_key = Ed25519PublicKey.from_public_bytes(sender)
            public_key.verify(signature, signed)
        except (InvalidSignature, ValueError):
            raise ProtocolError(Reason.BAD_SIGNATURE, f"signature of {node_id(sender)} does not verify") from None
        if len(self._verified_keys) >= _KEY_CACHE_SIZE:
            self._verified_keys.clear()
        self._verified_keys[sender] = public_key

        # The body is unpacked in place from the frame (no copy into the streaming buffer);
        # unpackb refuses trailing bytes after it with ExtraData.
        try:
            raw_body = msgpack.unpackb(body_bytes, **self._unpack_options)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise malformed("envelope.body", f"bad msgpack ({type(exc).__name__}: {exc})") from None
        return Envelope(
            sender=sender,
            seq=header.seq,
            timestamp_us=header.timestamp_us,
            round=header.round,
            body=BODY_TYPES[header.type].from_wire(raw_body, self.limits),
            network_id=self.network_id,
            version=PROTOCOL_VERSION,
            size=header.size,
        )

    def _header(self, frame: bytes) -> tuple[Header, memoryview, memoryview, memoryview]:
        """The checked header, the signed bytes, the signature and the body's bytes."""
        limits = self.limits
        size = len(frame)
        if size > limits.max_frame_bytes:
            raise ProtocolError(Reason.TOO_LARGE, f"frame of {size} bytes exceeds {limits.max_frame_bytes}")
        view = memoryview(frame)  # bytes, or a buffer not copied yet (the daemon peeks at those)
        if size < _MIN_FRAME or view[: len(DOMAIN_TAG)] != DOMAIN_TAG:
            raise malformed("frame", "not a p2pnode frame (missing domain tag or too short)")
        signed, signature = view[:-SIGNATURE_SIZE], view[-SIGNATURE_SIZE:]
        envelope = signed[len(DOMAIN_TAG) :]

        header = msgpack.Unpacker(max_buffer_size=HEADER_MAX_BYTES, **self._unpack_options)
        header.feed(envelope[:HEADER_MAX_BYTES])
        try:
            arity = header.read_array_header()
            if arity != _ENVELOPE_ARITY:
                raise malformed("envelope", f"array of {arity} fields, expected {_ENVELOPE_ARITY}")
            version, network, kind_name, sender, seq, timestamp_us, round_ = (header.unpack() for _ in range(7))
        except msgpack.OutOfData:
            raise malformed("envelope", f"header truncated or longer than {HEADER_MAX_BYTES} bytes") from None
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise malformed("envelope", f"bad msgpack ({type(exc).__name__}: {exc})") from None

        if type(version) is not int:
            raise malformed("envelope.version", f"expected an integer, got {type(version).__name__}")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(Reason.UNSUPPORTED_VERSION, f"version {version}, this node speaks {PROTOCOL_VERSION}")
        if type(network) is not str:
            raise malformed("envelope.network_id", f"expected a string, got {type(network).__name__}")
        if network != self.network_id:
            raise ProtocolError(
                Reason.WRONG_NETWORK, f"frame for network {network[:64]!r}, this is {self.network_id!r}"
            )
        if type(kind_name) is not str:
            raise malformed("envelope.type", f"expected a string, got {type(kind_name).__name__}")
        try:
            kind = MessageType(kind_name)
        except ValueError:
            raise ProtocolError(Reason.UNKNOWN_TYPE, f"message type {kind_name[:32]!r}") from None
        if size > limits.max_frame_bytes_for(kind):
            raise ProtocolError(
                Reason.TOO_LARGE, f"{kind.value} frame of {size} bytes exceeds {limits.max_frame_bytes_for(kind)}"
            )
        if type(sender) is not bytes or len(sender) != PUBLIC_KEY_SIZE:
            raise malformed("envelope.sender", f"expected {PUBLIC_KEY_SIZE} bytes of public key")
        if self.allowed_senders is not None and sender not in self.allowed_senders:
            raise ProtocolError(Reason.NOT_ALLOWED, f"sender {node_id(sender)} is not on the allowlist")
        if not (_is_uint(seq, _U64_MAX) and _is_uint(timestamp_us, _U64_MAX) and _is_uint(round_, _U32_MAX)):
            raise malformed("envelope", "seq and timestamp_us must be uint64, round uint32")
        checked = Header(kind, sender, seq, timestamp_us, round_, size)
        return checked, signed, signature, envelope[header.tell() :]


def _map_without_duplicates(pairs: list[tuple[Any, Any]]) -> dict:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise malformed("map", "repeated key")
    return result


def _refuse_ext(code: int, data: bytes) -> Any:  # reached only for zero-length ext payloads
    raise malformed("msgpack", f"extension type {code} is not allowed")
