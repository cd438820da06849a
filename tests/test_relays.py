"""Relays (issue #46): reservations, circuits between client nodes, connection reversal, and the
bounds a relay holds against many clients of one subnet and a stranger with many keys."""

import json
import sys

import trio

from p2pnode.operations.doctor import diagnose
from p2pnode.operations.status import format_status

from .helpers import bootstrap_entry, full_mesh, learning_sections, start_node, wait_until

RELAY = {"relay": {"enabled": True, "reservation_ttl_s": 60}}


async def test_a_client_node_holds_places_at_two_relays_and_replaces_one_that_leaves(tmp_path):
    async with trio.open_nursery() as nursery:
        first = await start_node(nursery, tmp_path / "a", **RELAY)
        entry = [bootstrap_entry(first)]
        relays = [first] + [await start_node(nursery, tmp_path / name, entry, **RELAY) for name in "bc"]
        plain = await start_node(nursery, tmp_path / "d", entry)  # relays for nobody: never asked
        client = await start_node(nursery, tmp_path / "e", entry, node={"client_mode": True})
        await wait_until(lambda: full_mesh([*relays, plain, client]), 20)
        await wait_until(lambda: len(client.status()["relay"]["relays"]) == 2, 10)
        held = {relay["node_id"] for relay in client.status()["relay"]["relays"]}
        for relay in relays:
            holders = relay.status()["relay"]["holders"]
            assert holders == ([client.identity.node_id] if relay.identity.node_id in held else [])
            assert relay.status()["relay"]["enabled"]
        assert plain.status()["relay"]["counts"] == {}  # not asked: its HELLO names no relay
        assert all(0 < relay["expires_in_s"] <= 60 for relay in client.status()["relay"]["relays"])
        shown = format_status(client.status())  # `p2pnode status`, and `doctor`
        assert all(node_id in shown for node_id in held) and "relays: " in shown, shown
        assert any(line.startswith("relays: ") for line in diagnose(client.status())[0])
        assert "relay: holds places for" in format_status(first.status())
        # One of its relays leaves (its BYE evicts it at once): the client holds a place at the third.
        leaving = next(relay for relay in relays if relay.identity.node_id in held)
        leaving.request_stop()
        remaining = [relay for relay in relays if relay is not leaving]
        await wait_until(
            lambda: (
                {r["node_id"] for r in client.status()["relay"]["relays"]}
                == {relay.identity.node_id for relay in remaining}
            ),
            15,
        )
        counts = client.status()["relay"]["counts"]
        assert counts["reservation_held"] == 3 and counts["relay_lost"] == 1, counts
        assert not any(client.metrics.rejections.values()) and not any(r.metrics.rejections.values() for r in remaining)
        nursery.cancel_scope.cancel()


async def test_two_client_nodes_become_each_others_peers_through_a_relay(tmp_path):
    """Neither can be dialled: each holds a place at the relay, which names both in its PEERS;
    each reaches the other through it, sealed, and they admit each other."""
    security = {"curve": True}
    async with trio.open_nursery() as nursery:
        relay = await start_node(nursery, tmp_path / "r", security=security, **RELAY)
        entry = [bootstrap_entry(relay)]
        client = {"node": {"client_mode": True}}
        a = await start_node(nursery, tmp_path / "a", entry, security=security, **client)
        b = await start_node(nursery, tmp_path / "b", entry, security=security, **client)
        await wait_until(lambda: full_mesh([relay, a, b]), 30)
        counts = relay.status()["relay"]["counts"]
        assert counts["relayed_frames"] > 0 and counts["circuits_opened"] >= 2, counts
        assert a.membership.peers[b.identity.public_key].address == b.address
        assert not any(a.metrics.rejections.values()) and not any(b.metrics.rejections.values())
        # status and doctor say how each peer is reached
        routes = {peer["node_id"]: peer["route"] for peer in a.status()["peers"]}
        assert routes == {relay.identity.node_id: "dialled", b.identity.node_id: f"relay:{relay.identity.node_id}"}
        assert f"through relay {relay.identity.node_id}" in format_status(a.status())
        assert any(line.startswith(f"peer {b.identity.node_id}: through relay") for line in diagnose(a.status())[0])
        assert relay.status()["peers"][0]["route"] == "connection"  # each client dialled the relay
        nursery.cancel_scope.cancel()


async def test_two_client_nodes_learn_together_through_a_relay_and_every_payload_arrives(tmp_path):
    """MAPL-Dual's MODEL and PROTOTYPES frames between two client nodes go through the relay,
    sealed; the relay learns too, over its direct connections to them. Nothing goes missing."""
    rounds, security = 4, {"curve": True}
    sections = [learning_sections(i, 3, rounds=rounds, name="mapl-dual", round_deadline_s=5.0) for i in range(3)]
    async with trio.open_nursery() as nursery:
        relay = await start_node(nursery, tmp_path / "r", security=security, **RELAY, **sections[0])
        entry = [bootstrap_entry(relay)]
        clients = [
            await start_node(
                nursery, tmp_path / name, entry, security=security, **{**sections[i], "node": {"client_mode": True}}
            )
            for i, name in ((1, "a"), (2, "b"))
        ]
        nodes = [relay, *clients]
        await wait_until(lambda: all(node.driver and node.driver.phase == "done" for node in nodes), 120)
        for node in nodes:
            history = node.status()["learning"]["history"]
            assert len(history) == rounds
            assert all(e["expected"] == e["arrived"] == 2 for e in history[:2]), history  # warm-up: all to all
            assert not any(e["missing"] for e in history), history
        counts = relay.status()["relay"]["counts"]
        models = [c.metrics.messages_in["MODEL"] for c in clients]
        assert counts["relayed_bytes"] > 2 * 20_000 and all(m >= 2 * 2 for m in models), (counts, models)
        # what the hop costs a sender: its RELAY bytes against the tensors inside its learning frames
        sent = [client.status()["relay"]["counts"] for client in clients]
        assert all(c["relay_out_learning_bytes"] <= 1.1 * c["relay_out_learning_payload_bytes"] for c in sent), sent
        nursery.cancel_scope.cancel()


