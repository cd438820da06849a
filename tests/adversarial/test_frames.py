"""Hostile frames against a real daemon: each is refused before it costs more than it must, and
counted with its reason, while the honest peer carries on."""

import trio

from protocol import Bye, Encoder, Peers, Ping, Relay, Reserve, seal_raw

from ..helpers import full_mesh, start_chain, wait_until
from .attacker import NETWORK, Attacker, Stranger

UNREACHABLE = "tcp://127.0.0.1:9"  # the discard port: nothing answers a challenge there


async def test_hostile_frames_are_refused_and_counted_while_honest_peers_carry_on(tmp_path):
    async with trio.open_nursery() as nursery:
        a, b = await start_chain(nursery, tmp_path, 2, transport={"stranger_rate": 200.0, "stranger_burst": 100})
        await wait_until(lambda: full_mesh([a, b]), timeout=10)
        pings_before = a.metrics.messages_in["PING"]
        mallory = Stranger()
        attacker = Attacker(a.address)
        try:
            forged = bytearray(mallory.frame(Ping(nonce=1)))
            forged[-1] ^= 1
            now = a.clock_us()
            seq = 100
            frames = [
                mallory.frame(Bye(reason="x")),  # handshake_first: a stranger's first frame must be HELLO
                mallory.hello(UNREACHABLE),  # accepted: it binds this connection to mallory's key
                mallory.frame(Peers(hellos=())),  # handshake_first: a stranger sends handshake frames only
                mallory.frame(Relay(target=b.identity.public_key, sealed=b"x" * 64)),  # handshake_first too
                bytes(forged),  # bad_signature
                seal_raw(mallory.identity, [1, NETWORK, "PING", mallory.key, seq, now, 0, {"nonce": 1, "x": 2}]),
                b"\x00garbage",  # malformed
                mallory.frame(Ping(nonce=1), timestamp_us=now - 3_600_000_000),  # stale
                Encoder(mallory.identity, "other").encode(Ping(nonce=1), seq=7, timestamp_us=now, round=0),
                Stranger().frame(Ping(nonce=2)),  # wrong_sender: another key on mallory's connection
                b.membership.own_hello,  # wrong_sender too (b's own HELLO, captured)
            ]
            for frame in frames:
                await attacker.send(frame)
            await attacker.send(b"id", b"two parts")  # multipart: malformed
            # A frame over the per-type bound (PING's 1 KiB) with a valid signature: too_large.
            await attacker.send(
                seal_raw(mallory.identity, [1, NETWORK, "PING", mallory.key, 8, now, 0, {"nonce": 1, "p": b"x" * 2000}])
            )
            # b's own frame, captured and replayed on a fresh connection that claims b: replay.
            replayer = Attacker(a.address)
            await replayer.send(b.membership.own_hello)
            expected = {
                "handshake_first": 3,
                "bad_signature": 1,
                "malformed": 3,
                "stale": 1,
                "wrong_network": 1,
                "wrong_sender": 2,
                "too_large": 1,
                "replay": 1,
            }
            await wait_until(lambda: sum(a.metrics.rejections[k] for k in expected) >= sum(expected.values()), 5)
            assert {k: a.metrics.rejections[k] for k in expected} == expected
            assert a.metrics.messages_in["HELLO"] >= 1
            # A flood of handshake frames over the strangers' rate is cut; the node stays responsive.
            for _ in range(500):
                await attacker.send(mallory.frame(Ping(nonce=seq)))
            await wait_until(lambda: a.metrics.rejections["stranger_rate_limited"] > 0, timeout=5)
            # The honest peer kept exchanging the whole time, and none of its frames was refused.
            await wait_until(lambda: a.metrics.messages_in["PING"] > pings_before + 5, timeout=5)
            assert full_mesh([a, b]) and a.membership.counts["evicted_timeout"] == 0
            assert set(b.metrics.rejections) <= set()
            replayer.close()
        finally:
            attacker.close()
        a.request_stop()
        b.request_stop()


async def test_relaying_frames_from_a_peer_are_counted_and_go_no_further(tmp_path):
    """Frames through relays are not built yet (docs/daemon.md, "Relays"): an admitted peer's RELAY
    is refused as `not_relay`, never handed to the round driver; a RESERVE to a node that relays
    for nobody gets RESERVED `not_relay`, which the asker, having asked nothing, counts too."""
    async with trio.open_nursery() as nursery:
        a, b = await start_chain(nursery, tmp_path, 2)
        await wait_until(lambda: full_mesh([a, b]), timeout=10)
        for _ in range(40):  # the first may find the connection still coming up
            b.send((a.address,), Reserve(ttl_s=60))
            b.send((a.address,), Relay(target=b.identity.public_key, sealed=b"x" * 64))
            await trio.sleep(0.05)
            if a.metrics.rejections.get("not_relay", 0) >= 1 and b.metrics.rejections.get("reserved_unexpected"):
                break
        await wait_until(lambda: a.metrics.rejections.get("not_relay", 0) >= 1, timeout=5)
        await wait_until(lambda: b.metrics.rejections.get("reserved_unexpected", 0) >= 1, timeout=5)
        assert a.status()["relay"]["counts"]["reservation_refused_not_relay"] >= 1
        assert full_mesh([a, b]) and set(a.metrics.rejections) == {"not_relay"}
        assert set(b.metrics.rejections) == {"reserved_unexpected"} and a.status()["relay"]["holders"] == []
        a.request_stop()
        b.request_stop()
