"""A Byzantine daemon for rehearsals (issue #27): a real node, admitted as any other, that
learns as its algorithm does but attacks its learning peers every round.

    python -m testnet.launch.byzantine --config node.toml --attack rescale --factor 1e4 [--barrage]

It is `p2pnode start` with two changes, so that what it attacks is the real daemon's path
(transport, ingress, decoder, replay guard, rounds, the algorithm's checks), not a model of it:
- every learning payload it sends is poisoned by `--attack` (algorithms/methods/poison.py, as the
  simulator's poisoning nodes: `rescale` keeps each frame legal whatever the factor);
- with `--barrage`, each time a learning peer's round advances to r (every frame says it), to
  that peer, for the latest payload of each type it published: that payload tagged r−2, r,
  r+3 and r+1000; the same
  with NaN in it, with every tensor one column wider, and with one past its type's frame
  bound; a burst of SCOREs; and a 60 MB MODEL. Each is a frame with a valid signature and a
  fresh sequence number, so only the checks meant for it can refuse it. What it sent, by kind, is in its `status`.

`p2pnode testnet --poisoners I --attack K [--barrage]` runs node I as this; never part of a
deployment (`p2pnode start` has no such mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import trio

from algorithms.interface import Algorithm
from algorithms.methods.poison import ATTACKS, Attack, PoisoningNode
from p2pnode.config import Config
from p2pnode.data_dir import DataDir
from p2pnode.node import Node
from p2pnode.runner import StartFailed, start
from p2pnode.wire.transport import DROPPED
from protocol import LEARNING_TYPES, PROTOCOL_VERSION, Body, Envelope, MessageType, seal_raw
from protocol.limits import Limits
from protocol.messages import Model, Score

__all__ = ["ByzantineNode", "BARRAGE", "main"]

BARRAGE_POLL_S = 0.05
ROUND_OFFSETS = (-2, 0, 3, 1000)  # copies of the round's payload, tagged r + each
SCORES_PER_ROUND = 100
MODEL_BYTES = 60_000_000  # under MODEL's 64 MiB frame bound: a legal frame no MAPL node expects
# What one round's barrage sends each peer, by kind (status: "byzantine").
BARRAGE = ("barrages", "round", "nan", "wide", "oversize", "model", "score")
_ANY_NORM = Limits(max_tensor_norm=float("inf"))  # the wire form of a payload, whatever its scale


class ByzantineNode(Node):
    """`Node`, with its algorithm poisoned by `attack` and, if `barrage`, each round's attacks."""

    def __init__(self, config: Config, attack: Attack, *, barrage: bool, seed: int = 0) -> None:
        super().__init__(config)
        self.attack = attack
        self.barrage = barrage
        self.seed = seed
        self.barraged: Counter[str] = Counter()  # frames the barrage queued, by kind
        self._published: dict[MessageType, tuple[Body, int]] = {}  # the latest learning payload of each type, its seq
        self._took = 0  # how many addresses took the last frame sent
        self._rounds: dict[str, int] = {}  # peer → the latest round its frames were tagged with
        self._model = np.zeros(MODEL_BYTES // 4, np.float32) if barrage else None

    def build_algorithm(self) -> Algorithm:
        return PoisoningNode(super().build_algorithm(), self.attack, seed=self.seed)

    async def send_payload(self, addresses: tuple[str, ...], body: Body, round: int | None = None) -> int | None:
        seq = await super().send_payload(addresses, body, round)
        if seq is not None and body.TYPE in LEARNING_TYPES:
            self._published[body.TYPE] = (body, seq)
        return seq

    async def _handle(self, envelope: Envelope, frame: bytes, source: str | None) -> str | None:
        # Every frame is tagged with its sender's round, keep-alives too: what a peer is at.
        if self.membership is not None and envelope.sender in self.membership.peers:
            peer = envelope.sender_id
            self._rounds[peer] = max(self._rounds.get(peer, 0), envelope.round)
        return await super()._handle(envelope, frame, source)

    async def _learn(self, data_dir: DataDir) -> None:
        async with trio.open_nursery() as nursery:
            if self.barrage:
                nursery.start_soon(self._barrage_each_round)
            await super()._learn(data_dir)  # the barrage goes on after its own last round

    async def _barrage_each_round(self) -> None:
        """Once the algorithm has published, a barrage to each learning peer each time that
        peer's round advances (tagged with it), whether or not the algorithm sends it anything
        (its peers may have stopped listening, or it may have finished its own rounds)."""
        done: dict[str, int] = {}  # peer → the round of its last barrage
        while True:
            await trio.sleep(BARRAGE_POLL_S)
            if not self._published:
                continue
            due: dict[int, list[str]] = {}  # round → the addresses of the peers that reached it
            for peer, address in self.learning_peers.chosen().items():
                round = self._rounds.get(peer, 0)
                if round > done.get(peer, -1):
                    done[peer] = round
                    due.setdefault(round, []).append(address)
            for round, addresses in sorted(due.items()):  # one signing per frame for the peers at one round
                await self._send_barrage(tuple(addresses), round)

    async def _send_barrage(self, addresses: tuple[str, ...], round: int) -> None:
        self.barraged["barrages"] += len(addresses)  # (peer, round) pairs
        for body, _ in list(self._published.values()):
            for offset in ROUND_OFFSETS:
                if round + offset >= 0:
                    self.barraged["round"] += await self._delivered(addresses, body, round + offset)
            for kind, wire in (("nan", _with_nan(body)), ("wide", _wider(body)), ("oversize", self._oversize(body))):
                if wire is not None:
                    self._send_raw(kind, addresses, body, wire, round)
        subject_seq = max(seq for _, seq in self._published.values())
        score = Score(
            kind="similarity", subject=self.identity.public_key, subject_seq=subject_seq, value=1.0, samples=1
        )
        for _ in range(SCORES_PER_ROUND):
            self.barraged["score"] += await self._delivered(addresses, score, round)
        # Last: one connection delivers in order, and 60 MB may still be on its way when a fast
        # peer ends its rounds; the SCOREs queued behind it would then never be judged at all.
        model = Model(kind="params", tensors={"weight": self._model})
        self.barraged["model"] += await self._delivered(addresses, model, round)

    async def _delivered(self, addresses: tuple[str, ...], body: Body, round: int) -> int:
        """Sign and send `body` tagged `round`; how many of `addresses` took it."""
        self._took = 0
        await super().send_payload(addresses, body, round)
        return self._took

    def _send_frame(self, addresses: tuple[str, ...], body: Body, frame: bytes) -> int:
        self._took = super()._send_frame(addresses, body, frame)
        return self._took

    def _oversize(self, body: Body) -> dict[str, Any] | None:
        """`body`'s wire form with its first tensor grown past its type's frame bound, if that
        bound is one a tensor can pass (not MODEL's)."""
        bound = self.decoder.limits.max_frame_bytes_for(body.TYPE)
        if bound > 16 << 20:
            return None
        wire = body.to_wire(_ANY_NORM)
        for tensor in _tensors(wire):
            tensor.update(dtype="float32", shape=[1, bound // 4 + 1], data=bytes(4 * (bound // 4 + 1)))
            return wire
        return None

    def _send_raw(self, kind: str, addresses: tuple[str, ...], like: Body, wire: dict, round: int) -> None:
        """Sign `wire` as a body of `like`'s type without the encoder's checks, and send it."""
        seq = self._sequence.next(like)
        if seq is None:
            return
        envelope = [PROTOCOL_VERSION, self.config.node.network, like.TYPE.value, self.identity.public_key]
        frame = seal_raw(self.identity, [*envelope, seq, self.clock_us(), round, wire])
        self.barraged[kind] += sum(self.transport.send(address, frame) is not DROPPED for address in addresses)

    def status(self) -> dict:
        return {**super().status(), "byzantine": {"attack": dataclasses.asdict(self.attack), **self.barraged}}


def _tensors(wire: Any) -> Iterator[dict]:
    """The tensor maps of a body's wire form, depth first."""
    if isinstance(wire, dict):
        if wire.keys() == {"dtype", "shape", "data"}:
            yield wire
            return
        for value in wire.values():
            yield from _tensors(value)


def _rewritten(body: Body, change: Callable[[np.ndarray], np.ndarray]) -> dict[str, Any] | None:
    """`body`'s wire form with each float tensor replaced by `change(tensor)`; None if it has none."""
    wire = body.to_wire(_ANY_NORM)
    changed = False
    for tensor in _tensors(wire):
        if not tensor["dtype"].startswith("float"):
            continue
        array = np.frombuffer(tensor["data"], dtype=np.dtype(tensor["dtype"]).newbyteorder("<"))
        new = np.ascontiguousarray(change(array.reshape(tensor["shape"])), dtype=array.dtype)
        tensor.update(shape=list(new.shape), data=new.tobytes())
        changed = True
    return wire if changed else None


def _with_nan(body: Body) -> dict[str, Any] | None:
    def poison(array: np.ndarray) -> np.ndarray:
        array = array.copy()
        array.flat[0] = np.nan
        return array

    return _rewritten(body, poison)


def _wider(body: Body) -> dict[str, Any] | None:
    """Every float tensor one column wider: each a legal tensor, none of the shape the model has."""
    return _rewritten(body, lambda a: np.concatenate([a, np.zeros((*a.shape[:-1], 1), a.dtype)], axis=-1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testnet.launch.byzantine", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, metavar="PATH")
    parser.add_argument("--attack", choices=ATTACKS, default="rescale")
    parser.add_argument("--factor", type=float, default=1e4, help="the factor of scale and rescale")
    parser.add_argument("--barrage", action="store_true", help="also each round's malformed and out-of-round frames")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    attack = Attack(args.attack, args.factor)
    try:
        start(args.config, lambda config: ByzantineNode(config, attack, barrage=args.barrage, seed=args.seed))
    except StartFailed as exc:
        print(f"testnet.launch.byzantine: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
