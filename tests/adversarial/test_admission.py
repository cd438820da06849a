"""Who gets into the peer table, and whom a node dials: Sybils, unverified addresses, dial-slot
exhaustion and reflection (issue #14), on the simulated network of tests/simnet.py (the same
`Membership` the daemon runs, real signed frames, simulated time)."""

import random

from p2pnode.discovery.actions import Dial, Evicted
from p2pnode.discovery.peers import Membership
from p2pnode.discovery.settings import DiscoverySettings
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


def test_sixty_client_sybils_behind_one_nat_count_as_one_subnet():
    """Client nodes (issue #46) have an address per key that names no host: they count in the
    subnet of the host their connections come from, so sixty keys behind one NAT get two places."""
    net = SimNet()
    target = net.add(0, max_peers=8, max_peers_per_subnet=2)
    sybils = [net.add(100 + i, [target.address], client_host="198.51.100.7") for i in range(60)]
    net.run(5)
    assert len(set(target.membership.peers) & {node.key for node in sybils}) == 2
    assert target.membership.counts["refused_subnet"] > 0
    honest = [net.add(200 + i, [target.address], client_host=f"203.0.{i}.1") for i in range(1, 5)]
    net.run(3)
    assert all(node.key in target.membership.peers for node in honest)


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


def test_a_full_table_of_settled_peers_displaces_none_for_newcomers_from_many_subnets():
    """Peers of one subnet (a LAN) that have settled stay whatever subnets newcomers come from."""
    net = SimNet()
    target = net.add(0, max_peers=4, max_peers_per_subnet=4, settled_after_s=5)
    crowd = [net.add(10 + i, [target.address], address=f"tcp://10.9.9.{i}:7000") for i in range(4)]
    net.run(6)
    assert {n.key for n in crowd} == set(target.membership.peers)
    for i in range(8):
        net.add(50 + i, [target.address], address=f"tcp://10.{70 + i}.7.7:7000")
    net.run(4)
    assert {n.key for n in crowd} == set(target.membership.peers)
    assert target.membership.counts["evicted_displaced"] == 0 and target.membership.counts["refused_full"] > 0


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


SETTLED = 3.0  # the target's `settled_after_s` in these tests (simulated seconds)
QUIET = {"ping_interval_s": 5.0, "peer_timeout_s": 15.0}  # the Sybils' own liveness: fewer frames to simulate


def _bounded_target_with_honest_peers(net: SimNet, **settings) -> tuple:
    """A node with `active_view` 4 (at most 6) and four honest peers, each in a subnet of its
    own, that would take many more peers (so Sybils sent on to them give them a surplus)."""
    target = net.add(0, active_view=4, max_peers=6, **settings)
    honest = [net.add(i, [target.address], address=f"tcp://10.1.{i}.1:7000") for i in range(1, 5)]
    net.run_until(lambda: len(target.membership.peers) == 4, timeout=3)
    return target, honest


def _displaced_by(net: SimNet, node) -> set[bytes]:
    """The keys `node` displaces from now on (filled in as the network runs)."""
    displaced: set[bytes] = set()
    execute = net.execute

    def recording(at, actions):
        if at is node:
            displaced.update(a.key for a in actions if isinstance(a, Evicted) and a.why == "displaced")
        execute(at, actions)

    net.execute = recording
    return displaced


def _sybils(net: SimNet, bootstrap: list[str], first: int, count: int, **settings) -> list:
    """`count` keys, each answering at an address of its own in a subnet of its own."""
    return [
        net.add(first + i, bootstrap, address=f"tcp://10.{first + i - 100}.{first % 250}.1:7000", **settings)
        for i in range(count)
    ]


def _settle(net: SimNet, target) -> None:
    """Run until every peer of `target` has been there `SETTLED` seconds."""
    oldest_young = max(peer.admitted_at for peer in target.membership.peers.values())
    net.run(max(0.0, oldest_young + SETTLED + 0.1 - net.now))


def test_sybils_from_many_subnets_displace_no_settled_peer():
    """A node at its active view redirects newcomers instead of admitting them. A newcomer that
    comes back may take the place of a peer that has a surplus without this node (the slack the
    overlay needs to converge, docs/daemon.md), and Sybils give an honest peer that surplus by
    being sent on to it; but a peer that has been in the table `settled_after_s` is never
    displaced. Thirty returning keys, each in a subnet of its own: every honest peer stays, the
    table stays within `max_peers`, and the Sybils did give them their surplus (the rule was
    armed: they take each other's places, beyond the target)."""
    net = SimNet()
    target, honest = _bounded_target_with_honest_peers(net, settled_after_s=SETTLED)
    _settle(net, target)
    displaced = _displaced_by(net, target)
    sybils = _sybils(net, [target.address], 100, 30, **QUIET)
    net.run(20)  # the redirected come back: bootstrap addresses are dialled again
    peers = target.membership.peers
    assert len(peers) <= 6 and target.membership.counts["redirected"] >= 25
    assert all(node.key in peers for node in honest) and not displaced & {node.key for node in honest}
    assert any(peers[node.key].reported_peers - 1 >= target.membership.target for node in honest)
    assert any(node.key in peers for node in sybils)


