"""Floods from a separate program (tools/attack.py) at real daemons: the control plane keeps
answering, every frame is counted, honest peers stay, and memory comes back."""

import time

import trio

from p2pnode.control import request

from ..daemon import full_mesh, start_chain, wait_until
from .attacker import rss_mb, run_attack, run_attack_measuring_rss


async def _status_latencies(node, until: trio.Event, into: list[float]) -> None:
    while not until.is_set():
        started = time.perf_counter()
        reply = await trio.to_thread.run_sync(request, node.config.control_socket, "status")
        assert reply["ok"]
        into.append(time.perf_counter() - started)
        await trio.sleep(0.1)


async def test_a_garbage_flood_at_full_rate_leaves_status_answering_and_every_frame_counted(tmp_path):
    # Frames dropped with a connection shed for what ZeroMQ held for it (buffers.py) are counted
    # as that, not one by one: the bound is lifted here to count every frame by its reason.
    unbounded = {"max_public_buffered_bytes": 1 << 40}
    async with trio.open_nursery() as nursery:
        a, b = await start_chain(nursery, tmp_path, 2, transport=unbounded)
        await wait_until(lambda: full_mesh([a, b]), timeout=10)
        rss_before = rss_mb()
        latencies = []
        before = sum(a.metrics.rejections.values())
        async with trio.open_nursery() as watching:
            flood_done = trio.Event()
            watching.start_soon(_status_latencies, a, flood_done, latencies)
            flood = await run_attack("--target", a.address, "--kind", "garbage", "--seconds", "5")
            peak = rss_mb()
            # Every message of the flood is refused and counted, none is lost unseen.
            await wait_until(lambda: sum(a.metrics.rejections.values()) - before >= flood["sent"], timeout=30)
            flood_done.set()
        assert sum(a.metrics.rejections.values()) - before == flood["sent"]
        # Within the strangers' budget garbage is read and refused as malformed; beyond it, it is
        # refused unread. b, an admitted peer, never needs that budget.
        assert set(a.metrics.rejections) == {"malformed", "stranger_rate_limited"}
        assert a.metrics.rejections["stranger_rate_limited"] > a.metrics.rejections["malformed"]
        assert flood["sent"] > 10_000 and len(latencies) >= 10
        assert max(latencies) < 1.0, f"status took up to {max(latencies):.2f} s during the flood"
        assert full_mesh([a, b]) and not any(key.startswith("evicted") for key in a.membership.counts)
        assert peak - rss_before < 50, f"RSS grew {peak - rss_before:.0f} MB during the flood"
        # The node gives freed heap pages back after a burst (p2pnode/memory.py).
        await wait_until(lambda: rss_mb() - rss_before < 20, timeout=10, interval=0.5)
        a.request_stop()
        b.request_stop()


async def test_strangers_flooding_signed_frames_over_many_connections_are_bounded_and_counted(tmp_path):
    """10k validly signed frames/s from 50 strangers' connections: the gate lets through only the
    strangers' rate, so the honest peer's pings keep their pace and nothing honest is refused."""
    async with trio.open_nursery() as nursery:
        # 50 connections from one address: above the default per-address cap, which is not under test here.
        a, b = await start_chain(nursery, tmp_path, 2, security={"max_connections_per_address": 64})
        await wait_until(lambda: full_mesh([a, b]) and a.membership.peers[b.identity.public_key].rtt_s, timeout=10)
        before = sum(a.metrics.messages_in.values()) + sum(a.metrics.rejections.values())
        pings = a.metrics.messages_in["PING"]
        args = ("--kind", "strangers", "--connections", "50", "--rate", "10000", "--seconds", "4")
        flood = await run_attack("--target", a.address, *args)
        counted = lambda: sum(a.metrics.messages_in.values()) + sum(a.metrics.rejections.values()) - before  # noqa: E731
        await wait_until(lambda: counted() >= flood["sent"], timeout=30)
        assert a.metrics.rejections["stranger_rate_limited"] > flood["sent"] / 2
        # b's pings (every 0.2 s here) went on arriving during the flood; b was never refused.
        assert a.metrics.messages_in["PING"] >= pings + 15
        assert full_mesh([a, b]) and not any(key.startswith("evicted") for key in a.membership.counts)
        assert not b.metrics.rejections and len(a.guard) == 1
        a.request_stop()
        b.request_stop()


async def test_a_multipart_message_never_finished_is_cut_off_before_zeromq_holds_more_than_the_bound(tmp_path):
    # libzmq keeps every part of an unfinished multipart message, with no bound of its own: one
    # connection sending 200 MB of parts would make the node hold 200 MB (p2pnode/buffers.py).
    # The attacker speaks plain ZMTP, so this node runs without CURVE (which it refuses).
    # The default bound of the public socket, where strangers connect: 16 MiB.
    async with trio.open_nursery() as nursery:
        a, b = await start_chain(nursery, tmp_path, 2, security={"curve": False})
        await wait_until(lambda: full_mesh([a, b]), timeout=10)
        rss_before = rss_mb()
        bomb, growth = await run_attack_measuring_rss(
            "--target", a.address, "--kind", "unfinished", "--bytes", str(200 << 20), "--seconds", "3"
        )
        assert bomb["reset"], f"the connection was never cut off: {bomb}"
        assert bomb["bytes"] < 100 << 20, f"{bomb['bytes'] >> 20} MB went in before the cut"
        assert a.metrics.connections["shed_buffered"] >= 1
        assert growth < 50, f"RSS grew {growth:.0f} MB during the attack"
        assert full_mesh([a, b]) and not any(key.startswith("evicted") for key in a.membership.counts)
        await wait_until(lambda: rss_mb() - rss_before < 20, timeout=10, interval=0.5)
        a.request_stop()
        b.request_stop()
