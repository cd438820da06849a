"""Discovery rules, on the simulated network of tests/simnet.py (real frames, simulated time)."""

import pytest

from protocol import PROTOCOL_VERSION, Bye, Encoder, Hello, Ping

from .simnet import NETWORK, SimNet


def ring(net: SimNet, count: int, **settings):
    addresses = [f"tcp://10.0.0.{i}:7000" for i in range(count)]
    return [net.add(i, [addresses[(i + 1) % count]], **settings) for i in range(count)]


@pytest.mark.parametrize("count", [2, 3, 8, 30])
def test_a_ring_of_single_bootstraps_becomes_a_full_mesh(count):
    net = SimNet()
    ring(net, count)
    took = net.run_until(net.full_mesh, timeout=10)
    assert took < 3.0
    net.run(5)  # and it stays one: pings keep everyone alive
    assert net.full_mesh()


def test_handshake_verifies_both_ways_and_never_loops():
    net = SimNet()
    a, b = net.add(0, ["tcp://10.0.0.1:7000"]), net.add(1)
    net.run_until(net.full_mesh, timeout=2)
    net.run(3)
    assert a.membership.counts["admitted"] == b.membership.counts["admitted"] == 1
    assert not b.membership.dialing and not a.membership.dialing
    # Each is admitted at the address where it answered the other's challenge.
    assert a.membership.peers[b.key].address == b.address and b.membership.peers[a.key].address == a.address


@pytest.mark.parametrize("count", [2, 8])
def test_a_peer_is_ready_only_once_it_admitted_us(count):
    """A node pings, gossips to and sends learning payloads to its ready peers only: if it took
    one for ready too early, that peer would refuse what it sends as from an unknown peer."""
    net = SimNet()
    nodes = ring(net, count)
    net.run_until(net.full_mesh, timeout=5)
    net.run(2)
    assert all(len(n.membership.ready()) == count - 1 for n in nodes)
    assert net.refusals == {}


def test_a_challenge_is_answered_only_after_our_own_hello():
    """The answer to a stranger's challenge goes to the address it claims, on the connection
    where our HELLO went first, so that the other side can bind that connection to our key."""
    net = SimNet()
    net.add(0, ["tcp://10.0.0.1:7000"])
    net.add(1)
    sent = []
    execute = net.execute
    net.execute = lambda node, actions: (
        sent.extend((node.index, action) for action in actions),
        execute(node, actions),
    )
    net.run_until(net.full_mesh, timeout=2)
    from_b = [
        type(action).__name__ + getattr(getattr(action, "body", None), "TYPE", "") for i, action in sent if i == 1
    ]
    first_pong = next(i for i, name in enumerate(from_b) if name == "SendPONG")
    assert "SendHello" in from_b[:first_pong]


def test_table_never_exceeds_max_peers():
    net = SimNet()
    nodes = ring(net, 10, max_peers=3)
    net.run(5)
    assert all(len(n.membership.peers) <= 3 for n in nodes)
    assert sum(n.membership.counts["refused_full"] for n in nodes) > 0


def test_a_killed_peer_is_evicted_in_time_and_readmitted_after_restart():
    net = SimNet()
    nodes = ring(net, 4, ping_interval_s=0.5, peer_timeout_s=1.5)
    net.run_until(net.full_mesh, timeout=5)
    victim = nodes[2]
    net.kill(victim)
    took = net.run_until(lambda: all(victim.key not in n.membership.peers for n in nodes if n.up), timeout=5)
    assert 1.5 <= took <= 1.5 + 0.5 + 0.1  # timeout, plus at most one ping interval of last_seen age
    # Restart with the same key (its sequence numbers continue above the old ones).
    del net.nodes[victim.address]
    reborn = net.add(2, [nodes[3].address], seed_identity=2)
    assert reborn.key == victim.key
    net.run_until(net.full_mesh, timeout=5)


def test_bye_evicts_at_once():
    net = SimNet()
    a, b, c = ring(net, 3)
    net.run_until(net.full_mesh, timeout=5)
    net.execute(b, b.membership.goodbye())
    net.kill(b)
    net.run(0.1)
    assert b.key not in a.membership.peers and b.key not in c.membership.peers
    assert a.membership.counts["evicted_bye"] == 1


