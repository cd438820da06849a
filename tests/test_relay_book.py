"""A relay's reservations and a client's choice of relays (p2pnode/relay/): pure, on simulated time."""

from collections import Counter
from types import SimpleNamespace

import pytest

from p2pnode.discovery.peer import Peer
from p2pnode.relay.book import Reservations
from p2pnode.relay.circuits import CircuitBook
from p2pnode.relay.client import ANSWER_WITHIN_S, RelayChoice
from p2pnode.relay.settings import RelaySettings
from protocol import node_id
from protocol.messages import CLIENT_CAPABILITY, RELAY_CAPABILITY, client_address

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

ON = RelaySettings(enabled=True)


def key(i: int) -> bytes:
    return i.to_bytes(32, "big")


def subnet(i: int) -> str:
    return f"10.{i // 256}.{i % 256}.0/24"


def test_a_reservation_is_granted_renewed_given_up_and_expires():
    counts = Counter()
    book = Reservations(RelaySettings(enabled=True, reservation_ttl_s=600), counts)
    assert book.request(key(1), subnet(1), 3600, now=0.0) == (600, None)  # at most the relay's bound
    assert book.holds(key(1), 599.0) and not book.holds(key(1), 600.0)
    assert book.request(key(1), subnet(1), 300, now=500.0) == (300, None)  # renewed: 800
    assert book.expire(799.0, peers={key(1)}) == [] and book.expire(800.0, peers={key(1)}) == [key(1)]
    assert book.request(key(2), subnet(2), 60, now=0.0) == (60, None)
    assert book.request(key(2), subnet(2), 0, now=1.0) == (0, None) and len(book) == 0  # given up
    assert book.request(key(3), subnet(3), 60, now=0.0) == (60, None)
    assert book.expire(1.0, peers=set()) == [key(3)]  # its holder is no peer any more
    assert counts == Counter(
        reservations_granted=3, reservations_renewed=1, reservations_expired=1, reservations_holder_gone=1
    )


def test_a_node_that_relays_for_nobody_says_so():
    counts = Counter()
    assert Reservations(RelaySettings(), counts).request(key(1), None, 60, 0.0) == (0, "not_relay")
    assert counts == Counter(reservation_refused_not_relay=1)


def test_a_thousand_keys_from_one_subnet_get_that_subnets_places_and_no_more():
    counts = Counter()
    book = Reservations(ON, counts)
    granted = [book.request(key(i), subnet(0), 600, 0.0)[0] > 0 for i in range(1000)]
    assert sum(granted) == ON.max_reservations_per_subnet == 8
    assert counts["reservation_refused_subnet"] == 992
    # Another subnet still gets its own places.
    assert book.request(key(5000), subnet(1), 600, 0.0) == (600, None)


