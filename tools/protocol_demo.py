"""`p2pnode protocol-demo`: the smallest real thing the project does today.

Two identities with keys on disk exchange one signed frame of every message type, then a third
party and a few broken frames are refused, each with its reason. There is no learning yet
(issues #4-#5): the tensors here are random numbers of the shapes MAPL will send.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np

from p2pnode.wire.keystore import KeyFileError, load_key, write_key
from protocol import (
    PROTOCOL_VERSION,
    Bye,
    Decoder,
    Encoder,
    Head,
    Hello,
    Identity,
    Limits,
    MessageType,
    MiB,
    Model,
    Peers,
    Ping,
    Pong,
    ProtocolError,
    Prototypes,
    ReplayGuard,
    Score,
    SequenceCounter,
    seal_raw,
)
from tools.bench import protocol as bench

NETWORK = "demo"


def _clock_us() -> int:
    return time.time_ns() // 1000


def _identity(keys: Path, name: str) -> Identity:
    """The demo key `name`, loaded if it exists, created (mode 0600) if not."""
    path = keys / f"{name}.pem"
    if path.exists():
        identity, state = load_key(path), "loaded"
    else:
        identity, state = Identity.generate(), "created"
        write_key(path, identity)
    print(f"  {name:<8} node id {identity.node_id}  ({state} {path}, mode 0600)")
    return identity


class _Sender:
    """One node's outgoing side: its encoder and never-repeating sequence numbers."""

    def __init__(self, identity: Identity, network: str = NETWORK) -> None:
        self.identity = identity
        self.encoder = Encoder(identity, network)
        self.counter = SequenceCounter(persisted=0, now_us=_clock_us())
        # The daemon persists each reservation (state.json) before using it; the demo keeps it in memory.
        self.counter.confirm_reservation(self.counter.propose_reservation())

    def frame(self, body, *, round: int = 1, timestamp_us: int | None = None) -> bytes:
        return self.encoder.encode(body, seq=self.counter.next(), timestamp_us=timestamp_us or _clock_us(), round=round)


class _Receiver:
    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self.guard = ReplayGuard()
        self.rejections: Counter[str] = Counter()

    def receive(self, frame: bytes):
        """The daemon's receive path: decode and verify, then the replay guard; count refusals."""
        try:
            envelope = self.decoder.decode(frame)
            self.guard.admit(envelope.sender, envelope.seq, envelope.timestamp_us, _clock_us())
            return envelope
        except ProtocolError as exc:
            self.rejections[exc.reason.value] += 1
            return exc


def run(out: Path) -> int:
    print("p2pnode protocol demo: signed msgpack frames between two node identities.")
    print("The tensors are random, of MAPL's shapes; `make demo` shows daemons learning over the network.\n")
    keys = out / "keys"
    try:
        alice, bob, mallory = [_identity(keys, name) for name in ("alice", "bob", "mallory")]
    except KeyFileError as exc:
        print(f"p2pnode: error: {exc}")
        return 1
    sender = _Sender(alice)
    limits = Limits(frame_bytes_by_type={MessageType.MODEL: 4 * MiB}, max_tensor_norm=1e4)
    bob_in = _Receiver(Decoder(NETWORK, limits, allowed_senders={alice.public_key, bob.public_key}))
    # A daemon trusts a sender (keeps its replay window) once its handshake has verified; here
    # alice counts as verified from the start, so her replays are caught by sequence number.
    bob_in.guard.trust(alice.public_key, 0)
    ping = _every_type(sender, bob, bob_in)
    if ping is None or not _attacks(sender, mallory, bob_in, ping):
        return 1
    print(f"\n3) bob's rejection counters: {dict(sorted(bob_in.rejections.items()))}")
    print("\n4) protocol benchmark, quick run (numbers: `make bench`, results in BENCHMARKS.md)")
    print("   " + bench.format_table(bench.run(trials=3, seconds=0.02)).replace("\n", "\n   "))
    print(f"\nKeys are in {keys}. Real daemons finding each other: p2pnode testnet --nodes 10 --duration 20 --out DIR")
    return 0


