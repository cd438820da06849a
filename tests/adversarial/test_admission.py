"""Who gets into the peer table, and whom a node dials: Sybils, unverified addresses, dial-slot
exhaustion and reflection (issue #14), on the simulated network of tests/simnet.py (the same
`Membership` the daemon runs, real signed frames, simulated time)."""

import random

from p2pnode.config import DiscoverySettings
from p2pnode.peers import Dial, Membership
from protocol import PROTOCOL_VERSION, Decoder, Encoder, Envelope, Hello, Identity, Peers

from ..simnet import NETWORK, SimNet


def _hello(net: SimNet, address: str) -> bytes:
    """A signed HELLO of a fresh key that nobody runs, naming `address`."""
    body = Hello(address=address, capabilities=(), dataset_size=0, protocol_versions=(PROTOCOL_VERSION,))
    return Encoder(Identity.generate(), NETWORK).encode(body, seq=1, timestamp_us=net.now_us(), round=0)


def test_sixty_sybils_from_one_subnet_cannot_fill_the_table():
    net = SimNet()
    limits = dict(max_peers=8, max_peers_per_subnet=2)
    target = net.add(0, **limits)
    # Sixty keys, each answering its challenge at an address of its own, all in 10.66.0.0/24.
    for i in range(60):
        net.add(100 + i, [target.address], address=f"tcp://10.66.0.{i}:7000", max_peers_per_subnet=4096)
    net.run(5)
    sybils = [p for p in target.membership.peers.values() if p.address.startswith("tcp://10.66.0.")]
    assert len(sybils) == 2
    # Honest newcomers from other subnets still get in.
    honest = [net.add(200 + i, [target.address], address=f"tcp://10.{i}.1.1:7000") for i in range(1, 5)]
    net.run(3)
    assert all(node.key in target.membership.peers for node in honest)
    assert len(target.membership.peers) <= 8


def test_a_full_table_keeps_its_long_lived_peers_and_displaces_only_from_the_crowded_subnet():
    net = SimNet()
    target = net.add(0, max_peers=4, max_peers_per_subnet=4)
    crowd = [net.add(10 + i, [target.address], address=f"tcp://10.9.9.{i}:7000") for i in range(4)]
    net.run(3)
    assert {n.key for n in crowd} == set(target.membership.peers)
    newcomer = net.add(50, [target.address], address="tcp://10.7.7.7:7000")
    net.run(3)
    assert newcomer.key in target.membership.peers and len(target.membership.peers) == 4
    assert target.membership.counts["evicted_displaced"] == 1
    oldest = min(crowd, key=lambda n: n.index)  # admitted first: protected
    assert oldest.key in target.membership.peers


def test_an_address_that_never_answers_its_challenge_is_neither_admitted_nor_relayed():
    net = SimNet()
    a = net.add(0)
    honest = net.add(2, [a.address])
    net.run_until(lambda: honest.key in a.membership.peers, timeout=2)
    # A stranger tells a its HELLO directly, naming an address where nobody answers.
    ghost = _hello(net, "tcp://10.50.0.1:7000")
    net.inject(a, ghost)
    net.run(15)  # dial_attempts challenges, backed off up to dial_retry_max_s
    relayed_anywhere = any(net.decoder.decode(ghost).sender in node.membership.peers for node in net.nodes.values())
    assert not relayed_anywhere and a.membership.counts["gave_up"] == 1


def test_one_peer_relaying_64_dead_addresses_takes_few_dial_slots_and_newcomers_still_get_in():
    net = SimNet()
    a = net.add(0)
    liar = net.add(1, [a.address])
    net.run_until(lambda: liar.key in a.membership.peers and a.membership.ready(), timeout=2)
    fake = tuple(_hello(net, f"tcp://10.{100 + i}.0.1:7000") for i in range(63))
    frame = net.frame(liar, Peers(hellos=(liar.membership.own_hello, *fake)))
    net.inject(a, frame)
    net.run(0.01)
    from_liar = [e for e in a.membership.dialing.values() if e.informant == liar.key]
    assert len(from_liar) == a.membership.settings.dialing_per_informant
    assert a.membership.counts["dial_budget_informant"] == 63 - len(from_liar)
    newcomer = net.add(9, [a.address], address="tcp://10.9.0.1:7000")
    net.run_until(lambda: newcomer.key in a.membership.peers, timeout=1)