def test_a_bootstrap_that_is_down_at_start_is_retried_until_it_comes_up():
    net = SimNet()
    a = net.add(0, ["tcp://10.0.0.1:7000"])
    net.run(3)
    assert not a.membership.peers and "tcp://10.0.0.1:7000" in a.membership.dialing
    net.add(1)
    net.run_until(net.full_mesh, timeout=6)  # retries are backed off to at most dial_retry_max_s


def test_an_unreachable_bootstrap_is_reported_once_per_streak():
    """After `dial_attempts` unanswered challenges a bootstrap address is reported unreachable
    (the node logs it), once; it is still retried, and reported again only after it answered
    and was lost."""
    from p2pnode.discovery.actions import Unreachable

    net = SimNet()
    bootstrap = "tcp://10.0.0.1:7000"
    a = net.add(0, [bootstrap], dial_attempts=3, dial_retry_max_s=0.2, ping_interval_s=0.2, peer_timeout_s=1.0)
    reported = []
    execute = net.execute
    net.execute = lambda node, actions: (
        reported.extend(action for action in actions if isinstance(action, Unreachable)),
        execute(node, actions),
    )
    net.run(3)
    (first,) = reported
    assert (first.address, first.attempts) == (bootstrap, 3) and 0.1 < first.waited_s < 1.0
    assert a.membership.counts["bootstrap_unreachable"] == 1 and bootstrap in a.membership.dialing
    b = net.add(1)
    net.run_until(net.full_mesh, timeout=3)
    net.kill(b)
    net.run(4)  # evicted after peer_timeout_s, then dialled again in vain
    assert len(reported) == 2 and a.membership.counts["bootstrap_unreachable"] == 2


def test_a_learned_address_that_never_answers_is_given_up():
    net = SimNet()
    b = net.add(1)
    ghost = net.add(2, [b.address])
    net.run_until(net.full_mesh, timeout=2)
    net.kill(ghost)  # b keeps it as a peer until peer_timeout_s, and relays its HELLO
    a = net.add(0, [b.address], dial_attempts=3, dial_retry_max_s=0.2)
    net.run(3)
    assert ghost.key not in a.membership.peers and ghost.address not in a.membership.dialing
    assert a.membership.counts["gave_up"] == 1


def test_stale_relayed_hellos_are_ignored():
    net = SimNet()
    a = net.add(0)
    old = net.add(5)
    frame = old.membership.own_hello
    net.now += 901  # older than hello_max_age_s (900)
    assert a.membership.on_announced(net.decoder.decode(frame), frame, net.now, net.now_us()) == []
    assert a.membership.counts["stale_hello"] == 1


def test_own_address_in_bootstrap_is_dropped():
    net = SimNet()
    a = net.add(0, ["tcp://10.0.0.0:7000", "tcp://10.0.0.1:7000"])
    net.add(1)
    net.run(2)
    assert "tcp://10.0.0.0:7000" not in a.membership.dialing
    assert len(a.membership.peers) == 1


def test_pong_gives_rtt_and_repeated_hellos_are_answered_sparingly():
    net = SimNet(latency=0.004)
    a, b = ring(net, 2)
    net.run_until(net.full_mesh, timeout=2)
    net.run(2)
    assert 0.007 <= a.membership.peers[b.key].rtt_s <= 0.009  # two legs of 4 ms
    hello = net.decoder.decode(
        Encoder(b.encoder.identity, NETWORK).encode(
            Hello(address=b.address, capabilities=(), dataset_size=0, protocol_versions=(PROTOCOL_VERSION,)),
            seq=10**18,
            timestamp_us=net.now_us(),
            round=0,
        )
    )
    from p2pnode.discovery.actions import SendHello

    # Long enough after the handshake's HELLOs that the next one is answered, then four more at once.
    later = max(a.membership.peers[b.key].last_hello_at, net.now) + a.membership.settings.dial_retry_initial_s
    answers = [a.membership.on_hello(hello, b"", later) for _ in range(5)]
    assert [SendHello(b.address) in answer for answer in answers] == [True, False, False, False, False], answers


