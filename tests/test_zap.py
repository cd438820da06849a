"""Who may connect (p2pnode/wire/zap.py), on simulated time: the connection caps and the bans of the
suspects of aborts, without sockets."""

from collections import Counter

import pytest
import zmq

from p2pnode.wire.settings import SecuritySettings
from p2pnode.wire.zap import PEERS_DOMAIN, ZAP_DOMAIN, Connections
from p2pnode.wire.zmqsetup import PEERS, PUBLIC

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


def test_an_address_connecting_just_before_two_aborts_in_a_row_is_refused_for_the_ban():
    connections = _connections(abort_strikes=2, abort_suspect_s=2.0, abort_ban_s=300.0)
    connections.socket_up(PUBLIC, 0.0)
    _accept(connections, 5, "10.0.0.1", 0.5)  # an honest peer's connection, held all along
    _accept(connections, 6, "10.0.0.9", 9.5)  # the attacker's fresh one
    assert connections.forget_all(PUBLIC, 10.0, aborted=True) == []  # one strike
    connections.socket_up(PUBLIC, 10.0)
    _accept(connections, 5, "10.0.0.1", 10.1)  # the honest peer reconnects at once
    _accept(connections, 7, "10.0.0.9", 14.0)
    assert connections.forget_all(PUBLIC, 15.0, aborted=True) == ["10.0.0.9"]
    assert connections.counts["abort_banned"] == 1
    assert not _allowed(connections, "10.0.0.9", OTHER_KEY, 16.0)
    assert connections.counts["zap_denied_aborts"] == 1
    assert not _allowed(connections, "10.0.0.9", None, 16.0, PEERS_DOMAIN)  # both sockets
    assert _allowed(connections, "10.0.0.1", OTHER_KEY, 16.0)
    assert _allowed(connections, "10.0.0.9", PEER_KEY, 16.0)  # an admitted peer's key on that host
    assert _allowed(connections, "10.0.0.9", OTHER_KEY, 315.1)  # the ban is over
    assert not connections.banned


def test_an_exit_that_is_no_abort_and_strikes_far_apart_ban_nobody():
    connections = _connections(abort_strikes=2, abort_suspect_s=2.0, abort_ban_s=60.0)
    connections.socket_up(PUBLIC, 0.0)
    _accept(connections, 6, "10.0.0.9", 9.5)
    assert connections.forget_all(PUBLIC, 10.0, aborted=False) == []  # ended otherwise: no strike
    _accept(connections, 6, "10.0.0.9", 19.5)
    assert connections.forget_all(PUBLIC, 20.0, aborted=True) == []  # strike 1
    _accept(connections, 6, "10.0.0.9", 99.5)
    assert connections.forget_all(PUBLIC, 100.0, aborted=True) == []  # 80 s later: strike 1 again
    assert _allowed(connections, "10.0.0.9", OTHER_KEY, 100.5)
    assert _connections(abort_ban_s=0).forget_all(PUBLIC, 1.0, aborted=True) == []  # bans off


def test_an_admitted_peers_key_aborting_the_peers_socket_twice_is_refused_but_not_while_all_reconnect():
    connections = _connections(abort_strikes=2, abort_suspect_s=2.0, abort_ban_s=300.0)
    connections.socket_up(PEERS, 0.0)
    honest = b"h" * 32
    for when in (5.0, 9.0):
        assert _allowed(connections, "10.0.0.2", PEER_KEY, when, PEERS_DOMAIN)  # the Byzantine peer
        connections.forget_all(PEERS, when + 0.5, aborted=True)
        connections.socket_up(PEERS, when + 0.6)
        # Every peer reconnects right after a restart: not a suspect then.
        connections.keys_allowed.append((when + 0.7, PEERS, honest))
    assert connections.banned == {PEER_KEY: 9.5 + 300.0}
    assert not _allowed(connections, "10.0.0.2", PEER_KEY, 10.0, PEERS_DOMAIN)
    assert not _allowed(connections, "10.0.0.2", PEER_KEY, 10.0)  # its key on the public socket too
    assert honest not in connections.banned and "10.0.0.2" not in connections.banned
