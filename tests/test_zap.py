"""Who may connect (p2pnode/wire/zap.py), on simulated time: the connection caps and the bans of the
suspects of aborts, without sockets."""

from collections import Counter

import pytest
import zmq

from p2pnode.wire.settings import SecuritySettings
from p2pnode.wire.zap import PEERS_DOMAIN, ZAP_DOMAIN, Connections, PeerTransportKeys
from p2pnode.wire.zmqsetup import PEERS, PUBLIC
from protocol import Identity

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

PEER_KEY, OTHER_KEY = b"p" * 32, b"o" * 32


def _connections(**settings) -> Connections:
    return Connections(SecuritySettings(curve=True, **settings), Counter(), lambda key: key == PEER_KEY)


def _request(address: str, key: bytes | None, domain: bytes = ZAP_DOMAIN) -> list[bytes]:
    mechanism, credentials = (b"CURVE", [key]) if key is not None else (b"NULL", [])
    return [b"1.0", b"1", domain, address.encode(), b"", mechanism, *credentials]


def _allowed(connections: Connections, address: str, key: bytes | None, now: float, domain=ZAP_DOMAIN) -> bool:
    return connections.reply(_request(address, key, domain), now)[2] == b"200"


def _accept(connections: Connections, fd: int, address: str, now: float, socket: str = PUBLIC) -> None:
    connections.on_event(zmq.EVENT_ACCEPTED, fd, address, socket, now)


def test_the_address_that_reset_a_connection_just_before_two_aborts_is_refused_and_nobody_else():
    connections = _connections(abort_strikes=2, abort_suspect_s=2.0, abort_ban_s=300.0)
    connections.socket_up(PUBLIC, 0.0)
    _accept(connections, 5, "10.0.0.1", 0.5)  # an honest peer's connection, held all along
    _accept(connections, 6, "10.0.0.9", 9.5)  # the attacker's fresh one ...
    _accept(connections, 8, "10.1.0.3", 9.6)  # ... beside a bystander that just (re)connected
    connections.reset(PUBLIC, "10.0.0.9", 9.8)  # the attacker's reset, 0.2 s before the abort
    assert connections.forget_all(PUBLIC, 10.0, aborted=True) == []  # one strike
    connections.socket_up(PUBLIC, 10.0)
    _accept(connections, 5, "10.0.0.1", 10.1)  # the honest peer reconnects at once
    _accept(connections, 7, "10.0.0.9", 14.0)
    _accept(connections, 8, "10.1.0.3", 14.1)  # and the bystander again
    connections.reset(PUBLIC, "10.0.0.9", 14.9)
    assert connections.forget_all(PUBLIC, 15.0, aborted=True) == ["10.0.0.9"]
    assert connections.counts["abort_banned"] == 1 and connections.counts["abort_traced"] == 2
    assert not _allowed(connections, "10.0.0.9", OTHER_KEY, 16.0)
    assert connections.counts["zap_denied_aborts"] == 1
    assert not _allowed(connections, "10.0.0.9", None, 16.0, PEERS_DOMAIN)  # both sockets
    assert _allowed(connections, "10.1.0.3", OTHER_KEY, 16.0)  # the bystander: never a suspect
    assert _allowed(connections, "10.0.0.9", PEER_KEY, 16.0)  # an admitted peer's key on that host
    assert _allowed(connections, "10.0.0.9", OTHER_KEY, 315.1)  # the ban is over
    assert not connections.banned


def test_an_exit_that_is_no_abort_an_abort_traced_to_no_reset_and_strikes_far_apart_ban_nobody():
    connections = _connections(abort_strikes=2, abort_suspect_s=2.0, abort_ban_s=60.0)
    connections.socket_up(PUBLIC, 0.0)
    connections.reset(PUBLIC, "10.0.0.9", 9.5)
    assert connections.forget_all(PUBLIC, 10.0, aborted=False) == []  # ended otherwise: no strike
    _accept(connections, 6, "10.0.0.9", 19.5)  # connected just before, reset nothing
    assert connections.forget_all(PUBLIC, 20.0, aborted=True) == []
    assert connections.counts["abort_untraced"] == 1 and not connections.strikes
    connections.reset(PUBLIC, "10.0.0.9", 27.0)  # reset 3 s before: too long before to be it
    assert connections.forget_all(PUBLIC, 30.0, aborted=True) == [] and connections.counts["abort_untraced"] == 2
    connections.reset(PUBLIC, "10.0.0.9", 39.5)
    assert connections.forget_all(PUBLIC, 40.0, aborted=True) == []  # strike 1
    connections.reset(PUBLIC, "10.0.0.9", 119.5)
    assert connections.forget_all(PUBLIC, 120.0, aborted=True) == []  # 80 s later: strike 1 again
    assert _allowed(connections, "10.0.0.9", OTHER_KEY, 120.5)
    banless = _connections(abort_ban_s=0)
    banless.reset(PUBLIC, "10.0.0.9", 0.5)
    assert banless.forget_all(PUBLIC, 1.0, aborted=True) == []  # bans off