def test_sybils_that_first_inflate_the_honest_peers_displace_none_of_them():
    """The attacker uses two sets of keys: the first (twelve) joins the honest peers directly, so
    that each has a surplus before anything reaches the target; the second (fifteen) then asks
    the target, is sent on, and comes back, over and over. No settled peer loses its place."""
    net = SimNet()
    target, honest = _bounded_target_with_honest_peers(net, settled_after_s=SETTLED)
    for k, node in enumerate(honest):
        _sybils(net, [node.address], 100 + 10 * k, 3, active_view=1, max_peers=1, **QUIET)  # that one's only
    surplus = target.membership.target + 1
    # Their PEERS tell the target how many peers each has.
    net.run_until(lambda: all(p.reported_peers >= surplus for p in target.membership.peers.values()), timeout=60)
    _settle(net, target)
    displaced = _displaced_by(net, target)
    _sybils(net, [target.address], 150, 15, **QUIET)
    net.run(20)
    assert all(node.key in target.membership.peers for node in honest) and not displaced & {n.key for n in honest}
    assert target.membership.counts["redirected"] >= 15


def test_keys_turned_away_early_cannot_displace_a_peer_once_it_has_settled():
    """The attacker's keys ask first, are sent on, and wait. An honest peer admitted after that
    (one that replaces a peer that left), given a surplus by other keys of the attacker's, is
    never displaced once it has been in the table `settled_after_s`."""
    net = SimNet()
    target, honest = _bounded_target_with_honest_peers(net, settled_after_s=SETTLED)
    early = _sybils(net, [target.address], 100, 10)
    net.run_until(lambda: target.membership.counts["redirected"] >= 10, timeout=3)
    for node in early:
        net.kill(node)  # they wait (the target still counts them as redirected newcomers)
    net.kill(honest[0])  # a peer leaves; a newcomer takes its place
    late = net.add(5, [target.address], address="tcp://10.1.5.1:7000")
    net.run_until(lambda: late.key in target.membership.peers, timeout=20)
    for i in range(6):  # inflate it
        net.add(200 + i, [late.address], address=f"tcp://10.{100 + i}.9.1:7000", active_view=1, max_peers=1)
    surplus = target.membership.target + 1
    net.run_until(lambda: target.membership.peers[late.key].reported_peers >= surplus, timeout=60)
    _settle(net, target)
    displaced = _displaced_by(net, target)
    for node in early:
        node.up = True  # back, dialling the target again
    net.run(15)
    assert all(node.key in target.membership.peers for node in [late, *honest[1:]])
    assert not displaced & {node.key for node in [late, *honest[1:]]}


def test_sybils_can_displace_only_young_peers_and_cannot_isolate_a_node():
    """What stays open (docs/security.md): while a peer is younger than `settled_after_s` (a
    node's bring-up, or a peer that just replaced one that left), a returning newcomer may take
    its place if it has a surplus, and Sybils can give it one. Against thirty returning keys
    arriving right after the honest peers: every peer displaced was younger than
    `settled_after_s`, it keeps its target elsewhere, the longest-lived peer (protected, as the
    fastest are) stays, and the table stays within `max_peers`."""
    net = SimNet()
    target, honest = _bounded_target_with_honest_peers(net)
    oldest = min(target.membership.peers.values(), key=lambda peer: peer.admitted_at).key
    ages = {}  # of the peers displaced, when they were
    evict = target.membership._evict

    def recording(peer, now, why):
        if why == "displaced":
            ages[peer.key] = now - peer.admitted_at
        return evict(peer, now, why)

    target.membership._evict = recording
    for i in range(30):
        net.add(100 + i, [target.address], address=f"tcp://10.{100 + i}.0.1:7000")
    net.run(8)  # the redirected come back: bootstrap addresses are dialled again
    peers = target.membership.peers
    assert len(peers) <= 6 and oldest in peers and target.membership.counts["redirected"] >= 25
    assert all(age < target.membership.settings.settled_after_s for age in ages.values())
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
