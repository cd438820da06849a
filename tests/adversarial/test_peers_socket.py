"""Two inbound sockets (p2pnode/wire/transport.py): strangers meet a node on its public socket, which
takes small frames only; frames larger than that travel between admitted peers on the peers'
socket, which, with CURVE, only admitted peers (and keys being verified) may connect to."""

import numpy as np
import pytest
import trio

from p2pnode.wire.zap import PEERS, PEERS_DOMAIN, PUBLIC
from protocol import Identity, Model

from ..helpers import bootstrap_entry, full_mesh, start_chain, start_node, wait_until
from .attacker import Attacker, Stranger, run_attack_measuring_rss

CURVE = {"curve": True}
SMALL_PUBLIC = {"max_public_frame_bytes": 16 << 10}


async def test_frames_over_the_public_bound_travel_on_the_peers_socket(tmp_path):
    async with trio.open_nursery() as nursery:
        a, b = await start_chain(nursery, tmp_path, 2, security=CURVE, limits=SMALL_PUBLIC)
        await wait_until(lambda: full_mesh([a, b]), timeout=10)
        peers_port = int(b.ingress[PEERS].endpoint.rsplit(":", 1)[1])
        assert a.membership.peers[b.identity.public_key].peer_port == b.peer_port == peers_port
        big = Model(kind="params", tensors={"w": np.ones(20_000, np.float32)})  # ~80 KB
        # The connection to b's peers' socket opens once b is admitted; give it a moment.
        await wait_until(lambda: a.transport.outbound[b.address].peers is not None, timeout=5)
        sent = 0

        async def delivered() -> bool:
            return b.metrics.rejections.get("unknown_peer", 0) == 0

        for _ in range(50):  # the first ones may find the connection still coming up
            sent += a.send((b.address,), big) or 0
            await trio.sleep(0.05)
            if b.metrics.messages_in["MODEL"] + b.metrics.rejections.get("not_learning", 0) >= 1:
                break
        assert sent >= 1
        # b does not learn, so it refuses the MODEL as `not_learning`: after its signature
        # verified, having arrived on the peers' socket (the public one would have cut it off).
        await wait_until(lambda: b.metrics.rejections.get("not_learning", 0) >= 1, timeout=5)
        assert b.metrics.connections["zap_allowed"] >= 2  # one connection on each socket
        for node in (a, b):
            node.request_stop()


async def test_admitted_peers_send_everything_but_hello_on_the_peers_socket(tmp_path):
    """So that the public socket carries strangers' frames only, and can be read no faster
    than their budget (p2pnode/wire/inbound/reader.py) without delaying a peer."""
    async with trio.open_nursery() as nursery:
        a, b = await start_chain(nursery, tmp_path, 2, security=CURVE)
        await wait_until(lambda: full_mesh([a, b]), timeout=10)
        await wait_until(lambda: a.ingress[PEERS].messages_read > 0, timeout=5)
        public, peers = a.ingress[PUBLIC].messages_read, a.ingress[PEERS].messages_read
        hellos, pings = a.metrics.messages_in["HELLO"], a.metrics.messages_in["PING"]
        await trio.sleep(2.0)  # b pings every 0.2 s here
        assert a.metrics.messages_in["PING"] - pings >= 5
        assert a.ingress[PEERS].messages_read - peers >= a.metrics.messages_in["PING"] - pings
        assert a.ingress[PUBLIC].messages_read - public == a.metrics.messages_in["HELLO"] - hellos
        for node in (a, b):
            node.request_stop()


async def test_a_stranger_cannot_connect_to_the_peers_socket_with_curve(tmp_path):
    async with trio.open_nursery() as nursery:
        (a,) = await start_chain(nursery, tmp_path, 1, security=CURVE)
        mallory = Stranger()
        attacker = Attacker(a.ingress[PEERS].endpoint, curve=(mallory.identity, a.identity.public_key))
        try:
            await attacker.send(mallory.hello("tcp://127.0.0.1:9"))  # queued until a handshake that fails
            await wait_until(lambda: a.metrics.connections["zap_denied_not_peer"] >= 1, timeout=5)
        finally:
            attacker.close()
        # Denied in the handshake: not one of its frames was read or judged.
        assert a.ingress[PEERS].messages_read == 0 and a.metrics.messages_in["HELLO"] == 0
        assert dict(a.metrics.rejections) == {} and mallory.key not in {
            link.key for link in a.gate.stranger_links.values()
        }
        a.request_stop()
    assert PEERS_DOMAIN == b"p2pnode-peers"