def test_a_thousand_keys_from_many_subnets_fill_the_relay_but_never_take_a_held_place():
    counts = Counter()
    book = Reservations(ON, counts)
    honest = [key(100_000 + i) for i in range(10)]
    for i, holder in enumerate(honest):
        assert book.request(holder, subnet(10_000 + i), 600, 0.0) == (600, None)
    sybils = [(key(i), subnet(i // 4)) for i in range(1000)]  # 250 subnets, 4 keys each (under 8)
    granted = sum(book.request(k, s, 600, 1.0)[0] > 0 for k, s in sybils)
    assert len(book) == ON.max_reservations == 128 and granted == 128 - len(honest)
    assert counts["reservation_refused_full"] == 1000 - granted
    # The honest holders keep theirs, and renew them, however full the relay is.
    assert all(book.holds(holder, 599.0) for holder in honest)
    assert all(book.request(holder, None, 600, 300.0) == (600, None) for holder in honest)
    # A place that frees up goes to whoever asks next.
    book.drop(sybils[0][0])
    assert book.request(key(9999), subnet(9999), 600, 2.0) == (600, None)


def relay(i: int, admitted_at: float = 0.0, sub: str | None = None, rtt: float | None = None, caps=(RELAY_CAPABILITY,)):
    address = f"tcp://10.0.{i}.1:7000"
    return Peer(
        key=key(i),
        address=address,
        capabilities=caps,
        dataset_size=0,
        hello=b"",
        hello_timestamp_us=0,
        admitted_at=admitted_at,
        last_seen=admitted_at,
        subnet=sub if sub is not None else subnet(i),
        rtt_s=rtt,
        hello_address=address,
    )


def test_a_client_asks_relays_in_distinct_subnets_the_longest_admitted_first():
    choice = RelayChoice(ON, Counter())
    peers = [
        relay(1, admitted_at=5.0, sub="a"),
        relay(2, admitted_at=1.0, sub="a"),
        relay(3, admitted_at=3.0, sub="b"),
        relay(4, admitted_at=0.0, caps=()),  # relays for nobody
        relay(5, admitted_at=0.0, caps=(RELAY_CAPABILITY, CLIENT_CAPABILITY)),
    ]
    peers[4].address = client_address(key(5))  # a client node cannot be dialled
    asked = choice.due(peers, now=10.0)
    assert [k for k, _ in asked] == [key(2), key(3)]  # one per subnet: 2 before 1 (admitted first)
    assert choice.due(peers, now=11.0) == []  # waiting for the answers
    assert choice.answered(key(2), 600, None, now=12.0) and choice.answered(key(3), 0, "full", now=12.0)
    assert not choice.answered(key(3), 600, None, now=12.0)  # not asked again since
    # Relay 3 refused: it rests, so the other subnet's second relay is asked.
    assert [k for k, _ in choice.due(peers, now=13.0)] == [key(1)]
    assert choice.counts["reservation_held"] == 1 and choice.counts["reservation_refused_full"] == 1


def test_a_client_renews_halfway_and_replaces_a_relay_that_is_gone_or_silent():
    settings = RelaySettings(enabled=False, reservations=2, retry_s=30)
    choice = RelayChoice(settings, Counter())
    peers = [relay(1), relay(2), relay(3)]
    assert [k for k, _ in choice.due(peers, 0.0)] == [key(1), key(2)]
    choice.answered(key(1), 600, None, 1.0)  # relay 2 never answers
    assert choice.due(peers, ANSWER_WITHIN_S) == []  # asked at 0
    assert [k for k, _ in choice.due(peers, ANSWER_WITHIN_S + 0.1)] == [key(3)]  # 2 rests, 3 is asked
    choice.answered(key(3), 600, None, 12.0)
    assert [k for k, _ in choice.due(peers, 301.0)] == [key(1)]  # halfway through its 600 s: renewed
    choice.answered(key(1), 600, None, 302.0)
    assert choice.held[key(1)].expires_at == 902.0
    # Relay 3 stops being a peer: replaced at the next tick, by relay 2 once its rest is over.
    assert [k for k, _ in choice.due(peers[:2], 303.0)] == [key(2)]
    assert choice.counts["relay_lost"] == 1 and choice.counts["reservation_unanswered"] == 1


def circuit_book(**settings):
    counts = Counter()
    config = RelaySettings(enabled=True, **settings)
    book = Reservations(config, counts)
    return book, CircuitBook(config, book, counts), counts


def test_a_relay_forwards_only_to_holders_and_their_answers_and_each_circuit_at_its_rate():
    places, circuits, counts = circuit_book(circuit_rate=1024 * 100, max_frame_bytes=64 * 1024, total_rate=1 << 30)
    a, b, c = key(1), key(2), key(3)
    peers = {a, b, c}
    assert circuits.forward(a, b, 1000, peers, 0.0) == "no_reservation"  # b holds no place: no free pipe
    places.request(b, None, 600, 0.0)
    assert circuits.forward(a, b, 1000, peers, 0.0) is None  # opens the circuit a -> b
    assert circuits.forward(b, a, 1000, peers, 0.1) is None  # b answers a: no place needed
    assert circuits.forward(b, c, 1000, peers, 0.1) == "no_reservation"  # but to nobody else
    assert circuits.forward(a, key(9), 1000, peers, 0.1) == "gone"  # not a peer of the relay
    assert circuits.forward(a, b, 64 * 1024 + 1, peers, 0.2) == "too_large"
    # Its burst is a second of its rate (100 KiB), then 100 KiB a second.
    assert circuits.forward(a, b, 63 * 1024, peers, 0.2) is None
    assert circuits.forward(a, b, 40 * 1024, peers, 0.2) == "rate"  # 37 KiB left
    assert circuits.forward(a, b, 40 * 1024, peers, 0.4) is None  # 20 KiB back after 0.2 s
    assert counts["relayed_frames"] == 4 and counts["circuits_opened"] == 2 and counts["unrelayed_rate"] == 1
    circuits.close_idle(100.0, peers)  # idle past circuit_idle_s (60 s)
    assert circuits.circuits == {} and counts["circuits_closed"] == 2
    assert circuits.forward(b, a, 1000, peers, 100.0) == "no_reservation"  # no circuit to answer now


def test_one_origin_opens_a_bounded_number_of_circuits_and_the_relay_a_bounded_total():
    places, circuits, counts = circuit_book(max_circuits=10, max_circuits_per_peer=3, max_reservations=100)
    sybil, holders = key(1), [key(100 + i) for i in range(20)]
    peers = {sybil, *holders, *(key(200 + i) for i in range(20))}
    for holder in holders:
        places.request(holder, None, 600, 0.0)
    for holder in holders:  # none answers: each new one closes the origin's oldest
        assert circuits.forward(sybil, holder, 100, peers, 0.0) is None
    assert [pair[1] for pair in circuits.circuits] == holders[-3:] and counts["circuits_unanswered_closed"] == 17
    for i in range(20):  # many origins, one circuit each: the relay's total
        circuits.forward(key(200 + i), holders[i], 100, peers, 0.0)
    assert len(circuits.circuits) == 10
    # The relay's total rate is shared by all circuits.
    _, shared, _ = circuit_book(total_rate=4096, max_frame_bytes=4096, circuit_rate=1 << 20)
    shared.reservations.request(key(2), None, 600, 0.0)
    shared.reservations.request(key(3), None, 600, 0.0)
    assert shared.forward(key(1), key(2), 4000, {key(1), key(2), key(3)}, 0.0) is None
    assert shared.forward(key(1), key(3), 4000, {key(1), key(2), key(3)}, 0.0) == "rate"


def test_circuits_to_holders_that_never_answer_do_not_keep_an_origin_from_those_that_do():
    """A stranger's keys hold places (within their subnet's bound) and never answer: an honest
    origin's circuits to them fill its bound, yet it still opens one to an honest holder, by
    closing its oldest unanswered circuit; a circuit its target answered is never the one closed."""
    places, circuits, counts = circuit_book(max_circuits_per_peer=3)
    origin, honest, silent = key(1), key(2), [key(100 + i) for i in range(5)]
    peers = {origin, honest, *silent}
    for holder in (honest, *silent):
        places.request(holder, None, 600, 0.0)
    assert circuits.forward(origin, honest, 100, peers, 0.0) is None
    assert circuits.forward(honest, origin, 100, peers, 0.1) is None  # answered
    for i, holder in enumerate(silent):
        assert circuits.forward(origin, holder, 100, peers, 1.0 + i) is None
    assert (origin, honest) in circuits.circuits and counts["unrelayed_circuits_full"] == 0
    assert sum(pair[0] == origin for pair in circuits.circuits) == 3 and counts["circuits_unanswered_closed"] == 3


def test_a_relays_word_does_not_replace_the_way_a_clients_own_frames_came():
    """A peer announcing `relay` that names a client it does not reach (to have this node's frames
    for it go nowhere) is believed only until a frame of the client's, sealed by it, comes through
    another relay; then only another such frame, or that relay leaving, changes the way."""
    from p2pnode.wire.inbound.circuits import Circuits
    from p2pnode.wire.inbound.reader import RELAYED

    class NoRoutes:  # a client node's own routes, with no connection to the client
        held = ()

        def _expects(self, address):
            return False

    sent = []

    class Link:
        def send(self, client, relay, frame, tag=None):
            sent.append(relay)

    circuits = Circuits(NoRoutes(), Link(), max_known=8)
    client, honest, hostile = key(1), key(2), key(3)
    address = client_address(client)
    circuits.learn(client, honest)
    circuits.learn(client, hostile)  # a word replaces a word
    assert circuits.route(address).endswith(node_id(hostile))
    frame_of_client = SimpleNamespace(sender=client)  # an accepted frame's envelope: its sender is what counts
    circuits.seen(frame_of_client, RELAYED, honest + client)  # the client's own frame came through `honest`
    circuits.learn(client, hostile)
    circuits.send(address, b"frame")
    assert sent == [honest] and circuits.route(address).endswith(node_id(honest))
    circuits.relay_gone(honest)  # it left: a word may show the way again
    circuits.learn(client, hostile)
    assert circuits.route(address).endswith(node_id(hostile))
