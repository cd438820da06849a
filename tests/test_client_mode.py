"""Client mode (issue #46): a node that binds nothing and accepts no connection joins through the
connections it dials. Its bootstrap admits it over that connection, peer exchange names the
other public nodes, which it dials itself; every node reaches it over what it dialled."""

import pytest
import trio

from p2pnode.operations.doctor import diagnose
from protocol.messages import client_address

from .helpers import bootstrap_entry, full_mesh, learning_sections, start_node, wait_until


@pytest.mark.parametrize("curve", [False, True], ids=["plaintext", "curve"])
async def test_a_client_node_joins_through_the_connections_it_dials_and_is_reached_over_them(tmp_path, curve):
    security = {"curve": curve}
    async with trio.open_nursery() as nursery:
        first = await start_node(nursery, tmp_path / "a", security=security)
        second = await start_node(nursery, tmp_path / "b", [bootstrap_entry(first)], security=security)
        client = await start_node(
            nursery, tmp_path / "c", [bootstrap_entry(first)], security=security, node={"client_mode": True}
        )
        assert client.address == client_address(client.identity.public_key)
        nodes = [first, second, client]
        await wait_until(lambda: full_mesh(nodes), 20)
        status = client.status()
        assert status["client_mode"] and status["listen"] is None and status["peers_listen"] is None
        assert status["reachability"]["state"] == "client"  # not "public", whoever reached it
        lines, problems = diagnose(status)  # `p2pnode doctor`
        assert problems == 0 and "client mode, reached over the connections it dials" in lines[0], lines
        for node in (first, second):  # nobody dialled it: it is reached over the connections it dialled
            peer = node.membership.peers[client.identity.public_key]
            assert peer.address == client.address
            assert set(node.transport.routes.base.routes[client.address]) >= {"public"}  # a peer's from its admission
            assert not peer.relayable  # nobody else could dial it: peer exchange never names it
        nursery.cancel_scope.cancel()


async def test_a_client_node_learns_with_the_others_and_its_models_travel_both_ways(tmp_path):
    """MAPL-Dual's MODEL frames (a small model, beyond the public socket's bound) go over the
    client's connections to the peers' sockets, which with CURVE take it only once admitted
    (refused before: the client ingress dials again), both ways: a frame for a connection not
    up yet waits for it (`connect_wait_s`). Every payload of every round arrives."""
    rounds, security = 4, {"curve": True}
    sections = [learning_sections(i, 3, rounds=rounds, name="mapl-dual", round_deadline_s=5.0) for i in range(3)]
    async with trio.open_nursery() as nursery:
        first = await start_node(nursery, tmp_path / "a", security=security, **sections[0])
        entry = [bootstrap_entry(first)]
        second = await start_node(nursery, tmp_path / "b", entry, security=security, **sections[1])
        client_sections = {**sections[2], "node": {"client_mode": True}}
        client = await start_node(nursery, tmp_path / "c", entry, security=security, **client_sections)
        nodes = [first, second, client]
        await wait_until(lambda: all(node.driver and node.driver.phase == "done" for node in nodes), 120)
        for node in nodes:
            history = node.status()["learning"]["history"]
            assert len(history) == rounds
            rounds_seen = [(e["round"], e["expected"], e["arrived"], e["missing"]) for e in history]
            # Warm-up (2 rounds): all to all; then the learned graph's neighbours. Nothing missing.
            assert all(e["expected"] == e["arrived"] == 2 for e in history[:2]), rounds_seen
            assert not any(e["missing"] for e in history), rounds_seen
        nursery.cancel_scope.cancel()
