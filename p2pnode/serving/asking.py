"""Asking the fleet about an image: both sides of `p2pnode predict --ask-peers` (docs/usage.md).

The asking side: for the images the node calls not one of its classes, the control command
`predict` sends one ASK (each image as a PNG of the model's input) to at most
`[node].ask_max_peers` of its learning peers (they share its class list), waits at most
`[node].ask_timeout_s` for their ANSWERs, and puts each peer's answer beside the image with who
answered and the signed frame it came in (anyone can check its signature). A peer's answer is
the answer to the image when its own threshold says the image is one of its classes
(algorithms/models/inference.py: KnownClasses); of several such, the most probable.

The answering side: an ASK from a learning peer waits in a queue of `[node].ask_queue` for the
one task that answers them in turn, with the frozen model `predict` uses. Each peer may ask
`[node].ask_per_minute` times a minute. An ASK from anyone else, over the rate, into a full
queue, or with an image that is not a PNG of at most `[node].ask_max_image_side` pixels a side
is a counted refusal, as is an ANSWER nobody asked for.
"""

from __future__ import annotations

import base64
import io
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from protocol import MAX_ASKED_IMAGES, Answer, Ask, Body, Envelope, ProtocolError

from .predict import PredictError

if TYPE_CHECKING:
    from ..config import NodeSettings
    from .predict import LiveModel, UsableModel

__all__ = ["Asking", "ASK_REFUSALS"]

log = logging.getLogger("p2pnode.node")

ASK_NOT_LEARNING_PEER = "ask_not_learning_peer"  # an ASK from an admitted peer that learns otherwise
ASK_RATE_LIMITED = "ask_rate_limited"  # over `[node].ask_per_minute`
ASK_BUSY = "ask_busy"  # the queue of `[node].ask_queue` is full
ASK_BAD_IMAGE = "ask_bad_image"  # not a PNG, or larger than `[node].ask_max_image_side`
ANSWER_UNEXPECTED = "answer_unexpected"  # no ask of ours is waiting for it from that peer
ANSWER_MISMATCHED = "answer_mismatched"  # not one answer per image asked about
ASK_REFUSALS = (ASK_NOT_LEARNING_PEER, ASK_RATE_LIMITED, ASK_BUSY, ASK_BAD_IMAGE, ANSWER_UNEXPECTED, ANSWER_MISMATCHED)


@dataclass
class _Waiting:
    """An ASK of ours: whom it went to and what came back."""

    asked: dict[str, str]  # node id → address
    images: int
    answers: dict[str, tuple[Answer, bytes]] = field(default_factory=dict)  # node id → answer, signed frame
    done: trio.Event = field(default_factory=trio.Event)


