"""The gate's rules on hand-made headers: no sockets, no signatures, time passed in."""

from dataclasses import replace

import pytest

from p2pnode.wire.gate import PARK, PARK_S, Gate, subnet_of
from p2pnode.wire.settings import TransportSettings
from protocol import Header, MessageType

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

PEER, STRANGER, OTHER = b"p" * 32, b"s" * 32, b"o" * 32


def header(kind: MessageType, sender: bytes) -> Header:
    return Header(kind, sender, seq=1, timestamp_us=0, round=0, size=100)


def gate(peers: set[bytes], **settings) -> Gate:
    defaults = dict(
        stranger_rate=1e6, stranger_rate_per_subnet=1e6, stranger_burst=10_000, stranger_burst_per_subnet=10_000
    )
    return Gate(replace(TransportSettings(), **{**defaults, **settings}), 4, lambda key: key in peers)


def admit(g: Gate, connection: bytes, kind: MessageType, sender: bytes, now: float = 0.0, source: str = "10.0.0.1"):
    """What the daemon does per frame: the strangers' budget, then the header's claim."""

    def metadata(name: str) -> str | None:
        return source if name == "Peer-Address" else None

    return g.budget(connection, metadata, now) or g.admit(connection, header(kind, sender), metadata, now)


def test_a_strangers_connection_starts_with_hello_and_carries_handshake_frames_of_one_key():
    g = gate(set())
    assert admit(g, b"c1", MessageType.PING, STRANGER) == "handshake_first"
    assert admit(g, b"c1", MessageType.HELLO, STRANGER) is None
    assert admit(g, b"c1", MessageType.PING, STRANGER) is None
    assert admit(g, b"c1", MessageType.PONG, OTHER) == "wrong_sender"
    assert admit(g, b"c1", MessageType.MODEL, STRANGER) == "handshake_first"  # nothing verified here yet


def test_a_peers_link_takes_any_type_of_its_key_only():
    peers = {PEER}
    g = gate(peers)
    assert admit(g, b"c1", MessageType.MODEL, PEER) is None  # a re-established connection claims a peer
    g.verified(b"c1", PEER)
    assert g.counts() == {"peer_links": 1, "stranger_connections": 0}
    assert admit(g, b"c1", MessageType.PROTOTYPES, PEER) is None
    assert admit(g, b"c1", MessageType.HELLO, OTHER) == "wrong_sender"
    peers.clear()  # evicted: the link is a stranger's again
    assert admit(g, b"c1", MessageType.PROTOTYPES, PEER) == PARK  # proven connection, key not a peer


def test_strangers_together_get_the_strangers_rate_and_peers_are_not_counted_in_it():
    peers = {PEER}
    g = gate(peers, stranger_rate=10.0, stranger_burst=6)
    admit(g, b"p", MessageType.MODEL, PEER)  # a peer's re-established connection: a stranger's token
    g.verified(b"p", PEER)  # from now on its link, outside the strangers' rate
    answers = [admit(g, f"c{i}".encode(), MessageType.HELLO, bytes([i]) * 32) for i in range(20)]
    assert answers.count(None) == 5 and answers.count("stranger_rate_limited") == 15
    assert all(admit(g, b"p", MessageType.MODEL, PEER) is None for _ in range(100))
    assert admit(g, b"c99", MessageType.HELLO, STRANGER, now=1.0) is None  # tokens come back with time


def test_one_subnet_cannot_take_the_whole_strangers_rate():
    g = gate(set(), stranger_rate_per_subnet=10.0, stranger_burst_per_subnet=5)
    crowd = [admit(g, f"c{i}".encode(), MessageType.HELLO, bytes([i]) * 32, source="10.6.6.6") for i in range(10)]
    assert crowd.count(None) == 5
    assert admit(g, b"other", MessageType.HELLO, STRANGER, source="10.7.7.7") is None


def test_many_strangers_connections_never_push_out_a_peers_link():
    g = gate({PEER}, max_stranger_connections=8)
    admit(g, b"p", MessageType.MODEL, PEER)
    g.verified(b"p", PEER)
    for i in range(1000):
        admit(g, i.to_bytes(4, "big"), MessageType.HELLO, STRANGER)
    assert g.counts() == {"peer_links": 1, "stranger_connections": 8}
    assert admit(g, b"p", MessageType.MODEL, PEER) is None


def test_a_claim_that_fails_verification_binds_nothing():
    g = gate(set())
    admit(g, b"c1", MessageType.HELLO, STRANGER)
    g.failed(b"c1")
    assert admit(g, b"c1", MessageType.HELLO, OTHER) is None  # unbound: a new claim may start


def test_parked_frames_are_released_in_order_once_their_key_is_admitted_or_dropped_later():
    peers: set[bytes] = set()
    g = gate(peers)
    admit(g, b"c1", MessageType.HELLO, STRANGER)
    g.verified(b"c1", STRANGER)
    assert admit(g, b"c1", MessageType.PEERS, STRANGER) == PARK
    assert g.park(b"c1", b"first", 7, 0.0) and g.park(b"c1", b"second", 5, 0.0)
    assert g.lowest_parked_seq(STRANGER) == 5 and g.lowest_parked_seq(OTHER) is None
    assert g.unpark(0.1) == ([], [])
    peers.add(STRANGER)  # the answer to our challenge, handled since
    assert g.unpark(0.2) == ([(b"c1", [b"first", b"second"])], []) and g.parked_bytes == 0
    admit(g, b"c2", MessageType.HELLO, OTHER)
    g.verified(b"c2", OTHER)
    g.park(b"c2", b"late", 1, 1.0)
    assert g.unpark(1.0 + PARK_S + 0.1) == ([], [b"late"])
    assert not g.park(b"unknown", b"x", 1, 0.0)  # only on a connection whose HELLO verified


def test_subnets():
    assert subnet_of("10.1.2.3") == "10.1.2" and subnet_of(None) == "?"
    assert subnet_of("2001:db8::1") == subnet_of("2001:db8::ffff") == "2001:db8::/64"