def test_an_admitted_peers_key_that_resets_is_refused_whatever_its_timing_unless_its_address_is_shared():
    """The crash-looper: an admitted key that strikes the peers' socket again right after each
    restart, when every peer reconnects, was never suspected (issue #43: 185 aborts in 32 s)."""
    honest = b"h" * 32
    connections = Connections(
        SecuritySettings(curve=True, abort_strikes=2, abort_suspect_s=2.0, abort_ban_s=300.0),
        Counter(),
        lambda key: key in (PEER_KEY, honest),
    )
    now = 0.0
    for _ in range(2):
        connections.socket_up(PEERS, now)
        assert _allowed(connections, "10.0.0.1", honest, now + 0.01, PEERS_DOMAIN)  # everyone reconnects
        assert _allowed(connections, "10.0.0.2", PEER_KEY, now + 0.01, PEERS_DOMAIN)  # the Byzantine peer
        connections.reset(PEERS, "10.0.0.2", now + 0.02)
        banned = connections.forget_all(PEERS, now + 0.03, aborted=True)
        now += 0.05
    assert banned == [f"key:{PEER_KEY.hex()}"]  # its key, not its host: others may share that
    assert not _allowed(connections, "10.0.0.2", PEER_KEY, now, PEERS_DOMAIN)
    assert _allowed(connections, "10.0.0.2", OTHER_KEY, now)
    assert not _allowed(connections, "10.0.0.3", PEER_KEY, now)  # its key on the public socket too, from anywhere
    assert honest not in connections.banned and _allowed(connections, "10.0.0.1", honest, now, PEERS_DOMAIN)
    # From an address several admitted keys connected from (one host, or a NAT), none is told.
    shared = Connections(
        SecuritySettings(curve=True, abort_strikes=1, abort_suspect_s=2.0, abort_ban_s=300.0),
        Counter(),
        lambda key: key in (PEER_KEY, honest),
    )
    shared.socket_up(PEERS, 0.0)
    for key in (honest, PEER_KEY):
        assert _allowed(shared, "10.0.0.1", key, 0.1, PEERS_DOMAIN)
    shared.reset(PEERS, "10.0.0.1", 0.2)
    assert shared.forget_all(PEERS, 0.3, aborted=True) == ["10.0.0.1"]
    assert shared.counts["abort_key_untold"] == 1 and _allowed(shared, "10.0.0.1", honest, 0.4, PEERS_DOMAIN)


def test_a_prefix_that_aborts_are_traced_to_is_throttled_not_banned():
    """An attacker with many addresses in one /24: each gets its own strikes, and once two of
    its aborts are traced to the prefix, strangers from it get in once per interval."""
    connections = _connections(abort_strikes=2, abort_suspect_s=2.0, abort_ban_s=300.0, abort_prefix_interval_s=10.0)
    connections.socket_up(PUBLIC, 0.0)
    for now, address in ((1.0, "10.9.9.1"), (2.0, "10.9.9.2")):
        connections.reset(PUBLIC, address, now - 0.1)
        assert connections.forget_all(PUBLIC, now, aborted=True) == []  # one strike each
        connections.socket_up(PUBLIC, now + 0.01)
    assert connections.counts["abort_prefix_throttled"] == 1
    assert _allowed(connections, "10.9.9.3", OTHER_KEY, 3.0)  # the first of the interval
    assert not _allowed(connections, "10.9.9.4", OTHER_KEY, 4.0)
    assert connections.counts["zap_denied_prefix_throttled"] == 1
    assert _allowed(connections, "10.9.9.4", OTHER_KEY, 13.5)  # the next interval
    assert _allowed(connections, "10.9.9.5", PEER_KEY, 14.0)  # an admitted peer's key: never throttled
    assert _allowed(connections, "10.8.0.1", OTHER_KEY, 14.0)  # another prefix: never throttled
    assert _allowed(connections, "10.9.9.6", OTHER_KEY, 302.5)  # over


