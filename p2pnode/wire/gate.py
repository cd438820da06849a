"""The gate in front of the verify threads: which frames may cost this node a signature check.

A signature check costs ~130 µs and a body decode more; a header check (`Decoder.peek`) a few.
So every frame is judged by its header and by the connection it came on before any of that:

- The public socket is read no faster than `stranger_rate` frames a second (bursts aside) on
  strangers' connections (`ReadPace`), refused or not: peers send on the peers' socket
  (transport.py), so a flood there is left in its own queues and sockets, unread.
- A connection whose frames verified as an admitted peer's is the peer's link: only frames that
  claim the same key pass, within the per-connection rate (`rate_per_connection`).
- Any other connection is a stranger's. Its first frame must be a HELLO (or claim an admitted
  peer's key: a peer whose connection was re-established), and that claim binds the connection:
  later frames must claim the same key, and until that key is an admitted peer only handshake
  frames (HELLO, PING, PONG) pass. Every frame on a stranger's connection first needs a token
  from the stranger bucket of its source subnet and from the node-wide stranger bucket, before
  its header is read, so that neither many connections nor many keys buy more than
  `stranger_rate` header reads and signature checks per second.
- A frame that fails verification unbinds a stranger's connection that it bound.
- One exception, for a race and not a privilege: a frame other than a handshake frame, on a
  connection whose HELLO verified, is *parked* rather than dropped. Its key may be admitted by a
  frame already read but not yet handled (the answer to our challenge, verified in a worker
  thread): the sender had every reason to take itself for admitted. Parked frames are verified
  once their key is a peer, in order, or dropped (`handshake_first`) after `PARK_S`. At most
  `MAX_PARKED_BYTES` in all and `MAX_PARKED_FRAMES` per connection are held.
- With CURVE, before all of this: the frame's sender must be the key whose transport key
  authenticated the connection (its User-Id, set by zap.py), so a frame captured elsewhere and
  replayed on another connection is refused (`wrong_sender`) without a signature check. The
  comparison runs the key map backwards (protocol/curve.py): one inversion per connection key,
  then bytes per frame, whatever keys the frames claim.

Everything the gate refuses is counted by the caller, with the reason returned. State is bounded
per kind: peers' links (`4 × max_peers`), strangers' connections (`max_stranger_connections`),
and stranger buckets per subnet; each drops its least recently used entry when full.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol import Header, MessageType
from protocol.curve import ed25519_y, ed25519_y_of_curve_public

from ..metrics import HANDSHAKE_FIRST, RATE_LIMITED, STRANGER_RATE_LIMITED, WRONG_SENDER
from ..wire.settings import HANDSHAKE_KINDS, TransportSettings

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = ["Gate", "TokenBuckets", "ReadPace", "HANDSHAKE_TYPES", "CHALLENGE_TYPES", "PARK", "subnet_of"]

# What a key that is not an admitted peer may send: enough to prove who it is and where.
HANDSHAKE_TYPES = frozenset(HANDSHAKE_KINDS)
# What of it may come on the peers' socket, from a key being verified or a peer that dropped this
# node unnoticed: a challenge and its answer (a HELLO always goes to the public socket).
CHALLENGE_TYPES = frozenset({MessageType.PING, MessageType.PONG})
# What may open a stranger's connection: a HELLO, or a dial-back, the one frame of its connection.
FIRST_TYPES = frozenset({MessageType.HELLO, MessageType.DIALED})
PARK = "park"  # Gate.admit's answer for a frame to hold until its key is admitted
PARK_S = 2.0
MAX_PARKED_BYTES = 16 << 20
MAX_PARKED_FRAMES = 16


class TokenBuckets:
    """A token bucket per key, least recently used dropped past `capacity`. A dropped bucket
    comes back full: forgetting favours the sender, so only strangers' keys belong here."""

    def __init__(self, rate: float, burst: int, capacity: int = 4096) -> None:
        self.rate, self.burst, self.capacity = rate, burst, capacity
        self._buckets: OrderedDict[object, tuple[float, float]] = OrderedDict()  # key -> (tokens, time)

    def allow(self, key: object, now: float) -> bool:
        tokens, then = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        allowed = tokens >= 1
        self._buckets[key] = (tokens - 1 if allowed else tokens, now)
        if len(self._buckets) > self.capacity:
            self._buckets.popitem(last=False)
        return allowed


