"""The daemon: one node's lifecycle, and the glue between its parts.

    Node.run: lock the data directory ─► reserve sequence numbers ─► bind ─► serve control
              ─► receive (inbound.py) / maintain peers (peers.py) / beacon ─► BYE, close

The node owns all I/O and time; discovery decisions come from `Membership` as actions, learning
payloads go to the round driver (learning.py) through `on_payload`, and the driver reaches the
network only through the narrow handles of `learning.Network`. Everything runs in one trio
nursery: cancelling it stops every task, and `run` returns only after the sockets are closed.
A problem that keeps the node from starting is recorded, the node stops, and `run` raises one
NodeStartError naming every such problem once the nursery has exited. docs/architecture.md has
the whole picture.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import trio

from protocol import (
    DISCOVERY_TYPES,
    PROTOCOL_VERSION,
    Body,
    Decoder,
    Encoder,
    Envelope,
    Hello,
    MessageType,
    Peers,
    ProtocolError,
    ReplayGuard,
    SequenceCounter,
    SequenceExhausted,
    node_id,
)
from protocol.curve import curve_public_from_ed25519

from .config import Config
from .discovery.actions import Action, Admitted, Dial, DialPeers, Evicted, Hangup, Send, SendHello, Unreachable
from .discovery.beacon import run_beacon
from .discovery.peers import Membership
from .files import describe_os_error
from .learning.checkpoint import CHECKPOINT_NAME
from .learning.driver import (
    LearningSetupError,
    Network,
    RoundDriver,
    build_algorithm,
    class_list_text,
    labels_capability,
    learning_capability,
    learning_verdict,
)
from .learning.history import HISTORY_NAME
from .learning.predict import PREDICT, answer_predict, control_request_bytes
from .operations.control import serve_control
from .operations.memory import process_memory, trim_now
from .operations.metrics import NOT_LEARNING, UNKNOWN_PEER, Metrics
from .state import DataDir, DataDirError
from .wire import signing
from .wire.gate import Gate
from .wire.inbound import Inbound, decode_all
from .wire.ingress import BindError, Ingress
from .wire.transport import DROPPED, SENT, MissingKey, Transport, TransportError
from .wire.zap import PEERS, PUBLIC, Connections
from .wire.zygote import Zygote

if TYPE_CHECKING:
    from algorithms.seam import Algorithm

__all__ = ["Node", "NodeStartError", "wall_clock_us"]

log = logging.getLogger("p2pnode.node")

# After a failed attempt to extend the sequence reservation (a full disk), wait this long
# before the next: every send would otherwise start one, and each logs why it failed.
RESERVATION_RETRY_S = 5.0


# After this many bytes taken in, and at most this often, free heap pages go back (memory.py).
TRIM_AFTER_BYTES = 16 << 20
TRIM_INTERVAL_S = 2.0

# The longest the maintenance task sleeps when discovery has nothing due (Membership.next_due).
MAINTAIN_MAX_SLEEP_S = 1.0
# While frames wait for a peers' connection that is opening, it is tried this often.
WAITING_POLL_S = 0.02


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def wall_clock_us() -> int:
    return time.time_ns() // 1000


class NodeStartError(Exception):
    """The node could not start; nothing is left running. The message names every culprit,
    one per line, each with the setting to look at."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _data_dir_problem(exc: DataDirError) -> NodeStartError:
    # Before the node has started, another directory is a way out too; once it runs, it is not.
    elsewhere = ", or point [node].data_dir elsewhere" if exc.unwritable else ""
    return NodeStartError(f"[node].data_dir: {exc}{elsewhere}")


def _any_port(endpoint: str) -> str:
    """The peers' socket's default: the public socket's host, any port."""
    return f"{endpoint.rsplit(':', 1)[0]}:0"


