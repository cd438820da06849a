"""A stranger speaking the wire protocol from outside: raw DEALER sockets with its own keys, and
measurements of what an attack costs the daemons under test (RTT, RSS, CPU, refusals)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import trio
import zmq

from p2pnode.memory import resident_bytes
from p2pnode.wire.zmqtrio import send_waiting
from protocol import PROTOCOL_VERSION, Encoder, Hello, Identity
from protocol.curve import curve_public_from_ed25519

NETWORK = "test"  # tests/helpers.py's network id


class Attacker:
    """A raw DEALER aimed at a node's inbound socket, sending whatever it likes. `source` binds
    the connection's local address (a 127.x.y.z loopback address stands for another host).
    `curve` = (own identity, the target's Ed25519 key): connect as a CURVE client with the
    transport key of that identity, as a node would."""

    def __init__(
        self,
        address: str,
        source: str | None = None,
        context: zmq.Context | None = None,
        curve: tuple[Identity, bytes] | None = None,
    ) -> None:
        self.own_context = context is None
        self.context = context or zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 100_000)
        if curve is not None:
            identity, target = curve
            secret, public = identity.curve_keypair()
            self.socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
            self.socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
            self.socket.setsockopt(zmq.CURVE_SERVERKEY, curve_public_from_ed25519(target))
        self.socket.connect(f"tcp://{source}:0;{address.removeprefix('tcp://')}" if source else address)

    async def send(self, *parts: bytes) -> None:
        if len(parts) == 1:
            await send_waiting(self.socket, parts[0])
        else:
            self.socket.send_multipart(parts)

    def close(self) -> None:
        self.socket.close(linger=0)
        if self.own_context:
            self.context.term()


class Stranger:
    """A throwaway key with an encoder and its own sequence numbers."""

    def __init__(self, identity: Identity | None = None) -> None:
        self.identity = identity or Identity.generate()
        self.encoder = Encoder(self.identity, NETWORK)
        self.seq = 0

    @property
    def key(self) -> bytes:
        return self.identity.public_key

    def frame(self, body, timestamp_us: int | None = None) -> bytes:
        self.seq += 1
        when = time.time_ns() // 1000 if timestamp_us is None else timestamp_us
        return self.encoder.encode(body, seq=self.seq, timestamp_us=when, round=0)

    def hello(self, address: str, timestamp_us: int | None = None) -> bytes:
        body = Hello(address=address, capabilities=(), dataset_size=0, protocol_versions=(PROTOCOL_VERSION,))
        return self.frame(body, timestamp_us)


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process now, in MB (this one by default)."""
    return resident_bytes(pid or "self") / 1e6


async def run_attack(*args: str) -> dict:
    """tools/attack.py in a process of its own (its buffers are not counted as the node's)."""
    result = await trio.run_process([sys.executable, "-m", "tools.attack", *args], capture_stdout=True)
    return json.loads(result.stdout.decode().strip().splitlines()[-1])


def node_rss_mb(node) -> float:
    """A node run in this process: this process's resident memory and its ingress processes'
    (where libzmq holds what arrives), in MB."""
    return rss_mb() + ingress_rss_mb(node)


def ingress_rss_mb(node) -> float:
    """The resident memory of a node's ingress processes, in MB."""
    return sum(rss_mb(ingress.pid) for ingress in node.ingress.values() if ingress.pid)


async def run_attack_measuring_rss(
    node, *args: str, copies: int = 1, measure: Callable[[Any], float] = node_rss_mb
) -> tuple[dict | list[dict], float]:
    """`run_attack` (`copies` of it at once: then a list of their results), and how far
    `measure(node)` (default: `node_rss_mb`) rose above its level at the start, at its highest
    while the attack ran (sampled every 20 ms), in MB."""
    before, peaks = measure(node), []
    done = trio.Event()
    results: list[dict] = []

    async def watch() -> None:
        while not done.is_set():
            peaks.append(measure(node))
            await trio.sleep(0.02)

    async def attack() -> None:
        results.append(await run_attack(*args))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        try:
            async with trio.open_nursery() as attacks:
                for _ in range(copies):
                    attacks.start_soon(attack)
        finally:
            done.set()
    return (results[0] if copies == 1 else results), max(peaks, default=before) - before
