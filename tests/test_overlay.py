"""Bounded views (`[discovery].active_view`, `max_peers`, `passive_view`) on the simulated
network of tests/simnet.py: many nodes, real signed frames, simulated time."""

from collections import Counter

import networkx as nx
import pytest

from p2pnode.discovery.actions import Send
from protocol import Ping

from .simnet import SimNet, SimNode, address, overlay


def join(net: SimNet, count: int, *, chain: bool = False, **settings) -> list[SimNode]:
    """`count` nodes, each joining through node 0 (as a testnet does) or, with `chain`, through
    the node before it."""
    return [
        net.add(i, [] if i == 0 else [address(i - 1 if chain else 0)], address=address(i), **settings)
        for i in range(count)
    ]


def at_target(nodes: list[SimNode], low: int, high: int) -> bool:
    return all(low <= len(node.membership.peers) <= high for node in nodes if node.up)


def changes(nodes: list[SimNode]) -> int:
    return sum(n.membership.counts["admitted"] + n.membership.counts["evicted_timeout"] for n in nodes)


def test_a_hundred_nodes_joining_in_a_chain_reach_their_view_and_form_one_overlay():
    net = SimNet()
    nodes = join(net, 100, chain=True, active_view=8, max_peers=10)
    net.run_until(lambda: at_target(nodes, 8, 10), timeout=30)
    graph = overlay(nodes)
    assert nx.is_connected(graph)
    # Every peering is mutual, and the overlay holds still once every view is at its target.
    assert all(node.key in graph.adj[key] for node in nodes for key in node.membership.peers)
    before = changes(nodes)
    net.run(3)
    assert changes(nodes) == before and at_target(nodes, 8, 10)


def test_newcomers_joining_through_one_node_are_sent_on_and_spread_out():
    """Node 0 keeps its view bounded: past its target it redirects each newcomer with a sample
    of its peers and of other newcomers, so nobody is stuck behind the common bootstrap and the
    overlay does not grow around it."""
    net = SimNet()
    nodes = join(net, 40, active_view=4, max_peers=6)
    net.run_until(lambda: at_target(nodes, 4, 6), timeout=30)
    graph = overlay(nodes)
    assert nx.is_connected(graph) and nx.diameter(graph) <= 6
    assert nodes[0].membership.counts["redirected"] > 0
    assert max(len(node.membership.peers) for node in nodes) <= 6


def test_small_networks_are_still_a_full_mesh():
    """With N ≤ active_view + 1 every node seeks everyone: today's full mesh, no redirect."""
    net = SimNet()
    nodes = join(net, 9, active_view=8, max_peers=10)
    net.run_until(net.full_mesh, timeout=5)
    assert sum(node.membership.counts["redirected"] for node in nodes) == 0


def pings_per_node(net: SimNet, nodes: list[SimNode], seconds: float) -> float:
    """PING frames a node sends per ping interval (liveness: one to each ready peer)."""
    frames: Counter[int] = Counter()
    rounds: Counter[int] = Counter()
    execute = net.execute

    def counting(node, actions):
        for action in actions:
            if isinstance(action, Send) and isinstance(action.body, Ping):
                frames[node.index] += len(action.addresses)
                rounds[node.index] += 1
        execute(node, actions)

    net.execute = counting
    net.run(seconds)
    net.execute = execute
    return sum(frames.values()) / sum(rounds.values())


def test_liveness_per_node_depends_on_the_view_not_on_the_network():
    rates = []
    for count in (15, 45):
        net = SimNet()
        nodes = join(net, count, active_view=4, max_peers=5)
        net.run_until(lambda nodes=nodes: at_target(nodes, 4, 5), timeout=30)
        rates.append(pings_per_node(net, nodes, 5))
    assert all(4 <= rate <= 5 for rate in rates), rates
    assert abs(rates[1] - rates[0]) / rates[0] < 0.2, rates


def test_a_failed_peer_is_replaced_from_the_passive_view():
    net = SimNet()
    nodes = join(net, 20, active_view=4, max_peers=6, ping_interval_s=0.5, peer_timeout_s=1.5)
    net.run_until(lambda: at_target(nodes, 4, 6), timeout=30)
    dialled = sum(node.membership.counts["passive_dialled"] for node in nodes)
    for victim in nodes[1:5]:
        net.kill(victim)
    net.run(2)  # their peers time them out
    assert any(len(node.membership.peers) < 4 for node in nodes if node.up)
    net.run_until(lambda: at_target(nodes, 4, 6), timeout=15)
    assert sum(node.membership.counts["passive_dialled"] for node in nodes) > dialled
    assert nx.is_connected(overlay(nodes))


def test_a_full_node_redirects_a_newcomer_and_keeps_every_peer():
    net = SimNet()
    hub = net.add(0, address=address(0), active_view=3, max_peers=3)
    friends = [net.add(i, [address(0)], address=address(i)) for i in (1, 2, 3)]
    net.run_until(lambda: len(hub.membership.peers) == 3 and all(len(f.membership.peers) == 3 for f in friends), 5)
    newcomer = net.add(9, [address(0)], address=address(9))
    net.run_until(lambda: {f.key for f in friends} <= set(newcomer.membership.peers), timeout=5)
    assert set(hub.membership.peers) == {f.key for f in friends}  # nobody pushed out
    assert hub.membership.counts["redirected"] >= 1
    assert hub.key in newcomer.membership.passive  # full for now, not forgotten


@pytest.mark.parametrize("passive_view", [1, 5])
def test_the_passive_view_is_bounded(passive_view):
    net = SimNet()
    nodes = join(net, 20, active_view=3, max_peers=4, passive_view=passive_view)
    for _ in range(10):  # joining, redirecting, exchanging peers
        net.run(1)
        assert all(len(node.membership.passive) <= passive_view for node in nodes)
    assert any(len(node.membership.passive) == passive_view for node in nodes)


def test_a_crowded_testnet_chooses_the_settings_that_hold_unless_told_otherwise():
    """Issue #28: past CROWDED_PER_CORE daemons per core the testnet's daemons get the bounded
    view, slow liveness and memory poll the 100-daemon benchmark held with; a setting given wins."""
    from testnet.launch.discovery import CROWDED, CROWDED_PER_CORE, crowded_settings

    few = CROWDED_PER_CORE * 2
    assert crowded_settings(few, {"discovery": {"active_view": 4}}, cores=2) == ({"discovery": {"active_view": 4}}, {})
    settings, chosen = crowded_settings(100, {"discovery": {"ping_interval_s": 2.0}, "log": {"level": "debug"}}, 2)
    assert settings["discovery"] == {**CROWDED["discovery"], "ping_interval_s": 2.0}
    assert settings["transport"] == CROWDED["transport"] and settings["log"] == {"level": "debug"}
    assert "ping_interval_s" not in chosen["discovery"] and chosen["discovery"]["active_view"] == 8