class Node:
    def __init__(self, config: Config, *, clock_us: Callable[[], int] = wall_clock_us, seed: int | None = None) -> None:
        if config.identity is None:
            raise ValueError("the config has no identity: load it with load_config(..., load_identity=True)")
        self.config = config
        self.identity = config.identity
        self.clock_us = clock_us
        self.rng = random.Random(seed)
        limits = config.limits.limits()
        allow = frozenset(config.security.allowlist) if config.security.allowlist is not None else None
        self.encoder = Encoder(self.identity, config.node.network, limits)
        self.decoder = Decoder(config.node.network, limits, allowed_senders=allow)
        # A replay window per admitted peer, opened and closed by `Membership` (Admitted, Evicted).
        self.guard = ReplayGuard(
            window=config.transport.replay_window,
            max_skew_us=int(config.transport.max_clock_skew_s * 1e6),
            max_senders=config.discovery.max_peers,
        )
        self.metrics = Metrics()
        curve = self.identity.curve_keypair() if config.security.curve else None
        self.transport = Transport(
            config.transport, limits.max_frame_bytes, curve, config.limits.max_public_frame_bytes
        )
        self.gate = Gate(config.transport, config.discovery.max_peers, self._is_peer, curve=curve is not None)
        # Who may connect (zap.py); admitted peers' transport keys pass the connection caps.
        self.peer_transport_keys: set[bytes] = set()
        self.connections = Connections(config.security, self.metrics.connections, self.peer_transport_keys.__contains__)
        # The inbound sockets, each in a process of its own, forked by one zygote (ingress.py).
        self.zygote = Zygote()
        self.ingress = self._inbound_sockets(curve)
        self.inbound = Inbound(
            self.ingress, self.decoder, self.guard, self.gate, self.metrics, config.transport, clock_us
        )
        self.membership: Membership | None = None
        self.address: str | None = None  # what peers dial: [node].advertise, or the bound endpoint
        self.peer_port: int | None = None  # of the peers' socket, announced in HELLO
        # The round driver (learning.py) takes the learning payloads here.
        self.on_payload: Callable[[Envelope], None] | None = None
        self.driver: RoundDriver | None = None
        self.metrics_port: int | None = None  # where Prometheus metrics are served, if they are
        self._counter: SequenceCounter | None = None
        self._data_dir: DataDir | None = None
        self._nursery: trio.Nursery | None = None
        self._reserving = False
        self._reserve_retry_at = -math.inf  # no extension of the reservation before this time
        self._refusing_sends = False  # no sequence number is reserved: sends are refused
        self._stop = trio.Event()
        self._maintain_at = math.inf  # when `_maintain` wakes next; `_wake_maintain` sooner
        self._wake_maintain = trio.Event()
        self._frames_waiting = trio.Event()  # set when a frame waits for a connection (`_send_waiting`)
        self._start_problems: list[str] = []
        self._started_at = 0.0
        self._labels = labels_capability(config.data.class_names if config.data.path else ())
        self._warned_excluded: set[str] = set()  # peers already named as learning otherwise
        # Bootstrap addresses by their entry's number in [discovery].bootstrap: their dials are
        # watched, so that a wrong key in an entry is named as such (`_unreachable`).
        self._bootstrap_entries = {
            address: number for number, (address, _) in enumerate(config.discovery.bootstrap_peers(), start=1)
        }

    def _inbound_sockets(self, curve: tuple[bytes, bytes] | None) -> dict[str, Ingress]:
        config, bounds = (
            self.config,
            {PUBLIC: self.config.limits.max_public_frame_bytes, PEERS: self.decoder.limits.max_frame_bytes},
        )
        return {
            name: Ingress(
                name,
                config.transport,
                bound,
                curve,
                self.connections,
                self.metrics.connections,
                config.log.level,
                self.zygote,
            )
            for name, bound in bounds.items()
        }

    # --- lifecycle -----------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def round(self) -> int:
        """The learning round in progress (0 for a node that does not learn): frames carry it."""
        return 0 if self.driver is None else self.driver.round

    def _cannot_start(self, problem: str) -> None:
        """Record why the node cannot do its job and stop it; `run` raises once all has stopped."""
        log.error("%s", problem)
        self._start_problems.append(problem)
        self.request_stop()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run until `request_stop()` or cancellation; raises NodeStartError if it cannot start,
        after undoing whatever it had set up."""
        config = self.config
        with self._locked_data_dir() as data_dir:
            self._counter = self._start_sequence(data_dir)
            try:
                try:
                    endpoint = await self.ingress[PUBLIC].start(config.node.listen)
                    peers_endpoint = await self.ingress[PEERS].start(
                        config.node.peer_listen or _any_port(config.node.listen)
                    )
                except BindError as exc:
                    setting = "listen" if exc.socket == PUBLIC else "peer_listen"
                    raise NodeStartError(f"[node].{setting}: {exc}") from None
                self.address = config.node.advertise or endpoint
                self.peer_port = config.node.peer_advertise_port or int(peers_endpoint.rsplit(":", 1)[1])
                self._started_at = trio.current_time()
                self.membership = Membership(
                    self.identity.public_key, config.discovery, rng=self.rng, now=self._started_at
                )
                self.membership.set_own_hello(self._hello_frame())
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    for ingress in self.ingress.values():
                        nursery.start_soon(ingress.supervise)
                    if await self._start_services(nursery):
                        nursery.start_soon(self.inbound.run, self._handle)
                        nursery.start_soon(self._maintain)
                        nursery.start_soon(self._send_waiting)
                        if config.beacon.enabled:
                            nursery.start_soon(self._beacon)
                        if config.algorithm.name != "none":
                            nursery.start_soon(self._learn, data_dir)
                        log.info(
                            "node %s listening on %s (peers' socket %s), advertising %s",
                            self.identity.node_id,
                            endpoint,
                            peers_endpoint,
                            self.address,
                        )
                        task_status.started(self)
                    await self._stop.wait()
                    nursery.cancel_scope.cancel()
                if self._start_problems:
                    raise NodeStartError(*self._start_problems)
            finally:
                self._nursery = None
                with trio.CancelScope(shield=True):
                    if self.membership is not None and self.address is not None:
                        self._execute(self.membership.goodbye())
                    await self.transport.close()
                    for ingress in self.ingress.values():
                        await ingress.close()
                    await self.zygote.close()
                log.info("node %s stopped", self.identity.node_id)

    async def _start_services(self, nursery: trio.Nursery) -> bool:
        """The local endpoints: the control socket and, if configured, Prometheus metrics.
        False if one could not open (recorded with `_cannot_start`)."""
        config = self.config
        started = True
        try:
            await nursery.start(
                partial(serve_control, max_request_bytes=control_request_bytes(config.node)),
                config.control_socket,
                self._control,
            )
        except OSError as exc:
            path = config.control_socket
            problem = f"[node].data_dir: cannot open the control socket {path}: {describe_os_error(exc)}"
            self._cannot_start(problem + ", or point [node].data_dir elsewhere")
            started = False
        if config.metrics.host_port is not None:
            from .operations.prometheus import render_for, serve_prometheus  # 3 MB of imports that only this needs

            render = render_for(self.metrics, self._peer_count, lambda: self.driver)
            try:
                self.metrics_port = await nursery.start(
                    serve_prometheus, config.metrics, render, self.metrics.metrics_connections_closed
                )
            except OSError as exc:
                listen = config.metrics.listen
                self._cannot_start(f"[metrics].listen: cannot listen on {listen}: {exc.strerror or exc}")
                started = False
        return started

    def _is_peer(self, key: bytes) -> bool:
        return self.membership is not None and key in self.membership.peers

    def _peer_count(self) -> int:
        return 0 if self.membership is None else len(self.membership.peers)

    @contextlib.contextmanager
    def _locked_data_dir(self):
        try:
            data_dir = DataDir(self.config.node.data_dir).__enter__()
        except DataDirError as exc:
            raise _data_dir_problem(exc) from None
        self._data_dir = data_dir
        try:
            yield data_dir
        finally:
            self._data_dir = None
            data_dir.__exit__(None, None, None)

    def _start_sequence(self, data_dir: DataDir) -> SequenceCounter:
        try:
            state = data_dir.load_state()
            persisted = state.get("seq_reserved", 0)
            if type(persisted) is not int or persisted < 0:
                raise DataDirError(f"state file holds an invalid seq_reserved {persisted!r}")
            counter = SequenceCounter(persisted=persisted, now_us=self.clock_us())
            self._persist_reservation(counter)  # before the first frame goes out
        except DataDirError as exc:
            raise _data_dir_problem(exc) from None
        return counter

    def _persist_reservation(self, counter: SequenceCounter) -> None:
        assert self._data_dir is not None
        limit = counter.propose_reservation()
        state = self._data_dir.load_state()
        state["seq_reserved"] = limit
        self._data_dir.save_state(state)
        counter.confirm_reservation(limit)

    def _extend_reservation_soon(self) -> None:
        """Persist a new block of sequence numbers in the background, unless an attempt is
        under way or one failed a moment ago."""
        if self._reserving or self._nursery is None or trio.current_time() < self._reserve_retry_at:
            return
        self._reserving = True
        self._nursery.start_soon(self._extend_reservation)

    async def _extend_reservation(self) -> None:
        try:
            await trio.to_thread.run_sync(self._persist_reservation, self._counter)
        except DataDirError as exc:
            # The numbers already reserved are still used; none beyond them, so none repeats.
            self.metrics.state_write_failures += 1
            self._reserve_retry_at = trio.current_time() + RESERVATION_RETRY_S
            log.error(
                "[node].data_dir: the sequence reservation was not extended: %s; the node signs with "
                "the numbers still reserved, then refuses to send until it is saved (retried every %g s)",
                exc,
                RESERVATION_RETRY_S,
            )
        else:
            if self._refusing_sends:
                log.warning("the sequence reservation is saved again: sending resumes")
            self._refusing_sends = False
        finally:
            self._reserving = False

    # --- sending -------------------------------------------------------------------------

    def _next_seq(self, body: Body) -> int | None:
        """The next sequence number, or None (counted, and logged once) while none is reserved."""
        counter = self._counter
        assert counter is not None
        if counter.needs_reservation:  # an exhausted counter too: that is how sending resumes
            self._extend_reservation_soon()
        try:
            return counter.next()
        except SequenceExhausted as exc:
            self.metrics.send_refused[body.TYPE] += 1
            if not self._refusing_sends:
                self._refusing_sends = True
                log.error(
                    "not sending %s, nor anything else until the sequence reservation is saved in "
                    "[node].data_dir: %s; refused sends are counted as send_refused",
                    body.TYPE.value,
                    exc,
                )
            return None

    def _encode(self, body: Body) -> bytes | None:
        seq = self._next_seq(body)
        if seq is None:
            return None
        return self.encoder.encode(body, seq=seq, timestamp_us=self.clock_us(), round=self.round)

    def send(self, addresses: tuple[str, ...], body: Body) -> int:
        """Sign `body` once and queue it for each address; returns how many took it."""
        frame = self._encode(body)
        return 0 if frame is None else self._send_frame(addresses, body, frame)

    async def send_payload(self, addresses: tuple[str, ...], body: Body, round: int | None = None) -> int | None:
        """As `send`, but a large payload is signed in a worker thread (signing.py), so a model
        of many megabytes does not stall the event loop. The frame is tagged with `round`
        (default: the round in progress); returns its seq, or None if none was left to sign with."""
        seq = self._next_seq(body)
        if seq is None:
            return None
        frame = await signing.encode(
            self.encoder,
            body,
            seq=seq,
            timestamp_us=self.clock_us(),
            round=self.round if round is None else round,
            threshold=self.config.transport.sign_in_thread_bytes,
        )
        self._send_frame(addresses, body, frame)
        return seq

    def _send_frame(self, addresses: tuple[str, ...], body: Body, frame: bytes) -> int:
        kind = body.TYPE
        sent = (kind, len(frame), body.payload_bytes())  # counted once it is out
        delivered = 0
        public = kind is MessageType.HELLO  # transport.send: read even where this node is no peer
        for address in addresses:
            outcome = self.transport.send(address, frame, public=public, tag=sent)
            if outcome is DROPPED:
                self.metrics.send_dropped[kind] += 1
                continue
            delivered += 1
            if outcome is SENT:
                self.metrics.sent(*sent)
            else:
                self._frames_waiting.set()
        return delivered

    async def _send_waiting(self) -> None:
        """Send the frames that wait for a peers' connection still opening (transport.py) once
        it is up, and count them when they go out or are given up."""
        while True:
            await self._frames_waiting.wait()
            self._frames_waiting = trio.Event()
            while True:
                await trio.sleep(WAITING_POLL_S)
                sent, given_up = self.transport.send_waiting()
                for counts in sent:
                    self.metrics.sent(*counts)
                for kind, _, _ in given_up:
                    self.metrics.send_dropped[kind] += 1
                if not self.transport.waiting:
                    break

    def _capabilities(self) -> tuple[str, ...]:
        """What HELLO announces: the configured tokens, the algorithm this node learns with and,
        with its own data, the fingerprint of its class list."""
        algorithm = self.config.algorithm.name
        own = () if algorithm == "none" else (learning_capability(algorithm), *self._labels)
        return tuple(dict.fromkeys((*self.config.node.capabilities, *own)))

    def _learning_peers(self) -> dict[str, str]:
        """The peers to send learning payloads to and wait for: ready ones (they admitted this
        node) that learn with the same algorithm over the same classes. The others are named in
        the log, once each (`_excluded_peers`)."""
        self._excluded_peers()
        return {
            peer.node_id: peer.address
            for peer in self.membership.ready()
            if learning_verdict(self.config.algorithm.name, self._labels, peer.capabilities) is None
        }

    def _excluded_peers(self) -> dict[str, str]:
        """Ready peers that are not learning peers, each with why (`status` shows them); a peer
        that learns otherwise is named in a warning, once."""
        excluded = {}
        for peer in self.membership.ready():
            why = learning_verdict(self.config.algorithm.name, self._labels, peer.capabilities)
            if why is None:
                continue
            excluded[peer.node_id] = why
            if why.startswith("runs no") or peer.node_id in self._warned_excluded:
                continue  # a peer that only relays is no surprise
            if len(self._warned_excluded) >= self.config.discovery.max_peers:
                self._warned_excluded.clear()  # bounded: at worst a warning is repeated
            self._warned_excluded.add(peer.node_id)
            names = self.config.data.class_names
            hint = (
                f"; this node's [data].class_names: {class_list_text(names)} (every node of a network lists the "
                "same names in the same order; each node logs its class list's labels: at start)"
                if why.startswith("learns over other classes")
                else " ([algorithm].name and [data] must agree on every node that learns together)"
            )
            log.warning("peer %s is not a learning peer: it %s%s", peer.node_id, why, hint)
        return excluded

    def _hello_body(self) -> Hello:
        return Hello(
            address=self.address,
            capabilities=self._capabilities(),
            dataset_size=0,
            protocol_versions=(PROTOCOL_VERSION,),
            peer_port=self.peer_port,
        )

    def _hello_frame(self) -> bytes | None:
        """A freshly signed HELLO; None while no sequence number is reserved."""
        return self._encode(self._hello_body())

    def _execute(self, actions: list[Action]) -> None:
        membership = self.membership
        # Where a HELLO was just dropped (the connection is not up yet, IMMEDIATE=1): the frames
        # that follow it in this batch are not sent, for the connection may come up in between
        # and a frame other than HELLO would open it and be refused (`handshake_first`). A CURVE
        # handshake, which waits for the other side's ZAP handler, made that window likely.
        unready: set[str] = set()
        for action in actions:
            if isinstance(action, Send):
                addresses = tuple(a for a in action.addresses if a not in unready)
                if addresses:
                    self.send(addresses, action.body)
            elif isinstance(action, SendHello):
                sent = self.send((action.address,), self._hello_body()) == 1
                if not sent:
                    unready.add(action.address)
                self._execute(membership.hello_sent(action.address, sent, trio.current_time()))
            elif isinstance(action, Dial | DialPeers | Hangup):
                self._connect(action)
            else:
                self._membership_changed(action)

    def _connect(self, action: Dial | DialPeers | Hangup) -> None:
        try:
            if isinstance(action, Dial):
                self.transport.dial(action.address, action.key, watch=action.address in self._bootstrap_entries)
            elif isinstance(action, DialPeers):
                self.transport.dial_peers(action.address, action.peers_address)
            else:
                self.transport.hangup(action.address, flush=action.flush)
        except MissingKey as exc:
            self.metrics.connections["dial_refused_no_key"] += 1
            log.warning("%s", exc)
        except TransportError as exc:
            log.warning("%s", exc)

    def _membership_changed(self, action: Admitted | Evicted | Unreachable) -> None:
        peers, max_peers = len(self.membership.peers), self.config.discovery.max_peers
        if isinstance(action, Admitted):
            # Frames it sent before the PONG that admitted it may be parked: checked once each.
            self.guard.trust(action.key, action.seq, unseen_from=self.gate.lowest_parked_seq(action.key))
            self._track_transport_key(action.key, admitted=True)
            log.info("peer %s admitted at %s (%d/%d peers)", node_id(action.key), action.address, peers, max_peers)
        elif isinstance(action, Evicted):
            self.guard.forget(action.key)
            self._track_transport_key(action.key, admitted=False)
            log.info("peer %s evicted (%s; %d/%d peers left)", node_id(action.key), action.why, peers, max_peers)
        elif isinstance(action, Unreachable):
            self._unreachable(action)

    def _unreachable(self, action: Unreachable) -> None:
        """Why a bootstrap entry has not answered, as far as its connection's handshakes tell:
        a node is there with another key (or without CURVE), it refuses this node, or no node
        answers at all."""
        handshakes = self.transport.handshakes_with(action.address)
        entry = f"bootstrap entry {self._bootstrap_entries.get(action.address, '?')}"
        retrying = f"still retrying (next in {action.next_in_s:g} s)"
        extra = {"address": action.address, "attempts": action.attempts, "handshakes": dict(handshakes)}
        if handshakes["failed"] and not handshakes["succeeded"]:
            log.warning(
                "%s: the node at %s has another key (or CURVE off); handshake failed %s in %.1f s; %s "
                "(compare the entry's key with `p2pnode keyinfo` of that node's key, and [security].curve on both)",
                *(entry, action.address, _times(handshakes["failed"]), action.waited_s, retrying),
                extra=extra,
            )
        elif handshakes["refused"] and not handshakes["succeeded"]:
            log.warning(
                "%s: the node at %s refused this node's connection %s in %.1f s (its [security].allowlist "
                "or connection caps); %s",
                *(entry, action.address, _times(handshakes["refused"]), action.waited_s, retrying),
                extra=extra,
            )
        else:
            log.warning(
                "bootstrap %s unreachable: %d challenges unanswered in %.1f s; still retrying (next in %g s; "
                "is a node running there? [discovery].bootstrap)",
                *(action.address, action.attempts, action.waited_s, action.next_in_s),
                extra=extra,
            )

    def _count_handshakes(self) -> None:
        """Read the watched dials' handshakes (often enough that libzmq never waits on them) and
        count the failed and refused ones, which `status` shows."""
        for outcomes in self.transport.handshakes().values():
            for outcome in ("failed", "refused"):
                if outcomes[outcome]:
                    self.metrics.connections[f"dial_handshake_{outcome}"] += outcomes[outcome]

    def _track_transport_key(self, key: bytes, *, admitted: bool) -> None:
        """With CURVE, admitted peers' transport keys pass the connection caps (zap.py)."""
        if not self.config.security.curve:
            return
        try:
            transport_key = curve_public_from_ed25519(key)
        except ValueError:
            return  # no transport key: it cannot connect over CURVE anyway
        if admitted:
            self.peer_transport_keys.add(transport_key)
        else:
            self.peer_transport_keys.discard(transport_key)

    # --- receiving -----------------------------------------------------------------------

    async def _handle(self, envelope: Envelope, frame: bytes, source: str | None) -> str | None:
        membership = self.membership
        now = trio.current_time()
        if envelope.type in DISCOVERY_TYPES:
            relayed = []
            if envelope.type is MessageType.PEERS and envelope.sender in membership.peers:
                relayed = await self._verify_relayed(envelope.body)
            actions, refusal = membership.on_message(envelope, frame, now, self.clock_us(), relayed, source=source)
            self._execute(actions)
            if membership.next_due(now) < self._maintain_at:
                self._wake_maintain.set()  # e.g. a dial opened now, whose challenge is due soon
            return refusal
        if not membership.on_frame(envelope.sender, now):
            return UNKNOWN_PEER  # learning payloads are taken from admitted peers only
        if self.on_payload is None:
            return NOT_LEARNING
        self.on_payload(envelope)
        return None

    async def _verify_relayed(self, peers: Peers) -> list[tuple[Envelope, bytes]]:
        """Check the HELLO frames inside a PEERS in a worker thread; skip those already known
        (our peers' and the passive view's: the same bytes were checked when they came)."""
        known = {peer.hello for peer in self.membership.peers.values()}
        known.update(entry.frame for entry in self.membership.passive.values())
        known.add(self.membership.own_hello)
        fresh = [frame for frame in dict.fromkeys(peers.hellos) if frame not in known]
        if not fresh:
            return []
        results = await trio.to_thread.run_sync(decode_all, self.decoder, fresh, limiter=self.inbound.verify_limiter)
        relayed = []
        for frame, result in zip(fresh, results, strict=True):
            if isinstance(result, ProtocolError):
                self.metrics.rejected(f"relayed_{result.reason.value}", len(frame))
            elif result.type is not MessageType.HELLO:
                self.metrics.rejected("relayed_not_hello", len(frame))
            else:
                relayed.append((result, frame))
        return relayed

    # --- learning ------------------------------------------------------------------------

    async def _learn(self, data_dir: DataDir) -> None:
        """Drive the rounds (learning.py); the node keeps serving afterwards. The driver exists
        before the algorithm is built, so what faster peers send meanwhile is queued."""
        network = Network(
            peers=self._learning_peers,
            send=self.send_payload,
            rejected=self.metrics.rejected,
            sent=self.metrics.learning_sent,
            discovery_sent=self.metrics.discovery_sent,
        )
        self.driver = RoundDriver(
            self.config.algorithm,
            network,
            data_dir.path / CHECKPOINT_NAME,
            data_dir.path / HISTORY_NAME,
            self.config.node.step_slowdown,
        )
        self.on_payload = self.driver.on_payload
        try:
            await self.driver.run(self.build_algorithm)
        except LearningSetupError as exc:
            self._cannot_start(str(exc))

    def build_algorithm(self) -> Algorithm:
        """The node's algorithm over its data and model (slow: the round driver runs it in a
        worker thread). A rehearsal's Byzantine node (testnet/byzantine.py) wraps it."""
        return build_algorithm(self.config, self.identity.node_id)

    # --- periodic work -------------------------------------------------------------------

    async def _maintain(self) -> None:
        """Discovery's timed work (Membership.tick), HELLO refresh and heap trimming. It sleeps
        until Membership says work is due, at most MAINTAIN_MAX_SLEEP_S, and is woken sooner
        when a message brings work due earlier: idle, it costs a few wake-ups a second (each
        one about 0.3 ms of CPU: at 20 a second it was 1 % of a core per idle daemon)."""
        discovery = self.config.discovery
        next_refresh = trio.current_time() + discovery.hello_refresh_s
        next_trim, trimmed_at_bytes = 0.0, 0
        while True:
            now = trio.current_time()
            inbound_bytes = self.metrics.inbound_bytes()
            if now >= next_trim and inbound_bytes - trimmed_at_bytes >= TRIM_AFTER_BYTES:
                # Frames taken in (a flood too) leave freed pages in the heap: give them back.
                trim_now()
                next_trim, trimmed_at_bytes = now + TRIM_INTERVAL_S, inbound_bytes
            if now >= next_refresh:
                hello = self._hello_frame()
                if hello is not None:
                    self.membership.set_own_hello(hello)
                    next_refresh = now + discovery.hello_refresh_s
                else:  # no sequence number reserved: the old HELLO serves a while longer
                    next_refresh = now + RESERVATION_RETRY_S
            self._count_handshakes()
            self._execute(self.membership.tick(now))
            due = self.membership.next_due(trio.current_time())
            self._maintain_at = min(due, now + MAINTAIN_MAX_SLEEP_S, next_refresh)
            self._wake_maintain = trio.Event()
            with trio.move_on_at(self._maintain_at):
                await self._wake_maintain.wait()

    async def _beacon(self) -> None:
        async def heard(datagram: bytes) -> None:
            (result,) = await trio.to_thread.run_sync(
                decode_all, self.decoder, [datagram], limiter=self.inbound.verify_limiter
            )
            if isinstance(result, ProtocolError):
                self.metrics.rejected(f"beacon_{result.reason.value}", len(datagram))
            elif result.type is MessageType.HELLO:
                self._execute(self.membership.on_announced(result, datagram, trio.current_time(), self.clock_us()))

        def send_failed() -> None:
            self.metrics.beacon_sends_failed += 1

        limit = self.config.limits.limits().max_frame_bytes_for(MessageType.HELLO)
        await run_beacon(self.config.beacon, limit, self._hello_frame, heard, self.metrics.rejected, send_failed)

    # --- status and control --------------------------------------------------------------

    def status(self) -> dict:
        now = trio.current_time()
        membership = self.membership
        return {
            "node_id": self.identity.node_id,
            "public_key": self.identity.public_key.hex(),
            "network": self.config.node.network,
            "address": self.address,
            "listen": self.ingress[PUBLIC].endpoint,
            "peers_listen": self.ingress[PEERS].endpoint,
            "peer_port": self.peer_port,
            "pid": os.getpid(),
            "uptime_s": round(now - self._started_at, 3),
            "round": self.round,
            "peer_count": len(membership.peers),
            "max_peers": self.config.discovery.max_peers,
            "active_view": membership.target,  # the peers it seeks
            "passive_count": len(membership.passive),
            "peers": membership.snapshot(now),
            "dialing": sorted(membership.dialing),
            "membership": dict(sorted(membership.counts.items())),
            "traffic": self.metrics.snapshot(),
            "learning": None if self.driver is None else {**self.driver.status(), "excluded": self._excluded_peers()},
            "metrics_port": self.metrics_port,
            "state_write_failures": self.metrics.state_write_failures,
            "ingress": {name: ingress.status() for name, ingress in self.ingress.items()},
            **process_memory(),  # rss_mb, peak_rss_mb
            "cpu_s": round(time.process_time(), 3),  # user + system, all threads, since it started
        }

    async def _control(self, request: dict) -> dict:
        command = request.get("command")
        if command == "status":
            return {"ok": True, "status": self.status()}
        if command == "stop":
            log.info("stop requested through the control socket")
            self.request_stop()
            return {"ok": True}
        if command == PREDICT:
            return await answer_predict(request, self.driver, self.config)
        return {"ok": False, "error": f"unknown command {command!r} (known: status, stop, {PREDICT})"}