def _every_type(sender: _Sender, bob: Identity, bob_in: _Receiver) -> bytes | None:
    """Alice sends Bob one frame of each type; returns the PING frame (None if any was refused)."""
    rng = np.random.default_rng(0)
    hello = sender.frame(
        Hello(
            address="tcp://127.0.0.1:7001",
            capabilities=("mapl", "scool"),
            dataset_size=250,
            protocol_versions=(PROTOCOL_VERSION,),
        )
    )
    bodies = [
        Peers(hellos=(hello,)),
        Ping(nonce=42),
        Pong(nonce=42),
        Prototypes(
            classes=tuple(range(5)), counts=(25,) * 5, prototypes=rng.standard_normal((5, 128), dtype=np.float32)
        ),
        Head(weight=rng.standard_normal((10, 64), dtype=np.float32), bias=np.zeros(10, np.float32)),
        Score(kind="log_likelihood", subject=bob.public_key, subject_seq=7, value=-0.42, samples=10),
        Model(
            kind="delta",
            tensors={
                "conv1.weight": 0.01 * rng.standard_normal((16, 1, 3, 3), dtype=np.float32),
                "fc.bias": np.zeros(10, np.float32),
            },
        ),
        Bye(reason="shutdown"),
    ]
    print("\n1) alice -> bob: one frame of each type, decoded, signature-checked, replay-checked")
    print(f"   {'type':<11} {'bytes':>7}  result")
    ping = None
    for frame in [hello, *(sender.frame(body) for body in bodies)]:
        result = bob_in.receive(frame)
        if isinstance(result, ProtocolError):
            print(f"   unexpected rejection: {result}")
            return None
        if result.type is MessageType.PING:
            ping = frame
        print(f"   {result.type.value:<11} {len(frame):>7}  accepted: {result.body!r}"[:118])
    return ping


def _attacks(sender: _Sender, mallory: Identity, bob_in: _Receiver, ping: bytes) -> bool:
    """Frames Bob must refuse, each with its reason; False if one got through."""
    alice = sender.identity
    flipped = bytearray(ping)
    flipped[len(flipped) // 2] ^= 0x01
    huge = Model(kind="params", tensors={"w": np.zeros(5 * MiB // 4, np.float32)})
    big_norm = Prototypes(classes=(0,), counts=(1,), prototypes=np.full((1, 128), 1e4, np.float32))
    attacks = [
        ("the same PING frame again", ping),
        ("one bit flipped in a PING", bytes(flipped)),
        ("PING stamped 10 minutes ago", sender.frame(Ping(nonce=1), timestamp_us=_clock_us() - 600_000_000)),
        ("PING for network 'other'", _Sender(alice, "other").frame(Ping(nonce=2))),
        ("PING from mallory (not allowed)", _Sender(mallory).frame(Ping(nonce=3))),
        ("5 MiB MODEL (bob allows 4 MiB)", sender.frame(huge)),
        ("prototypes of norm ~1e5 (bound 1e4)", sender.frame(big_norm)),
        ("a PING cut short", sender.frame(Ping(nonce=4))[:-20]),
        (
            "envelope version 2",
            seal_raw(
                alice, [2, NETWORK, "PING", alice.public_key, sender.counter.next(), _clock_us(), 1, {"nonce": 5}]
            ),
        ),
        (
            "message type 'GOSSIP'",
            seal_raw(alice, [1, NETWORK, "GOSSIP", alice.public_key, sender.counter.next(), _clock_us(), 1, {}]),
        ),
    ]
    print("\n2) frames bob refuses")
    for what, frame in attacks:
        result = bob_in.receive(frame)
        if not isinstance(result, ProtocolError):
            print(f"   {what:<38} ACCEPTED (bug)")
            return False
        print(f"   {what:<38} rejected, {result.reason.value}: {result.detail}"[:118])
    return True