def test_ping_pong_bye_from_strangers_are_refused():
    net = SimNet()
    a, stranger = net.add(0), net.add(9)
    for body in (Ping(nonce=1), Bye(reason="x")):
        envelope = net.decoder.decode(net.frame(stranger, body))
        actions, refusal = a.membership.on_message(envelope, b"", net.now, net.now_us())
        assert actions == [] and refusal == "unknown_peer"


def test_a_challenge_is_not_answered_on_a_connection_where_our_hello_was_dropped():
    """A HELLO dropped because the connection was not up yet (a CURVE handshake waits for the
    other side's ZAP handler) must not be overtaken by our answer to its challenge: a PONG
    opening the connection would be refused there (handshake_first). It waits for our next HELLO."""
    import random

    from p2pnode.discovery.actions import Send, SendHello
    from p2pnode.discovery.peers import Membership
    from p2pnode.discovery.settings import DiscoverySettings
    from protocol import Decoder, Identity, Pong

    own, other = Identity.generate(), Identity.generate()
    membership = Membership(own.public_key, DiscoverySettings(), rng=random.Random(0), now=0.0)
    address = "tcp://10.0.0.9:7000"
    encoder, decoder = Encoder(other, NETWORK), Decoder(NETWORK)
    body = Hello(address=address, capabilities=(), dataset_size=0, protocol_versions=(PROTOCOL_VERSION,))
    hello_frame = encoder.encode(body, seq=1, timestamp_us=1, round=0)
    membership.on_hello(decoder.decode(hello_frame), hello_frame, now=0.0)  # opens the connection
    assert SendHello(address) in membership.tick(1.0)
    membership.hello_sent(address, False, 1.0)  # dropped: not connected yet
    challenge = decoder.decode(encoder.encode(Ping(nonce=5), seq=2, timestamp_us=1, round=0))
    assert membership.on_ping(other.public_key, challenge.body) == ([], None)
    retry = membership.tick(10.0)
    assert retry.index(SendHello(address)) < retry.index(Send((address,), Pong(nonce=5)))
    membership.hello_sent(address, True, 10.0)
    assert membership.on_ping(other.public_key, challenge.body) == ([Send((address,), Pong(nonce=5))], None)


def test_reachability_is_public_once_enough_peers_reached_the_address_and_private_only_without_any():
    from p2pnode.discovery.reachability import MAX_REMEMBERED, PRIVATE, PUBLIC, UNKNOWN, Reachability

    seen, address = Reachability(confirmations=2), "tcp://10.0.0.10:7000"
    assert seen.state == UNKNOWN
    seen.unanswered("tcp://198.51.100.10:7000")  # a bootstrap took our connection and never answered
    assert seen.state == PRIVATE and "likely behind a NAT" in seen.describe(address)["why"]
    seen.challenged(b"a" * 32)  # but one peer did reach us: not private, not yet public
    seen.challenged(b"a" * 32)  # the same peer twice counts once
    assert seen.state == UNKNOWN and seen.describe(address)["reached_by"] == 1
    seen.challenged(b"b" * 32)
    assert seen.state == PUBLIC and seen.describe(address)["why"] == "2 peers reached it at tcp://10.0.0.10:7000"
    for index in range(3 * MAX_REMEMBERED):  # a stranger's many keys are remembered within the bound
        seen.challenged(index.to_bytes(32, "big"))
    assert seen.describe(address)["reached_by"] == MAX_REMEMBERED