async def test_without_curve_a_strangers_frames_on_the_peers_socket_are_refused_unverified(tmp_path):
    async with trio.open_nursery() as nursery:
        (a,) = await start_chain(nursery, tmp_path, 1, security={"curve": False})
        mallory = Stranger()
        attacker = Attacker(a.ingress[PEERS].endpoint)
        try:
            await attacker.send(mallory.hello("tcp://127.0.0.1:9"))
            await wait_until(lambda: a.metrics.rejections.get("unknown_peer", 0) >= 1, timeout=5)
        finally:
            attacker.close()
        assert mallory.key not in {link.key for link in a.gate.stranger_links.values()}
        a.request_stop()


async def test_large_frames_from_a_stranger_are_cut_off_by_the_public_bound_before_they_are_held(tmp_path):
    # 10 MiB frames at the public socket: ZeroMQ drops the connection at the frame's header
    # (ZMQ_MAXMSGSIZE), long before 10 MiB arrive; the attacker reconnects and tries again.
    async with trio.open_nursery() as nursery:
        a, b = await start_chain(nursery, tmp_path, 2, security={"curve": False})
        await wait_until(lambda: full_mesh([a, b]), timeout=10)
        flood, growth = await run_attack_measuring_rss(
            a, "--target", a.address, "--kind", "garbage", "--sizes", str(10 << 20), "--seconds", "3"
        )
        assert flood["sent"] >= 10
        assert a.metrics.connections["disconnected"] >= 1  # cut off, and counted
        assert sum(a.metrics.rejections.values()) == 0  # nothing of it was ever read
        assert growth < 50, f"RSS grew {growth:.0f} MB"
        assert full_mesh([a, b])
        for node in (a, b):
            node.request_stop()


async def test_a_frame_of_exactly_the_public_bound_gets_through_curve(tmp_path):
    # CURVE wraps each frame in a box: the socket's bound leaves room for it (transport.py).
    async with trio.open_nursery() as nursery:
        (a,) = await start_chain(nursery, tmp_path, 1, security=CURVE, limits=SMALL_PUBLIC)
        attacker = Attacker(a.address, curve=(Identity.generate(), a.identity.public_key))
        try:
            await attacker.send(bytes(SMALL_PUBLIC["max_public_frame_bytes"]))
            await wait_until(lambda: sum(a.metrics.rejections.values()) >= 1, timeout=5)
        finally:
            attacker.close()
        assert a.metrics.connections["disconnected"] == 0  # read and refused, not cut off
        a.request_stop()


@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plaintext"])
async def test_a_peer_that_dropped_us_unnoticed_answers_its_challenge_on_the_peers_socket(tmp_path, curve):
    """`a` drops `b` (a timeout) while `b` still takes `a` for a peer, then challenges `b` again
    (as when two nodes dial each other at once). `b` answers on `a`'s peers' socket, from a key
    `a` has not admitted (yet): that PONG must be judged as a handshake frame there, not parked
    until an admission only it can bring (`b` would notice nothing for a minute)."""
    patient = {"peer_timeout_s": 60.0}
    security = {"curve": curve}
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, tmp_path / "a", security=security)
        b = await start_node(nursery, tmp_path / "b", [bootstrap_entry(a)], security=security, discovery=patient)
        await wait_until(lambda: full_mesh([a, b]) and a.ingress[PEERS].messages_read > 0, timeout=10)
        key = b.identity.public_key
        now = trio.current_time()
        evicted = a.membership._evict(a.membership.peers[key], now, "timeout")  # silent for a while, no BYE
        a.membership_actions.carry_out(evicted)
        assert key not in a.membership.peers and a.identity.public_key in b.membership.peers
        a.membership._dial_later(b.address, permanent=False, key=key, informant="bootstrap", now=now)
        a._wake_maintain.set()
        took = await wait_until(lambda: key in a.membership.peers, timeout=10)
        assert took < 5 and a.identity.public_key in b.membership.peers
        for node in (a, b):
            node.request_stop()
