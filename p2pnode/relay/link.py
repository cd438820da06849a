"""The node's side of circuits (issue #46): it seals its frames for a client node it reaches
through a relay and hands them to the relay in a RELAY; what a relay hands it in a RELAYED is
opened by the receive path (`Inbound.deliver_relayed`). Frames stay signed end to end, and a
relay reads none (protocol/sealing.py; docs/protocol.md, "Relays").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from protocol import Body, Decoder, Encoder, Envelope, ProtocolError, Relay, Sealing
from protocol.messages import RELAY_CAPABILITY, is_client_address

from ..discovery.peer import Peer
from ..wire.inbound.circuits import Circuits
from ..wire.transport import DROPPED, SENT, Transport

__all__ = ["RelayLink"]


class RelayLink:
    def __init__(
        self,
        encoder: Encoder,
        transport: Transport,
        peers: Callable[[], Mapping[bytes, Peer]],
        next_seq: Callable[[Body], int | None],
        clock_us: Callable[[], int],
        counts: Counter[str],
    ) -> None:
        self.encoder, self.transport, self.peers, self.next_seq = encoder, transport, peers, next_seq
        self.clock_us, self.counts = clock_us, counts
        self.sealing = Sealing(encoder.identity, encoder.network_id)
        self._own_frames = Decoder(encoder.network_id, encoder.limits)  # reads the seq of this node's frames
        self.circuits: Circuits | None = None  # set once the node's routes are built

    def send(self, client: bytes, relay: bytes, frame: bytes) -> str:
        """`frame`, one of this node's, sealed to `client` and sent in a RELAY to peer `relay`."""
        peer = self.peers().get(relay)
        if peer is None:
            self.counts["relay_out_no_relay"] += 1
            return DROPPED
        try:
            header = self._own_frames.peek(frame)
            sealed = self.sealing.seal(client, header.seq, frame)
            body = Relay(target=client, sealed=sealed)
            seq = self.next_seq(body)
            if seq is None:
                return DROPPED
            # Round 0: the relay does not learn this node's rounds.
            outer = self.encoder.encode(body, seq=seq, timestamp_us=self.clock_us(), round=0)
        except ProtocolError:  # larger than a RELAY carries
            self.counts["relay_out_too_large"] += 1
            return DROPPED
        if self.transport.send(peer.address, outer) is DROPPED:
            self.counts["relay_out_dropped"] += 1
            return DROPPED
        # What the relay's hop costs: the RELAY's bytes against the frame's own, learning frames apart.
        kind = "learning" if header.type.is_learning else "other"
        self.counts["relay_out_frames"] += 1
        self.counts[f"relay_out_{kind}_bytes"] += len(outer)
        self.counts[f"relay_out_{kind}_frame_bytes"] += len(frame)
        return SENT

    def announced(self, informant: bytes, relayed: list[tuple[Envelope, bytes]]) -> None:
        """A peer's PEERS named client nodes: a relay names those it holds a place for, so it
        reaches them (others' word for it is not taken: they could route us into nowhere)."""
        peer = self.peers().get(informant)
        if self.circuits is None or peer is None or RELAY_CAPABILITY not in peer.capabilities:
            return
        for hello, _ in relayed:
            if is_client_address(hello.body.address) and hello.sender != informant:
                self.circuits.learn(hello.sender, informant)