def test_hellos_naming_a_victim_subnet_make_at_most_a_few_dials_there():
    """Reflection: strangers' HELLOs (100 keys) all naming addresses in one victim subnet."""
    net = SimNet()
    a = net.add(0, dialing_per_subnet=4)
    dials = []
    execute = net.execute
    net.execute = lambda node, actions: (
        dials.extend(x for x in actions if type(x).__name__ == "Dial"),
        execute(node, actions),
    )
    for i in range(100):
        net.inject(a, _hello(net, f"tcp://10.200.0.{i}:7000"))
    net.run(0.5)
    victims = {d.address for d in dials if d.address.startswith("tcp://10.200.0.")}
    assert len(victims) == 4 and a.membership.counts["dial_budget_subnet"] == 96


def test_strangers_from_many_hosts_take_half_the_dial_slots_and_relayed_addresses_keep_the_rest():
    """A botnet: throwaway keys from 20 source subnets, each HELLO naming a dead address. Their
    dials back hold at most half of `max_dialing` (each source subnet `dialing_per_informant`);
    an address relayed by a peer is still dialled."""
    settings = DiscoverySettings(subnet_limits_exempt=())
    membership = Membership(Identity.generate().public_key, settings, rng=random.Random(0), now=0.0)
    decoder = Decoder(NETWORK)

    def hello(address: str) -> tuple[Envelope, bytes]:
        body = Hello(address=address, capabilities=(), dataset_size=0, protocol_versions=(PROTOCOL_VERSION,))
        frame = Encoder(Identity.generate(), NETWORK).encode(body, seq=1, timestamp_us=0, round=0)
        return decoder.decode(frame), frame

    for source in range(20):
        for k in range(5):
            membership.on_hello(*hello(f"tcp://10.{source}.{k}.1:7000"), now=0.0, source=f"10.{source}.0.9")
    direct = len(membership.dialing)
    assert direct == settings.max_dialing // 2
    assert membership.counts["dial_budget_source"] > 0 and membership.counts["dial_budget_direct"] > 0
    relayed = membership.on_announced(*hello("tcp://10.99.0.1:7000"), now=0.0, now_us=0, informant=b"a peer's key")
    assert isinstance(relayed[0], Dial) and len(membership.dialing) == direct + 1


def test_sybils_from_many_subnets_cannot_isolate_a_node_with_a_bounded_view():
    """A node at its active view redirects newcomers instead of admitting them. A newcomer that
    comes back may take the place of a peer that has a surplus without this node (the slack the
    100-daemon overlay needs to converge, docs/daemon.md), and Sybils can give an honest peer that
    surplus by being redirected to it. What holds against thirty returning keys, each in a
    subnet of its own: the table stays within `max_peers`, the longest-lived peer (protected,
    as the fastest are) keeps its place, and an honest peer that loses its place still has as
    many peers as this node's target elsewhere: nobody is cut off. (The trade-off:
    docs/security.md.)"""
    net = SimNet()
    target = net.add(0, active_view=4, max_peers=6)
    honest = [net.add(i, [target.address], address=f"tcp://10.1.{i}.1:7000") for i in range(1, 5)]
    net.run_until(lambda: len(target.membership.peers) == 4, timeout=3)
    oldest = min(target.membership.peers.values(), key=lambda peer: peer.admitted_at).key
    for i in range(30):
        net.add(100 + i, [target.address], address=f"tcp://10.{100 + i}.0.1:7000")
    net.run(8)  # the redirected come back: bootstrap addresses are dialled again
    peers = target.membership.peers
    assert len(peers) <= 6 and oldest in peers and target.membership.counts["redirected"] >= 25
    displaced = [node for node in honest if node.key not in peers]
    assert len(displaced) < len(honest)
    assert all(len(node.membership.peers) >= target.membership.target for node in displaced)  # the surplus it had


def test_a_peer_relaying_dead_addresses_cannot_flush_the_passive_view():
    """When the passive view is full, an entry of the informant with the most entries makes
    room: a liar relaying 63 dead addresses over and over keeps what honest peers relayed."""
    net = SimNet()
    a = net.add(0, active_view=2, max_peers=2, passive_view=16)
    honest = net.add(1, [a.address], address="tcp://10.1.0.1:7000")
    liar = net.add(2, [a.address], address="tcp://10.2.0.1:7000", max_peers=1)  # relays none of them
    net.run_until(lambda: len(a.membership.ready()) == 2, timeout=3)
    known = [net.add(10 + i, [honest.address], address=f"tcp://10.3.{i}.1:7000") for i in range(8)]
    net.run_until(lambda: all(n.key in a.membership.passive for n in known), timeout=10)
    for _ in range(5):
        fake = tuple(_hello(net, f"tcp://10.{100 + i}.0.1:7000") for i in range(63))
        net.inject(a, net.frame(liar, Peers(hellos=(liar.membership.own_hello, *fake))))
        net.run(0.2)
    assert all(n.key in a.membership.passive for n in known)
    assert len(a.membership.passive) == 16