class Asking:
    """`peers()`: the learning peers, node id → address; `send(addresses, body)` signs and sends;
    `live`: the node's model as `predict` uses it; `rejected(reason, size)` counts a refusal made
    once an ASK is read (the others the node counts from what `on_ask` and `on_answer` return)."""

    def __init__(
        self,
        settings: NodeSettings,
        peers: Callable[[], Mapping[str, str]],
        send: Callable[[tuple[str, ...], Body], Awaitable[int | None]],
        live: LiveModel,
        rejected: Callable[[str, int], None] = lambda reason, size: None,
    ) -> None:
        self.settings, self.peers, self.send, self.live, self.rejected = settings, peers, send, live, rejected
        self._queue_in, self._queue_out = trio.open_memory_channel[tuple[Envelope, str]](settings.ask_queue)
        self._allowance: dict[str, tuple[float, float]] = {}  # node id → (asks left, when counted)
        self._waiting: dict[int, _Waiting] = {}  # query → our ask

    # --- answering ---------------------------------------------------------------------------

    def on_ask(self, envelope: Envelope, now: float) -> str | None:
        """A verified ASK from an admitted peer: queued for `serve`, or a refusal to count."""
        peers = self.peers()
        sender = envelope.sender_id
        if sender not in peers:
            return ASK_NOT_LEARNING_PEER
        if not self._allowed(sender, now, peers):
            return ASK_RATE_LIMITED
        try:
            self._queue_in.send_nowait((envelope, peers[sender]))
        except trio.WouldBlock:
            return ASK_BUSY
        return None

    def _allowed(self, sender: str, now: float, peers: Mapping[str, str]) -> bool:
        """A token bucket per peer of `ask_per_minute` asks; kept for learning peers only (bounded)."""
        rate = self.settings.ask_per_minute
        left, at = self._allowance.get(sender, (float(rate), now))
        left = min(float(rate), left + (now - at) * rate / 60.0)
        if len(self._allowance) > len(peers):
            self._allowance = {node: kept for node, kept in self._allowance.items() if node in peers}
        if left < 1.0:
            self._allowance[sender] = (left, now)
            return False
        self._allowance[sender] = (left - 1.0, now)
        return True

    async def serve(self) -> None:
        """Answer the queued ASKs, one at a time (each costs a forward pass of the images)."""
        async for envelope, address in self._queue_out:
            answer, refusal = await trio.to_thread.run_sync(self._answer, envelope.body)
            if refusal is not None:
                self.rejected(refusal, envelope.size)
                log.info("ASK from %s refused: %s", envelope.sender_id, refusal)
                continue
            await self.send((address,), answer)

    def _answer(self, ask: Ask) -> tuple[Answer | None, str | None]:
        if not all(_small_png(image, self.settings.ask_max_image_side) for image in ask.images):
            return None, ASK_BAD_IMAGE
        try:
            model = self.live.get()
        except PredictError:
            return _refused(ask.query, "no_model_yet"), None
        results = model.classify(ask.images)
        if any("error" in result for result in results):
            return None, ASK_BAD_IMAGE
        return (
            Answer(
                query=ask.query,
                classes=model.known.classes,
                threshold=model.known.threshold,
                labels=tuple(result["class"] for result in results),
                probabilities=tuple(min(1.0, result["probability"]) for result in results),
                own_probabilities=tuple(min(1.0, result["own_probability"]) for result in results),
            ),
            None,
        )

    # --- asking ------------------------------------------------------------------------------

    def on_answer(self, envelope: Envelope, frame: bytes) -> str | None:
        """A verified ANSWER from an admitted peer: kept for the ask it answers, or a refusal."""
        answer: Answer = envelope.body
        waiting = self._waiting.get(answer.query)
        sender = envelope.sender_id
        if waiting is None or sender not in waiting.asked or sender in waiting.answers:
            return ANSWER_UNEXPECTED
        if answer.refused is None and len(answer.labels) != waiting.images:
            return ANSWER_MISMATCHED
        waiting.answers[sender] = (answer, frame)
        if len(waiting.answers) == len(waiting.asked):
            waiting.done.set()
        return None

    async def ask_about(self, model: UsableModel, blobs: Sequence[bytes], results: list[dict]) -> dict[str, Any]:
        """Ask the learning peers about the image files `blobs` (this node's `results` for them
        get each peer's answer, `peers`, and the one taken, `answer`); returns who was asked and
        who answered."""
        peers = dict(sorted(self.peers().items())[: self.settings.ask_max_peers])
        if not blobs or not peers:
            return {"peers": sorted(peers), "answered": [], "images": len(blobs)}
        if len(blobs) > MAX_ASKED_IMAGES:
            raise PredictError(f"at most {MAX_ASKED_IMAGES} images in one ask")
        if len(self._waiting) >= self.settings.ask_queue:
            raise PredictError(f"{len(self._waiting)} asks are waiting for answers already; try again in a moment")
        images = await trio.to_thread.run_sync(model.input_pngs, blobs)
        query = secrets.randbits(64)
        waiting = self._waiting[query] = _Waiting(peers, len(images))
        try:
            try:
                await self.send(tuple(peers.values()), Ask(query=query, images=tuple(images)))
            except ProtocolError as exc:  # e.g. images too large together for one ASK frame
                raise PredictError(f"cannot ask about these images: {exc}") from None
            with trio.move_on_after(self.settings.ask_timeout_s):
                await waiting.done.wait()
        finally:
            del self._waiting[query]
        for index, result in enumerate(results):
            result["peers"] = [
                _peer_says(node, *waiting.answers[node], index, model) for node in sorted(waiting.answers)
            ]
            knowing = [said for said in result["peers"] if said.get("known")]
            result["answer"] = max(knowing, key=lambda said: said["probability"]) if knowing else None
        return {"peers": sorted(peers), "answered": sorted(waiting.answers), "images": len(images)}


def _refused(query: int, why: str) -> Answer:
    return Answer(
        query=query, classes=(), threshold=0.0, labels=(), probabilities=(), own_probabilities=(), refused=why
    )


def _small_png(blob: bytes, max_side: int) -> bool:
    """Whether `blob` is a PNG no wider or taller than `max_side` (read from its header only:
    a peer cannot make this node decode a huge image)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(blob)) as image:
            return image.format == "PNG" and max(image.size) <= max_side
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return False


def _peer_says(node: str, answer: Answer, frame: bytes, index: int, model: UsableModel) -> dict[str, Any]:
    """One peer's answer about image `index`, in this node's class names (the network shares them)."""
    names = model.class_names
    signed = {"node_id": node, "signed_frame": base64.b64encode(frame).decode()}
    if answer.refused is not None:
        return {**signed, "refused": answer.refused}
    label, own = answer.labels[index], answer.own_probabilities[index]
    return {
        **signed,
        "class": label,
        "class_name": names[label] if label < len(names) else str(label),
        "probability": answer.probabilities[index],
        "own_probability": own,
        "known": label in answer.classes and own >= answer.threshold,
        "peer_classes": [names[k] if k < len(names) else str(k) for k in answer.classes],
    }
