"""The daemon: one node's lifecycle, and the glue between its parts.

    Node.run: lock the data directory ─► reserve sequence numbers (wire/sequence.py) ─► bind
              ─► serve control ─► receive (wire/inbound/) / maintain peers (peers.py) / beacon
              ─► BYE, close

The node owns all I/O and time; discovery decisions come from `Membership` as actions, which
discovery/membership_actions.py carries out; learning payloads go to the round driver (learning/driver.py)
through `on_payload`, and the driver reaches the network only through the narrow handles of
`Network`, its learning peers chosen by learning/learning_peers.py. Everything runs in one trio
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
    QUERY_TYPES,
    RELAY_TYPES,
    Body,
    Decoder,
    Dialed,
    Encoder,
    Envelope,
    Hello,
    MessageType,
    ReplayGuard,
)
from protocol.messages import CLIENT_CAPABILITY, RELAY_CAPABILITY

from .config import Config
from .data_dir import DataDir, DataDirError
from .discovery.beacon import run_beacon
from .discovery.hello import capabilities, own_hello
from .discovery.membership_actions import MembershipActions
from .discovery.peers import Membership
from .files import describe_os_error
from .learning.algorithm import LearningSetupError, build_algorithm
from .learning.checkpoint import CHECKPOINT_NAME
from .learning.driver import Network, RoundDriver
from .learning.history import HISTORY_NAME
from .learning.learning_peers import LearningPeers
from .memory import process_memory, trim_now
from .metrics import NOT_LEARNING, UNKNOWN_PEER, Metrics
from .operations.control import serve_control
from .relay.link import RelayLink
from .relay.service import RelayService
from .serving.asking import Asking
from .serving.predict import PREDICT, LiveModel, answer_predict, control_request_bytes
from .wire import sequence, signing
from .wire.gate import Gate
from .wire.inbound.circuits import routes_for
from .wire.inbound.reader import Inbound
from .wire.inbound.routes import open_inbound
from .wire.inbound.supervisor import BindError, Ingress, ingress_fork_server
from .wire.transport import DROPPED, SENT, Transport, TransportError
from .wire.zap import PEERS, PUBLIC, Connections, PeerTransportKeys
from .wire.zmqsetup import CLIENT

if TYPE_CHECKING:
    from pathlib import Path

    from algorithms.interface import Algorithm

__all__ = ["Node", "NodeStartError", "wall_clock_us"]

log = logging.getLogger("p2pnode.node")

# After this many bytes taken in, and at most this often, free heap pages go back (memory.py).
TRIM_AFTER_BYTES = 16 << 20
TRIM_INTERVAL_S = 2.0

# The longest the maintenance task sleeps when discovery has nothing due (Membership.next_due).
MAINTAIN_MAX_SLEEP_S = 1.0
# While frames wait for a peers' connection that is opening, it is tried this often.
WAITING_POLL_S = 0.02
# How long libzmq may take to connect and hand over a dial-back's DIALED before it is dropped.
DIAL_BACK_WITHIN_S = 5.0


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


@contextlib.contextmanager
def _locked_data_dir(path: Path, clock_us: Callable[[], int], metrics: Metrics):
    """The data directory, locked, and the sequence numbers reserved in it (sequence.py)."""
    try:
        data_dir = DataDir(path).__enter__()
    except DataDirError as exc:
        raise _data_dir_problem(exc) from None
    try:
        try:
            reservation = sequence.SequenceReservation(data_dir, clock_us, metrics)
        except DataDirError as exc:
            raise _data_dir_problem(exc) from None
        yield data_dir, reservation
    finally:
        data_dir.__exit__(None, None, None)


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
        self.peer_transport_keys = PeerTransportKeys(config.security.curve)
        self.connections = Connections(config.security, self.metrics.connections, self.peer_transport_keys.__contains__)
        self.peer_transport_keys.on_admitted = lambda key: self.connections.peer_admitted(key, trio.current_time())
        self.ingress_forks = ingress_fork_server()  # forks each inbound socket's process (wire/inbound/)
        self.ingress = self._inbound_sockets(curve)
        self.inbound = Inbound(
            self.ingress, self.decoder, self.guard, self.gate, self.metrics, config.transport, clock_us
        )
        self.relay = RelayService(config.relay, config.node.client_mode)  # reservations and circuits (relay/)
        self.link = RelayLink(self, lambda body: self._sequence.next(body))  # to and from client nodes via relays
        routes = routes_for(self.ingress, self.inbound, config, curve is not None, self._is_peer, self.link)
        self.transport.routes, self.link.circuits, self.inbound.sealing = routes, routes, self.link.sealing
        self.membership: Membership | None = None
        self.membership_actions: MembershipActions | None = None  # carries out membership's actions
        self.address: str | None = None  # what peers dial: [node].advertise, or the bound endpoint
        self.peer_port: int | None = None  # of the peers' socket, announced in HELLO
        self.on_payload: Callable[[Envelope], None] | None = None  # the round driver's intake (learning/)
        self.driver: RoundDriver | None = None
        self.metrics_port: int | None = None  # where Prometheus metrics are served, if they are
        self._sequence: sequence.SequenceReservation | None = None  # reserved while the data dir is locked
        self._hello: Hello | None = None  # this node's HELLO, once it knows its address
        self._stop, self._wake_maintain = trio.Event(), trio.Event()
        self._maintain_at = math.inf  # when `_maintain` wakes next; `_wake_maintain` sooner
        self._frames_waiting = trio.Event()  # set when a frame waits for a connection (`_send_waiting`)
        self._start_problems, self._started_at = [], 0.0
        self.learning_peers = LearningPeers(
            lambda: self.membership.ready(), config.algorithm.name, config.data, config.discovery.max_peers
        )
        self.live_model = LiveModel(lambda: self.driver, config)  # what `predict` answers with
        asking = (self.learning_peers.chosen, self.send_payload, self.live_model, self.metrics.rejected)
        self.asking = Asking(config.node, *asking)  # --ask-peers, and the peers' asks (serving/asking.py)
        # Bootstrap addresses by entry number: a dial there is watched, so a wrong key is named (membership_actions.py).
        self._bootstrap_entries = {
            address: number for number, (address, _) in enumerate(config.discovery.bootstrap_peers(), start=1)
        }

    def _inbound_sockets(self, curve: tuple[bytes, bytes] | None) -> dict[str, Ingress]:
        config, largest = self.config, self.decoder.limits.max_frame_bytes
        bounds = {PUBLIC: config.limits.max_public_frame_bytes, PEERS: largest}
        if config.node.client_mode:
            bounds = {CLIENT: largest}  # it dials out, and reads and sends over what it dialled
        return {
            name: Ingress(
                name,
                config.transport,
                bound,
                curve,
                self.connections,
                self.metrics.connections,
                config.log.level,
                self.ingress_forks,
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
        with _locked_data_dir(config.node.data_dir, self.clock_us, self.metrics) as (data_dir, reservation):
            self._sequence = reservation
            try:
                try:
                    self.address, self.peer_port, listening = await open_inbound(
                        self.ingress, self.identity.public_key, config.node
                    )
                except BindError as exc:
                    setting = "listen" if exc.socket == PUBLIC else "peer_listen"
                    raise NodeStartError(f"[node].{setting}: {exc}") from None
                self._started_at = trio.current_time()
                self._start_membership()
                async with trio.open_nursery() as nursery:
                    reservation.nursery = nursery
                    for ingress in self.ingress.values():
                        nursery.start_soon(ingress.supervise)
                    if await self._start_services(nursery):
                        nursery.start_soon(self.inbound.run, self._handle)
                        nursery.start_soon(self._maintain)
                        nursery.start_soon(self._send_waiting)
                        if config.beacon.enabled and not config.node.client_mode:  # it dials, never dialled
                            nursery.start_soon(self._beacon)
                        if config.algorithm.name != "none":
                            nursery.start_soon(self._learn, data_dir)
                            nursery.start_soon(self.asking.serve)
                        log.info("node %s %s, advertising %s", self.identity.node_id, listening, self.address)
                        task_status.started(self)
                    await self._stop.wait()
                    nursery.cancel_scope.cancel()
                if self._start_problems:
                    raise NodeStartError(*self._start_problems)
            finally:
                reservation.nursery = None
                with trio.CancelScope(shield=True):
                    if self.membership is not None and self.address is not None:
                        self.membership_actions.carry_out(self.membership.goodbye())
                    await self.transport.close()
                    for ingress in self.ingress.values():
                        await ingress.close()
                    await self.ingress_forks.close()
                log.info("node %s stopped", self.identity.node_id)

    def _start_membership(self) -> None:
        """Discovery's state machine (peers.py) and what carries out its actions (membership_actions.py),
        once the node knows the address its HELLO announces."""
        config = self.config
        roles = (CLIENT_CAPABILITY,) * config.node.client_mode + (RELAY_CAPABILITY,) * config.relay.enabled
        announced = capabilities(config.node.capabilities, config.algorithm.name, self.learning_peers.labels, roles)
        self._hello = own_hello(self.address, self.peer_port, announced)
        self.membership = Membership(
            self.identity.public_key,
            config.discovery,
            rng=self.rng,
            now=self._started_at,
            advertised="" if config.node.client_mode else self._hello.address,  # a client asks no dial-back
        )
        self.membership_actions = MembershipActions(
            self.membership,
            self.transport,
            self.send,
            self._hello,
            self.guard,
            self.gate.lowest_parked_seq,
            self.peer_transport_keys,
            self.metrics.connections,
            self._bootstrap_entries,
            self._dial_back,
        )
        self.membership.set_own_hello(self._hello_frame())

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

    # --- sending -------------------------------------------------------------------------

    def _encode(self, body: Body) -> bytes | None:
        seq = self._sequence.next(body)
        if seq is None:
            return None
        return self.encoder.encode(body, seq=seq, timestamp_us=self.clock_us(), round=self.round)

    def _dial_back(self, address: str, key: bytes, nonce: int) -> None:
        """DIALED to `address` on a connection of its own (discovery/dial_back.py): `key` asked."""
        frame = self._encode(Dialed(nonce=nonce, address=address))
        if frame is None:
            return
        try:
            self.transport.send_once(address, key, frame, DIAL_BACK_WITHIN_S)
        except TransportError as exc:
            log.warning("cannot dial %s back: %s", address, exc)
            return
        self.metrics.connections["dial_backs_sent"] += 1

    def send(self, addresses: tuple[str, ...], body: Body) -> int:
        """Sign `body` once and queue it for each address; returns how many took it."""
        frame = self._encode(body)
        return 0 if frame is None else self._send_frame(addresses, body, frame)

    async def send_payload(self, addresses: tuple[str, ...], body: Body, round: int | None = None) -> int | None:
        """As `send`, but a large payload is signed in a worker thread (signing.py), so a model
        of many megabytes does not stall the event loop. The frame is tagged with `round`
        (default: the round in progress); returns its seq, or None if none was left to sign with."""
        seq = self._sequence.next(body)
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

    def _hello_frame(self) -> bytes | None:
        """A freshly signed HELLO; None while no sequence number is reserved."""
        return self._encode(self._hello)

    # --- receiving -----------------------------------------------------------------------

    async def _handle(self, envelope: Envelope, frame: bytes, source: str | None) -> str | None:
        membership = self.membership
        now = trio.current_time()
        if envelope.type in DISCOVERY_TYPES:
            relayed = []
            if envelope.type is MessageType.PEERS and envelope.sender in membership.peers:
                # Our peers' HELLOs and the passive view's were checked when they came.
                known = {peer.hello for peer in membership.peers.values()}
                known.update(entry.frame for entry in membership.passive.values())
                known.add(membership.own_hello)
                relayed = await self.inbound.verify_relayed(envelope.body.hellos, known)
                self.link.announced(envelope.sender, relayed)  # a relay names the client nodes it reaches
            actions, refusal = membership.on_message(envelope, frame, now, self.clock_us(), relayed, source=source)
            self.membership_actions.carry_out(actions)
            if membership.next_due(now) < self._maintain_at:
                self._wake_maintain.set()  # e.g. a dial opened now, whose challenge is due soon
            return refusal
        if not membership.on_frame(envelope.sender, now):
            return UNKNOWN_PEER  # learning payloads and queries are taken from admitted peers only
        if envelope.type in RELAY_TYPES:  # the link's (relay/link.py), never the round driver's
            return await self.link.receive(envelope, self._handle, now)
        if envelope.type in QUERY_TYPES:
            if self.config.algorithm.name == "none":
                return NOT_LEARNING
            if envelope.type is MessageType.ASK:
                return self.asking.on_ask(envelope, now)
            return self.asking.on_answer(envelope, frame)
        if self.on_payload is None:
            return NOT_LEARNING
        self.on_payload(envelope)
        return None

    # --- learning ------------------------------------------------------------------------

    async def _learn(self, data_dir: DataDir) -> None:
        """Drive the rounds (learning/driver.py); the node keeps serving afterwards. The driver exists
        before the algorithm is built, so what faster peers send meanwhile is queued."""
        network = Network(
            peers=self.learning_peers.chosen,
            send=self.send_payload,
            rejected=self.metrics.rejected,
            sent=self.metrics.learning_sent,
            discovery_sent=self.metrics.discovery_sent,
            excluded=self.learning_peers.excluded,
        )
        self.driver = RoundDriver(
            self.config.algorithm,
            network,
            data_dir.path / CHECKPOINT_NAME,
            data_dir.path / HISTORY_NAME,
            self.config.node.slowdown,
        )
        self.on_payload = self.driver.on_payload
        try:
            await self.driver.run(self.build_algorithm)
        except LearningSetupError as exc:
            self._cannot_start(str(exc))

    def build_algorithm(self) -> Algorithm:
        """The node's algorithm over its data and model (slow: the round driver runs it in a
        worker thread). A rehearsal's Byzantine node (testnet/launch/byzantine.py) wraps it."""
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
                    next_refresh = now + sequence.RESERVATION_RETRY_S
            self.membership_actions.count_handshakes()
            self.transport.close_expired(time.monotonic())
            self.membership_actions.carry_out(self.membership.tick(now))
            self.link.tick(now)  # relay places and a client's reservations
            due = self.membership.next_due(trio.current_time())
            self._maintain_at = min(due, now + MAINTAIN_MAX_SLEEP_S, next_refresh)
            self._wake_maintain = trio.Event()
            with trio.move_on_at(self._maintain_at):
                await self._wake_maintain.wait()

    async def _beacon(self) -> None:
        async def heard(datagram: bytes) -> None:
            for hello, frame in await self.inbound.verify_relayed((datagram,), set(), counted_as="beacon"):
                actions = self.membership.on_announced(hello, frame, trio.current_time(), self.clock_us())
                self.membership_actions.carry_out(actions)

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
            "listen": getattr(self.ingress.get(PUBLIC), "endpoint", None),  # a client node binds nothing
            "peers_listen": getattr(self.ingress.get(PEERS), "endpoint", None),
            "client_mode": self.config.node.client_mode,
            "peer_port": self.peer_port,
            "pid": os.getpid(),
            "uptime_s": round(now - self._started_at, 3),
            "round": self.round,
            "peer_count": len(membership.peers),
            "reachability": membership.reachability.describe(self.address),
            "relay": self.relay.status(now),
            "bootstraps": self._bootstraps(),
            "max_peers": self.config.discovery.max_peers,
            "active_view": membership.target,  # the peers it seeks
            "passive_count": len(membership.passive),
            "peers": [
                {**peer, "route": self.transport.routes.route(peer["address"])} for peer in membership.snapshot(now)
            ],
            "dialing": sorted(membership.dialing),
            "membership": dict(sorted(membership.counts.items())),
            "traffic": self.metrics.snapshot(),
            "learning": None
            if self.driver is None
            else {**self.driver.status(), "excluded": self.learning_peers.excluded()},
            "metrics_port": self.metrics_port,
            "state_write_failures": self.metrics.state_write_failures,
            "ingress": {name: ingress.status() for name, ingress in self.ingress.items()},
            **process_memory(),  # rss_mb, peak_rss_mb
            "cpu_s": round(time.process_time(), 3),  # user + system, all threads, since it started
        }

    def _bootstraps(self) -> list[dict]:
        """Each bootstrap entry: admitted (a peer at its address), and its dial's handshakes."""
        admitted = {peer.address for peer in self.membership.peers.values()}
        return [
            {
                "entry": number,
                "address": address,
                "admitted": address in admitted,
                "handshakes": dict(self.transport.handshakes_with(address)),
            }
            for address, number in self._bootstrap_entries.items()
        ]

    async def _control(self, request: dict) -> dict:
        command = request.get("command")
        if command == "status":
            return {"ok": True, "status": self.status()}
        if command == "stop":
            log.info("stop requested through the control socket")
            self.request_stop()
            return {"ok": True, "pid": os.getpid()}  # `p2pnode stop` waits for this process to end
        if command == PREDICT:
            return await answer_predict(request, self.live_model, self.asking.ask_about)
        return {"ok": False, "error": f"unknown command {command!r} (known: status, stop, {PREDICT})"}