class ReadPace:
    """A token bucket that can go into debt: how fast a socket is read. Each frame read spends a
    token, allowed or not, and the reader waits until the bucket is out of debt. A flood beyond
    `rate` is then left where it is, in ZeroMQ's queue (RCVHWM) and behind it in TCP's buffers and
    the sender's own: never read, it costs this node nothing."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), None

    def _refill(self, now: float) -> None:
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def spend(self, now: float) -> None:
        self._refill(now)
        self.tokens -= 1

    def wait_s(self, now: float) -> float:
        """Seconds until the next read may start (0: now)."""
        self._refill(now)
        return max(0.0, (1 - self.tokens) / self.rate)


def subnet_of(address: str | None) -> str:
    """The /24 of an IPv4 address or the /64 of an IPv6 one: what one operator usually holds."""
    if not address:
        return "?"
    if address.count(".") == 3 and ":" not in address:
        return address.rsplit(".", 1)[0]
    try:
        return str(ipaddress.ip_network(f"{address.strip('[]')}/64", strict=False))
    except ValueError:
        return address


@dataclass
class _Link:
    key: bytes  # every frame on this connection must claim this key
    proven: bool = False  # a frame claiming it verified here
    parked: list[tuple[float, bytes, int]] = field(default_factory=list)  # (when, frame, seq), oldest first


class Gate:
    def __init__(
        self, settings: TransportSettings, max_peers: int, is_peer: Callable[[bytes], bool], *, curve: bool = False
    ) -> None:
        self.is_peer = is_peer
        self.curve = curve
        # CURVE User-Id (hex X25519 key) -> the Ed25519 key it belongs to, sign bit cleared (b"": none).
        self.connection_owners: OrderedDict[str, bytes] = OrderedDict()
        self.per_connection = TokenBuckets(settings.rate_per_connection, settings.burst_per_connection)
        self.stranger_rate = TokenBuckets(settings.stranger_rate, settings.stranger_burst, capacity=1)
        self.subnet_rate = TokenBuckets(
            settings.stranger_rate_per_subnet, settings.stranger_burst_per_subnet, capacity=4096
        )
        # Every frame `budget` sees, whatever becomes of it: the public socket's reading pace.
        self.stranger_reads = ReadPace(settings.stranger_rate, settings.stranger_burst)
        self.peer_links: OrderedDict[bytes, _Link] = OrderedDict()
        self.stranger_links: OrderedDict[bytes, _Link] = OrderedDict()
        self.max_peer_links = 4 * max_peers
        self.max_stranger_links = settings.max_stranger_connections
        self.parked_bytes = 0  # parked frames' bytes, those of forgotten connections included
        self._forgotten_parked: list[bytes] = []  # parked on a connection pushed out: to count
        # connection -> (source host, its subnet), looked up once per connection
        self.sources: OrderedDict[bytes, tuple[str, str]] = OrderedDict()

    def budget(self, connection: bytes, metadata: Callable[[str], str | None], now: float) -> str | None:
        """Before its header is even read: a frame on any connection but a peer's link spends a
        token of the strangers' budget, whatever it holds (garbage too), so that a flood beyond
        that budget costs no more than counting it. None if it may go on. `metadata` gives a
        property of the frame's connection (ZeroMQ's "Peer-Address", "User-Id"), asked for only
        where needed."""
        if connection in self.peer_links:
            return None
        self.stranger_reads.spend(now)
        # The subnet's bucket first: a subnet over its own rate does not drain everyone's.
        source = self.sources.get(connection)
        if source is None:  # once per connection: a flood pays this per frame otherwise
            host = metadata("Peer-Address") or ""
            source = self.sources[connection] = (host, subnet_of(host))
            while len(self.sources) > self.max_stranger_links + self.max_peer_links:
                self.sources.popitem(last=False)
        subnet = source[1]
        if not (self.subnet_rate.allow(subnet, now) and self.stranger_rate.allow(None, now)):
            return STRANGER_RATE_LIMITED
        return None

    def source(self, connection: bytes) -> str | None:
        """The host a stranger's connection comes from (its IP address), if `budget` saw it."""
        source = self.sources.get(connection)
        return source[0] or None if source is not None else None

    def admit(self, connection: bytes, header: Header, metadata: Callable[[str], str | None], now: float) -> str | None:
        """None if the frame (within `budget`) may be verified, PARK, or the reason it is dropped."""
        if self.curve and not self._owns_connection(header.sender, metadata("User-Id")):
            return WRONG_SENDER
        link = self.peer_links.get(connection)
        if link is not None:
            if header.sender != link.key:
                return WRONG_SENDER
            if self.is_peer(link.key):
                self.peer_links.move_to_end(connection)
                return None if self.per_connection.allow(connection, now) else RATE_LIMITED
            del self.peer_links[connection]  # evicted since: a stranger's connection again
            self._remember_stranger(connection, link)
        return self._stranger_claim(connection, header)

    def _owns_connection(self, sender: bytes, user_id: str | None) -> bool:
        owner = self.connection_owners.get(user_id or "")
        if owner is None:
            try:
                owner = ed25519_y_of_curve_public(bytes.fromhex(user_id or ""))
            except ValueError:
                owner = b""  # no Ed25519 key has this transport key: no frame passes
            self.connection_owners[user_id or ""] = owner
            while len(self.connection_owners) > self.max_stranger_links + self.max_peer_links:
                self.connection_owners.popitem(last=False)
        return owner == ed25519_y(sender)

    def _stranger_claim(self, connection: bytes, header: Header) -> str | None:
        link = self.stranger_links.get(connection)
        if link is None:
            if header.type not in FIRST_TYPES and not self.is_peer(header.sender):
                return HANDSHAKE_FIRST
            self._remember_stranger(connection, _Link(header.sender))
            return None
        self.stranger_links.move_to_end(connection)
        if header.sender != link.key:
            return WRONG_SENDER
        if header.type not in HANDSHAKE_TYPES and not self.is_peer(header.sender):
            return PARK if link.proven else HANDSHAKE_FIRST
        return None

    def hold_for_admission(
        self, connection: bytes, header: Header, metadata: Callable[[str], str | None], frame: bytes, now: float
    ) -> bool:
        """On the peers' socket with CURVE, a frame of a key not yet admitted: its connection was
        authenticated with that key, which the ZAP handler let in only while it was being
        verified. It may have admitted this node first and sent at once: park the frame (as
        `park`) until its key is admitted, instead of refusing it. False: refuse it."""
        if not self.curve or not self._owns_connection(header.sender, metadata("User-Id")):
            return False
        link = self.stranger_links.get(connection)
        if link is None:
            link = _Link(header.sender, proven=True)  # the transport proved the key
            self._remember_stranger(connection, link)
        return link.key == header.sender and self.park(connection, frame, header.seq, now)

    def vouch(self, connection: bytes, header: Header, metadata: Callable[[str], str | None]) -> None:
        """On the peers' socket, a challenge or answer of a key that is not an admitted peer (one
        being verified, or a peer that dropped this node unnoticed: it may answer our challenge
        there) binds its connection to that key, as a HELLO does on the public socket; with
        CURVE as proven, the transport having authenticated the key (checked here)."""
        if connection in self.peer_links or connection in self.stranger_links:
            return
        proven = self.curve and self._owns_connection(header.sender, metadata("User-Id"))
        if self.curve and not proven:
            return  # `admit` refuses it: wrong_sender
        self._remember_stranger(connection, _Link(header.sender, proven=proven))

    def park(self, connection: bytes, frame: bytes, seq: int, now: float) -> bool:
        """Hold a frame `admit` answered PARK for (`seq` from its header); False (drop it) if
        the bounds are reached."""
        link = self.stranger_links.get(connection)
        if link is None or len(link.parked) >= MAX_PARKED_FRAMES or self.parked_bytes + len(frame) > MAX_PARKED_BYTES:
            return False
        link.parked.append((now, frame, seq))
        self.parked_bytes += len(frame)
        return True

    def unpark(self, now: float) -> tuple[list[tuple[bytes, list[bytes]]], list[bytes]]:
        """The parked frames to verify now, per connection in arrival order (their key is a peer
        now), and those dropped (held longer than PARK_S, or their connection forgotten)."""
        released, expired = [], self._forgotten_parked
        self._forgotten_parked = []
        for connection, link in list(self.stranger_links.items()):
            if not link.parked:
                continue
            if self.is_peer(link.key):
                released.append((connection, [frame for _, frame, _ in link.parked]))
                link.parked = []
            else:
                expired += [frame for when, frame, _ in link.parked if now - when > PARK_S]
                link.parked = [held for held in link.parked if now - held[0] <= PARK_S]
        self.parked_bytes = sum(len(f) for link in self.stranger_links.values() for _, f, _ in link.parked)
        return released, expired

    @property
    def parked_frames(self) -> int:
        return sum(len(link.parked) for link in self.stranger_links.values()) + len(self._forgotten_parked)

    def lowest_parked_seq(self, key: bytes) -> int | None:
        """The lowest sequence number of the frames parked for `key`, if any: being admitted, its
        replay window must leave them unseen (they were sent before the frame that admitted it
        may have been, and arrived first, or on its other connection)."""
        seqs = [seq for link in self.stranger_links.values() if link.key == key for _, _, seq in link.parked]
        return min(seqs, default=None)

    def _remember_stranger(self, connection: bytes, link: _Link) -> None:
        self.stranger_links[connection] = link
        while len(self.stranger_links) > self.max_stranger_links:
            _, forgotten = self.stranger_links.popitem(last=False)
            self._forgotten_parked += [frame for _, frame, _ in forgotten.parked]

    def verified(self, connection: bytes, sender: bytes) -> None:
        """A frame on `connection` verified as `sender`'s: the connection is proven to carry its
        frames, and becomes the link of an admitted peer once `sender` is one."""
        link = self.stranger_links.get(connection)
        if link is None or link.key != sender:
            return
        link.proven = True
        if self.is_peer(sender) and not link.parked:  # parked frames leave through `unpark` first
            del self.stranger_links[connection]
            self.peer_links[connection] = link
            while len(self.peer_links) > self.max_peer_links:
                self.peer_links.popitem(last=False)

    def failed(self, connection: bytes) -> None:
        """A frame on `connection` did not verify (or was a replay): a claim that nothing proved
        binds nothing, and a peer's link that carried it must prove itself again."""
        link = self.stranger_links.get(connection)
        if link is not None and not link.proven:
            del self.stranger_links[connection]
        self.peer_links.pop(connection, None)

    def counts(self) -> dict[str, int]:
        return {"peer_links": len(self.peer_links), "stranger_connections": len(self.stranger_links)}
