"""What `Membership` asks the node to do: the actions it returns, for the node to carry out in
order. And who told it of an address (`Informant`), which bounds what that address may cost."""

from __future__ import annotations

from dataclasses import dataclass

from protocol import Body

PURE = True  # no I/O and no clock: time comes in as arguments (tests/test_layering.py checks)

__all__ = [
    "Dial",
    "DialBack",
    "DialPeers",
    "Hangup",
    "SendHello",
    "Send",
    "Admitted",
    "Evicted",
    "Unreachable",
    "Action",
    "Direct",
    "Informant",
]


@dataclass(frozen=True)
class Dial:
    """Open (if not open yet) the outbound connection to `address`, where `key` is expected
    (None: a bootstrap address given without its key). With CURVE the connection is encrypted
    to that key, so only its holder can complete the handshake."""

    address: str
    key: bytes | None = None


@dataclass(frozen=True)
class Hangup:
    """Close the outbound connection to `address`; with `flush`, after what is queued there
    went out (within the transport's linger time): a BYE that says why."""

    address: str
    flush: bool = False


@dataclass(frozen=True)
class SendHello:
    """Send a freshly signed HELLO to `address`, then report back with `hello_sent`."""

    address: str


@dataclass(frozen=True)
class Send:
    """Sign `body` once and send the frame to every address."""

    addresses: tuple[str, ...]
    body: Body


@dataclass(frozen=True)
class DialPeers:
    """Open the outbound connection to the peers' socket of the admitted peer at `address`
    (frames larger than the public bound go there): its HELLO's `peer_port` on its host."""

    address: str
    peers_address: str


@dataclass(frozen=True)
class DialBack:
    """Send DIALED(`nonce`, `address`) to `address`, where `key` is expected, on a connection of
    its own that closes once the frame is out (dial_back.py): `key` asked to be dialled back."""

    address: str
    key: bytes
    nonce: int


@dataclass(frozen=True)
class Admitted:
    """`key` proved itself with the frame numbered `seq`: trust it from there on (replay window)."""

    key: bytes
    seq: int
    address: str


@dataclass(frozen=True)
class Evicted:
    """`key` is no peer any more: it is a stranger again."""

    key: bytes
    why: str


@dataclass(frozen=True)
class Unreachable:
    """The bootstrap address has left `attempts` challenges unanswered over `waited_s`: say so
    (once per streak); it is still retried, the next time in `next_in_s`."""

    address: str
    attempts: int
    waited_s: float
    next_in_s: float


Action = Dial | DialPeers | DialBack | Hangup | SendHello | Send | Admitted | Evicted | Unreachable


@dataclass(frozen=True)
class Direct:
    """A HELLO sent to us by its own key, over a connection from host `source` (None: unknown)."""

    source: str | None


Informant = bytes | Direct | str  # a relaying peer's key, the sender itself, "beacon" or "bootstrap"