async def test_a_public_node_that_hears_of_a_client_through_a_relay_asks_it_to_dial_and_then_talks_directly(tmp_path):
    """Connection reversal: the relay names its client to the public node, which asks the relay
    (REVERSE, with its own HELLO) to have the client dial it; once the client has, their frames
    go over that connection, not through the relay."""
    async with trio.open_nursery() as nursery:
        relay = await start_node(nursery, tmp_path / "r", **RELAY)
        client = await start_node(nursery, tmp_path / "c", [bootstrap_entry(relay)], node={"client_mode": True})
        await wait_until(lambda: relay.status()["relay"]["holders"] == [client.identity.node_id], 10)
        public = await start_node(nursery, tmp_path / "p", [bootstrap_entry(relay)])
        await wait_until(lambda: full_mesh([relay, client, public]), 20)
        address = client.address
        await wait_until(lambda: public.transport.routes.base._expects(address), 10)
        assert not public.transport.routes.through_relay(address)  # direct now
        assert {peer["route"] for peer in public.status()["peers"]} == {"dialled", "connection"}
        assert public.status()["relay"]["counts"].get("reversals_asked", 0) >= 1
        assert relay.status()["relay"]["counts"].get("reversals", 0) >= 1
        out = public.status()["relay"]["counts"].get("relay_out_frames", 0)
        await trio.sleep(1.0)  # pings go on, directly
        assert public.status()["relay"]["counts"].get("relay_out_frames", 0) == out
        nursery.cancel_scope.cancel()


async def test_many_keys_from_one_subnet_get_that_subnets_places_at_a_live_relay_and_no_more(tmp_path):
    """Five client nodes from one /24 (loopback, not exempt here) ask one relay that gives a subnet
    three places: three hold one, two are refused (`subnet`) and keep asking; no holder is pushed
    out for them, and when a holder leaves, one of them takes its place."""
    relay_sections = {
        "relay": {"enabled": True, "max_reservations_per_subnet": 3},
        "discovery": {"subnet_limits_exempt": []},
    }
    async with trio.open_nursery() as nursery:
        relay = await start_node(nursery, tmp_path / "r", **relay_sections)
        client = {"node": {"client_mode": True}, "relay": {"retry_s": 1}}
        clients = [await start_node(nursery, tmp_path / f"c{i}", [bootstrap_entry(relay)], **client) for i in range(5)]

        def holders() -> set[str]:
            return set(relay.status()["relay"]["holders"])

        await wait_until(lambda: len(holders()) == 3, 15)
        refused = [c for c in clients if c.identity.node_id not in holders()]
        await wait_until(
            lambda: all(c.status()["relay"]["counts"].get("reservation_refused_subnet") for c in refused), 10
        )
        first = holders()
        await trio.sleep(2.0)  # they keep asking: the holders keep their places
        assert holders() == first and relay.status()["relay"]["counts"]["reservation_refused_subnet"] >= 2
        leaving = next(c for c in clients if c.identity.node_id in first)
        leaving.request_stop()
        await wait_until(lambda: len(holders()) == 3 and leaving.identity.node_id not in holders(), 15)
        assert holders() - first <= {c.identity.node_id for c in refused}
        nursery.cancel_scope.cancel()


async def test_a_stranger_whose_forty_keys_each_complete_admission_gets_its_subnets_places_less_the_held_ones(tmp_path):
    """tools/sybil.py, a program of its own: forty keys from one /24 each complete a client's
    admission over CURVE, dial the relay's peers' socket and ask for a place. The relay admits the
    subnet's `max_peers_per_subnet` less the honest client, gives the subnet's three places less
    the one held, and the honest holder keeps its place."""
    curve = {"curve": True}
    relay_sections = {
        "relay": {"enabled": True, "max_reservations_per_subnet": 3},
        "discovery": {"subnet_limits_exempt": [], "max_peers_per_subnet": 8},
    }
    async with trio.open_nursery() as nursery:
        relay = await start_node(nursery, tmp_path / "r", security=curve, **relay_sections)
        honest = await start_node(
            nursery, tmp_path / "c", [bootstrap_entry(relay)], security=curve, node={"client_mode": True}
        )
        await wait_until(lambda: relay.status()["relay"]["holders"] == [honest.identity.node_id], 15)
        target = ["--target", relay.address, "--target-key", relay.identity.public_key.hex(), "--network", "test"]
        command = [sys.executable, "-m", "tools.sybil", *target, "--keys", "40", "--rate", "20", "--seconds", "6"]
        stranger = json.loads((await trio.run_process(command, capture_stdout=True)).stdout)
        holders = relay.status()["relay"]["holders"]
        nursery.cancel_scope.cancel()
    assert stranger["tried"] == 40 and 0 < stranger["answered"] <= 7, stranger  # admitted: the /24's 8 less one
    assert stranger["granted"] == stranger["held_at_end"] == 2 and stranger["pongs"] > 0, stranger
    assert stranger["refused_subnet"] == stranger["answered"] - 2, stranger
    assert len(holders) == 3 and honest.identity.node_id in holders
