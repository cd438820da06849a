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

from .bench import protocol as bench
from .keystore import KeyFileError, load_key, write_key

NETWORK = "demo"


def _clock_us() -> int:
    return time.time_ns() // 1000


def _identity(keys: Path, name: str) -> tuple[Identity, str]:
    path = keys / f"{name}.pem"
    if path.exists():
        return load_key(path), "loaded"
    identity = Identity.generate()
    write_key(path, identity)
    return identity, "created"


class _Sender:
    """One node's outgoing side: its encoder and never-repeating sequence numbers."""

    def __init__(self, identity: Identity, network: str = NETWORK) -> None:
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
    print("There is no learning yet (issues #4-#5); tensors are random, of MAPL's shapes.\n")
    try:
        keys = out / "keys"
        alice, alice_state = _identity(keys, "alice")
        bob, bob_state = _identity(keys, "bob")
        mallory, mallory_state = _identity(keys, "mallory")
    except KeyFileError as exc:
        print(f"p2pnode: error: {exc}")
        return 1
    for name, who, state in (
        ("alice", alice, alice_state),
        ("bob", bob, bob_state),
        ("mallory", mallory, mallory_state),
    ):
        print(f"  {name:<8} node id {who.node_id}  ({state} {keys / (name + '.pem')}, mode 0600)")

    rng = np.random.default_rng(0)
    sender = _Sender(alice)
    limits = Limits(frame_bytes_by_type={MessageType.MODEL: 4 * MiB}, max_tensor_norm=1e4)
    bob_in = _Receiver(Decoder(NETWORK, limits, allowed_senders={alice.public_key, bob.public_key}))

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
    for frame in [hello] + [sender.frame(body) for body in bodies]:
        result = bob_in.receive(frame)
        if isinstance(result, ProtocolError):
            print(f"   unexpected rejection: {result}")
            return 1
        if result.type is MessageType.PING:
            ping = frame
        print(f"   {result.type.value:<11} {len(frame):>7}  accepted: {result.body!r}"[:118])

    flipped = bytearray(ping)
    flipped[len(flipped) // 2] ^= 0x01
    huge = Model(kind="params", tensors={"w": np.zeros(5 * MiB // 4, np.float32)})
    attacks = [
        ("the same PING frame again", ping),
        ("one bit flipped in a PING", bytes(flipped)),
        ("PING stamped 10 minutes ago", sender.frame(Ping(nonce=1), timestamp_us=_clock_us() - 600_000_000)),
        ("PING for network 'other'", _Sender(alice, "other").frame(Ping(nonce=2))),
        ("PING from mallory (not allowed)", _Sender(mallory).frame(Ping(nonce=3))),
        ("5 MiB MODEL (bob allows 4 MiB)", sender.frame(huge)),
        (
            "prototypes of norm ~1e5 (bound 1e4)",
            sender.frame(Prototypes(classes=(0,), counts=(1,), prototypes=np.full((1, 128), 1e4, np.float32))),
        ),
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
        verdict = (
            f"rejected, {result.reason.value}: {result.detail}"
            if isinstance(result, ProtocolError)
            else "ACCEPTED (bug)"
        )
        print(f"   {what:<38} {verdict}"[:118])
        if not isinstance(result, ProtocolError):
            return 1
    print(f"\n3) bob's rejection counters: {dict(sorted(bob_in.rejections.items()))}")

    print("\n4) protocol benchmark, quick run (numbers: `make bench`, results in BENCHMARKS.md)")
    print("   " + bench.format_table(bench.run(trials=3, seconds=0.02)).replace("\n", "\n   "))
    print(f"\nKeys are in {keys}. Real daemons finding each other: p2pnode testnet --nodes 10 --duration 20 --out DIR")
    return 0
