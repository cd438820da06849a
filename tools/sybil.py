"""A stranger with many keys at a relay (issue #46), as a program of its own: each key completes
admission as a client node would and asks the relay for a place. It prints one JSON line.

    python -m tools.sybil --target tcp://198.51.100.10:7000 --target-key HEX [--keys 1000]
        [--rate 50] [--seconds 60] [--network testnet] [--give-up-s 10]

Each key, `--rate` new ones a second: a DEALER over CURVE with that key's own transport key, a
client node's HELLO (the `client` capability and address, as `[node].client_mode` sends), a PONG
to the relay's challenge, then RESERVE until the relay answers RESERVED; then, admitted, it dials
the relay's peers' socket (HELLO's `peer_port`), where an admitted peer's frames go, and answers
the relay's PINGs there, so it stays a peer and holds what it was granted for the whole run. A key the
relay has not challenged or answered within `--give-up-s` closes its connection, making room for
the next (a relay bounds connections per address). It counts keys tried, challenged, answered
(admitted: a relay answers RESERVE from peers only), places granted and refused by reason, BYEs
by reason, and the places it still holds at the end (granted, and no BYE since).

A test tool: targets on loopback or in the documentation ranges the NAT testbed uses only.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import zmq

from protocol import (
    PROTOCOL_VERSION,
    Decoder,
    Encoder,
    Hello,
    Identity,
    MessageType,
    Ping,
    Pong,
    ProtocolError,
    Reserve,
    SequenceCounter,
)
from protocol.curve import curve_public_from_ed25519
from protocol.messages import CLIENT_CAPABILITY, client_address

__all__ = ["run"]

RESEND_S = 2.0  # a HELLO or RESERVE with no answer yet goes again (a relay may drop one it has no budget for)
TTL_S = 600  # the place each key asks for
TARGETS = tuple(ipaddress.ip_network(net) for net in ("127.0.0.0/8", "198.51.100.0/24", "203.0.113.0/24"))


def _target(value: str) -> str:
    host = value.removeprefix("tcp://").rsplit(":", 1)[0]
    try:
        allowed = any(ipaddress.ip_address(host) in net for net in TARGETS)
    except ValueError:
        allowed = False
    if not allowed:
        raise argparse.ArgumentTypeError(f"{value}: a test tool aims at loopback or TEST-NET-2/3 only")
    return value


def _now_us() -> int:
    return time.time_ns() // 1000


@dataclass(eq=False)
class Key:
    """One of the stranger's keys: its connection and how far it got."""

    identity: Identity
    socket: zmq.Socket
    opened: float
    network: str
    counter: SequenceCounter = field(init=False)
    state: str = "hello"  # hello → challenged → answered (RESERVED came) → closed
    granted: bool = False
    last_sent: float = 0.0
    peers_socket: zmq.Socket | None = None  # to the relay's peers' socket, once admitted
    relay_port: int | None = None  # its HELLO's `peer_port`

    def __post_init__(self) -> None:
        self.encoder = Encoder(self.identity, self.network)
        self.counter = SequenceCounter(persisted=0, now_us=_now_us())
        self.counter.confirm_reservation(self.counter.propose_reservation())

    def send(self, body, now: float, socket: zmq.Socket | None = None) -> None:
        frame = self.encoder.encode(body, seq=self.counter.next(), timestamp_us=_now_us(), round=0)
        try:
            (socket or self.socket).send(frame, zmq.NOBLOCK)
        except zmq.Again:  # not connected (yet, or refused): the resend tries again
            pass
        self.last_sent = now

    def hello(self, now: float) -> None:
        address = client_address(self.identity.public_key)
        self.send(Hello(address, (CLIENT_CAPABILITY,), 0, (PROTOCOL_VERSION,), None), now)