def test_strangers_from_one_prefix_hold_its_share_and_newcomers_from_others_get_in():
    """1,000 idle handshakes from 20 addresses of one /24 (issue #43): the prefix's cap, not the
    node's whole, is what they take."""
    connections = _connections(max_connections=1024, max_connections_per_address=32, max_connections_per_prefix=128)
    held = 0
    for i in range(1000):
        address = f"10.9.9.{1 + i % 20}"
        _accept(connections, 100 + i, address, 1.0)
        if _allowed(connections, address, OTHER_KEY, 1.0):
            held += 1
        else:
            connections.on_event(zmq.EVENT_DISCONNECTED, 100 + i, None, PUBLIC, 1.0)  # libzmq closes it
    assert held == 128
    assert connections.counts["zap_denied_prefix_cap"] == 1000 - 128
    _accept(connections, 5000, "10.8.0.1", 2.0)
    assert _allowed(connections, "10.8.0.1", OTHER_KEY, 2.0)  # a newcomer from another prefix
    _accept(connections, 5001, "10.9.9.77", 2.0)
    assert _allowed(connections, "10.9.9.77", PEER_KEY, 2.0)  # an admitted peer from that prefix
    for fd in range(100, 1100):
        connections.on_event(zmq.EVENT_DISCONNECTED, fd, None, PUBLIC, 3.0)
    assert connections.by_prefix == {"10.8.0": 1, "10.9.9": 1}  # counted down as they go
    # Never below the cap per address: a host raised for a one-host testnet is not cut by it.
    one_host = _connections(max_connections_per_address=300, max_connections_per_prefix=128)
    for fd in range(300):
        _accept(one_host, fd, "127.0.0.1", 0.0)
        assert _allowed(one_host, "127.0.0.1", OTHER_KEY, 0.0)


def _refused_as_not_peer(connections: Connections, key: bytes, now: float) -> None:
    assert connections.reply(_request("10.0.0.2", key, PEERS_DOMAIN), now)[3] == b"zap_denied_not_peer"


def test_refusals_of_keys_admitted_soon_after_are_the_start_up_race_and_the_others_stay_refusals():
    """Issue #45: two nodes that start together admit each other a moment apart, and the first
    one's connection to the other's peers' socket is refused until then. Those refusals are
    counted apart once the key is admitted within `not_peer_race_s`; a stranger's, or one
    admitted later than that, stay refusals."""
    connections = _connections(not_peer_race_s=30.0)
    racer, late, stranger = b"r" * 32, b"l" * 32, b"s" * 32
    _refused_as_not_peer(connections, late, 0.0)
    _refused_as_not_peer(connections, racer, 1.0)
    _refused_as_not_peer(connections, racer, 3.0)  # it dialled again before it was admitted
    _refused_as_not_peer(connections, stranger, 3.0)
    connections.peer_admitted(racer, 4.0)
    assert connections.counts["not_peer_race_resolved"] == 2 and connections.counts["zap_denied_not_peer"] == 4
    connections.peer_admitted(late, 30.5)  # admitted, but too long after its refusal
    connections.peer_admitted(racer, 5.0)  # admitted again (evicted in between): nothing new
    assert connections.counts["not_peer_race_resolved"] == 2
    _refused_as_not_peer(connections, late, 40.0)  # refused anew: counted from then
    connections.peer_admitted(late, 69.0)
    assert connections.counts["not_peer_race_resolved"] == 3
    assert list(connections.not_peer.pending) == []  # the stranger's, past the window, forgotten too
    # 0: no refusal is ever taken for the race.
    off = _connections(not_peer_race_s=0.0)
    _refused_as_not_peer(off, racer, 1.0)
    off.peer_admitted(racer, 1.1)
    assert off.counts["not_peer_race_resolved"] == 0 and not off.not_peer.pending


def test_a_stranger_with_many_keys_holds_no_more_than_not_peer_race_keys():
    connections = _connections(not_peer_race_s=60.0, not_peer_race_keys=16)
    keys = [i.to_bytes(32, "big") for i in range(10_000)]
    for i, key in enumerate(keys):
        _refused_as_not_peer(connections, key, i * 0.001)
        assert len(connections.not_peer.pending) <= 16
    connections.peer_admitted(keys[0], 10.0)  # forgotten, the oldest: its refusal stays one
    connections.peer_admitted(keys[-1], 10.0)  # among the latest 16: the race
    assert connections.counts["not_peer_race_resolved"] == 1
    assert connections.counts["zap_denied_not_peer"] == 10_000


def test_the_node_tells_the_refusals_which_keys_membership_admits():
    """As p2pnode/node.py wires them: `PeerTransportKeys` reports each transport key admitted."""
    keys = PeerTransportKeys(curve=True)
    connections = Connections(SecuritySettings(curve=True), Counter(), keys.__contains__)
    keys.on_admitted = lambda key: connections.peer_admitted(key, 2.0)
    peer = Identity.generate()
    transport_key = peer.curve_keypair()[1]
    _refused_as_not_peer(connections, transport_key, 1.0)
    keys.track(peer.public_key, admitted=True)
    assert connections.counts["not_peer_race_resolved"] == 1
    assert connections.reply(_request("10.0.0.2", transport_key, PEERS_DOMAIN), 2.5)[2] == b"200"