def test_a_dial_back_goes_only_to_the_askers_own_host_within_its_bounds():
    """DIAL_ME is taken from strangers (the node that needs it most is admitted nowhere), so what
    it costs is bounded: the one host it came from, once per interval, a few in all."""
    from p2pnode.discovery.dial_back import ANSWER_WITHIN_S, DIAL_BACK_RATE, DIAL_BACKS_BUSY, NO_SOURCE, DialBacks

    backs = DialBacks(interval_s=60, max_dial_backs=2, asks=2, first_at=5, now=0)
    assert backs.requested(None, 7000, 0) == (None, NO_SOURCE)  # nowhere to dial but a host it names: refused
    assert backs.requested("198.51.100.7", 7000, 0) == ("tcp://198.51.100.7:7000", None)
    assert backs.requested("198.51.100.7", 7001, 30) == (None, DIAL_BACK_RATE)  # one per host per interval
    assert backs.requested("2001:db8::1", 7000, 30) == ("tcp://[2001:db8::1]:7000", None)
    assert backs.requested("198.51.100.8", 7000, 31) == (None, DIAL_BACKS_BUSY)  # two in all per interval
    assert backs.requested("198.51.100.8", 7000, 61) == ("tcp://198.51.100.8:7000", None)  # the first one aged out
    assert backs.requested("198.51.100.7", 7000, 62) == (None, DIAL_BACKS_BUSY)
    # Asking: not before `first_at`, `asks` targets, each its own nonce; again after twice the
    # wait while nobody answered (a DIAL_ME sent before its connection was up is lost), then
    # once per interval.
    targets = ["tcp://198.51.100.1:7000", "tcp://198.51.100.2:7000", "tcp://198.51.100.3:7000"]
    assert backs.due(4, targets, 7000, [10, 11]) == []
    asks = backs.due(5, targets, 7000, [10, 11])
    assert [(ask.address, ask.nonce, ask.port) for ask in asks] == [(targets[0], 10, 7000), (targets[1], 11, 7000)]
    assert backs.due(6, targets, 7000, [12, 13]) == [] and backs.next_ask_at == 10
    assert backs.answered(10, 6) and not backs.answered(10, 6)  # each nonce counts once
    assert not backs.answered(99, 6)  # never asked
    assert len(backs.due(10, targets, 7000, [12, 13])) == 2 and backs.next_ask_at == 70  # answered: each interval
    assert not backs.answered(11, 5 + ANSWER_WITHIN_S + 1)  # too late


def test_a_node_not_known_to_be_reachable_asks_to_be_dialled_back_and_learns_where_it_is_reached():
    """Membership's side of it: asked while not public, the DIAL_ME's nonce answered by a DIALED
    from each of two nodes at another address than the advertised one (a router's, forwarding the
    port): `reachable_at` names it and the status says to advertise it. A stranger's DIAL_ME is a
    DialBack to its own host; a DIALED nobody asked for is refused."""
    import random

    from p2pnode.discovery.actions import DialBack, Send
    from p2pnode.discovery.dial_back import UNEXPECTED_DIALED
    from p2pnode.discovery.peers import Membership
    from p2pnode.discovery.settings import DiscoverySettings
    from protocol import Decoder, Dialed, DialMe, Encoder, MessageType

    from .conftest import fixed_identity

    settings = DiscoverySettings(bootstrap=("tcp://198.51.100.1:7000", "tcp://198.51.100.2:7000"), dial_back_after_s=1)
    advertised, forwarded = "tcp://10.0.0.5:7000", "tcp://203.0.113.5:7000"
    node = Membership(fixed_identity(1).public_key, settings, rng=random.Random(0), now=0, advertised=advertised)
    others = [Encoder(fixed_identity(2 + i), "sim") for i in range(3)]
    decoder = Decoder("sim")

    def envelope(sender: Encoder, body):
        frame = sender.encode(body, seq=1, timestamp_us=1, round=0)
        return decoder.decode(frame), frame

    asked = [action for action in node.tick(1.5) if isinstance(action, Send) and isinstance(action.body, DialMe)]
    assert [(ask.addresses, ask.body.port) for ask in asked] == [((address,), 7000) for address in settings.bootstrap]
    for sender, ask in zip(others, asked, strict=False):
        node.on_message(*envelope(sender, Dialed(nonce=ask.body.nonce, address=forwarded)), 2.0, 1)
    seen = node.reachability.describe(advertised)
    assert seen["reachable_at"] == [forwarded] and f"reached it at {forwarded}: advertise that" in seen["why"]
    assert seen["state"] != "public"  # its advertised address is still reached by nobody
    actions, refusal = node.on_message(*envelope(others[2], Dialed(nonce=1, address=forwarded)), 2.0, 1)
    assert (actions, refusal) == ([], UNEXPECTED_DIALED)
    ask = envelope(others[2], DialMe(nonce=7, port=7100))
    assert ask[0].type is MessageType.DIAL_ME
    actions, refusal = node.on_message(*ask, 2.0, 1, source="198.51.100.9")
    assert actions == [DialBack("tcp://198.51.100.9:7100", others[2].identity.public_key, 7)] and refusal is None