def run(target: str, target_key: bytes, keys: int, rate: float, seconds: float, network: str, give_up_s: float) -> dict:
    context = zmq.Context()
    decoder = Decoder(network)
    server_key = curve_public_from_ed25519(target_key)
    counts: Counter[str] = Counter()
    live: dict[zmq.Socket, Key] = {}
    poller = zmq.Poller()
    started = time.monotonic()

    def dial(identity: Identity, address: str) -> zmq.Socket:
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        secret, public = identity.curve_keypair()
        socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
        socket.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        socket.connect(address)
        poller.register(socket, zmq.POLLIN)
        return socket

    def open_key(now: float) -> None:
        identity = Identity.generate()
        socket = dial(identity, target)
        key = live[socket] = Key(identity, socket, now, network)
        key.hello(now)
        counts["tried"] += 1

    def link(key: Key, port: int) -> None:
        """Dial the relay's peers' socket, and say something there: the relay's route to this key."""
        key.peers_socket = dial(key.identity, f"{target.rsplit(':', 1)[0]}:{port}")
        live[key.peers_socket] = key
        key.send(Ping(0), time.monotonic(), key.peers_socket)

    def close(key: Key) -> None:
        for socket in (key.socket, key.peers_socket):
            if socket is not None:
                poller.unregister(socket)
                socket.close(linger=0)
                del live[socket]

    while (now := time.monotonic()) - started < seconds:
        while counts["tried"] < keys and counts["tried"] < (now - started) * rate + 1:
            open_key(now)
        for socket, _ in poller.poll(50):
            key = live.get(socket)
            while key is not None and socket in live and socket.poll(0):
                _receive(key, socket, target_key, decoder, counts, close, time.monotonic())
                if key.state == "answered" and key.peers_socket is None and key.relay_port:
                    link(key, key.relay_port)
        for key in set(live.values()):
            _resend_or_give_up(key, now, give_up_s, counts, close)
    keys_left = set(live.values())
    counts["held_at_end"] = sum(key.granted for key in keys_left)
    for key in keys_left:
        close(key)
    context.term()
    return {"keys": keys, "seconds": round(time.monotonic() - started, 1), **dict(sorted(counts.items()))}


def _receive(
    key: Key, socket: zmq.Socket, target_key: bytes, decoder: Decoder, counts: Counter, close, now: float
) -> None:
    try:
        envelope = decoder.decode(socket.recv())
    except ProtocolError as error:
        counts[f"undecodable_{error.reason}"] += 1
        return
    if envelope.sender != target_key:
        return
    body = envelope.body
    if envelope.type is MessageType.HELLO:
        key.relay_port = body.peer_port
    elif envelope.type is MessageType.PING and key.state == "hello":  # the relay's challenge
        key.state = "challenged"
        counts["challenged"] += 1
        key.send(Pong(body.nonce), now)
        key.send(Reserve(TTL_S), now)
    elif envelope.type is MessageType.PING:  # liveness: an admitted key stays a peer
        key.send(Pong(body.nonce), now, socket)
        counts["pongs"] += 1
    elif envelope.type is MessageType.RESERVED and key.state == "challenged":
        key.state = "answered"
        counts["answered"] += 1
        key.granted = body.ttl_s > 0
        counts["granted" if key.granted else f"refused_{body.refused}"] += 1
    elif envelope.type is MessageType.BYE:
        counts[f"bye_{body.reason}"] += 1
        key.granted = False
        close(key)


def _resend_or_give_up(key: Key, now: float, give_up_s: float, counts: Counter, close) -> None:
    if key.state == "answered":
        return
    if now - key.opened > give_up_s:
        counts[f"gave_up_{key.state}"] += 1
        close(key)
    elif now - key.last_sent > RESEND_S:
        if key.state == "hello":
            key.hello(now)
        else:
            key.send(Reserve(TTL_S), now)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.sybil", description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, type=_target)
    parser.add_argument("--target-key", required=True, type=bytes.fromhex, help="the relay's public key, hex")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0, help="new keys a second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--network", default="testnet")
    parser.add_argument("--give-up-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    result = run(args.target, args.target_key, args.keys, args.rate, args.seconds, args.network, args.give_up_s)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
