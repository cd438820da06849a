"""The supervisor of each inbound socket's process: each of the node's inbound sockets lives in a
child process of its own, so that libzmq aborting there does not stop the node.

Why: libzmq 4.3 (every release, and master as of 2026) aborts its whole process on
`Assertion failed: !_io_error (stream_engine_base.cpp)` when a connection's engine has stopped
reading because the connection's queue was full, the connection is then reset, and once the
queue drains the engine decodes a ZMTP PING it had already read and answers it
(`zmtp_engine_t::process_heartbeat_message` calls `out_event` whatever `_io_error` says). Any
client can arrange that in a tenth of a second (`tools/attack.py --kind stall-reset`), with
CURVE as without (any key completes a handshake on the public socket), and no socket option
closes it: a bounded queue can always be filled, and an unbounded one (RCVHWM 0, the only
setting under which the engine never stops reading) hands the bound on the bytes libzmq holds
back to a flooder. docs/security.md has the measurements.

So each ROUTER (the public socket, where strangers connect; the peers' socket, which with CURVE
only admitted peers reach), with its monitor, ZAP domain and bound on what libzmq holds
(buffers.py), runs in an ingress process of its own (process.py); everything that decides stays
here. The node asks it for batches of frames (pipes.py), paced as before (../gate.py), answers
its ZAP requests (../zap.py `Connections`) and follows its connection events. Processes are
forked by the node's fork server (`ingress_fork_server`: p2pnode/forkserver.py running
`python -m p2pnode.wire.inbound.process`), in milliseconds. When one ends for any reason other
than the node stopping it, a new one binds the same endpoint: connections come back as their
dialers reconnect; the peer
table, rounds and model are untouched; the other socket's process is not affected, so a stranger
who aborts the public one costs admitted peers nothing; and the node goes on sending meanwhile
(its DEALERs are its own: a node never reads from them, and without reading libzmq never drains
the queue whose draining the abort needs). Restarts are counted, logged and shown in status, and
back-to-back failures to start are spaced out (`RESTART_BACKOFF_S`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field

import trio
import zmq

from ...forkserver import ForkServerError, TrioForkServer, describe_exit
from ...memory import process_memory
from ..settings import TransportSettings
from ..transport import CURVE_SLACK, TransportError
from ..zap import PUBLIC, Connections
from ..zmqsetup import CLIENT, FAILED_EVENTS
from .pipes import MessagePipe, PipeError, socket_pair
from .sends import OUTBOUND_SLACK, SEND_GONE

__all__ = ["Ingress", "BindError", "RelayedFrame", "PROCESS_MODULE", "ingress_fork_server"]

log = logging.getLogger("p2pnode.ingress")

RESTART_BACKOFF_S = (0.0, 0.1, 0.5, 1.0, 2.0)  # before the n-th start in a row that fails
STOP_WAIT_S = 2.0  # for the process to leave once its control pipe closes, then it is killed
_PIPE_SLACK = 1 << 16  # msgpack and routing data around a batch's frames
EXITS_KEPT = 16  # recent exits shown in status
# How an attack ends an ingress process: libzmq's failed assertion (its allocations past
# `DataLimit` too), or Python's MemoryError past it (process.py OUT_OF_MEMORY).
_ABORTED = ("signal SIGABRT", "exit code 3")
PROCESS_MODULE = "p2pnode.wire.inbound.process"  # the fork server of ingress processes, and their code


def ingress_fork_server() -> TrioForkServer:
    """What forks a node's ingress processes: one server per node, shared by its two sockets,
    started with the first of them."""
    return TrioForkServer(PROCESS_MODULE)


class BindError(TransportError):
    """An inbound socket could not bind; `socket` says which (PUBLIC or PEERS)."""

    def __init__(self, message: str, socket: str) -> None:
        super().__init__(message)
        self.socket = socket


class RelayedFrame:
    """A frame read by the ingress process, with the metadata of its connection: what the gate
    and reader.py use of a zmq.Frame (`bytes`, `buffer`, `get`, `len`)."""

    __slots__ = ("_metadata", "bytes")

    def __init__(self, data: bytes, metadata: dict[str, str]) -> None:
        self.bytes = data
        self._metadata = metadata

    @property
    def buffer(self) -> memoryview:
        return memoryview(self.bytes)

    def get(self, name: str) -> str | None:
        return self._metadata.get(name)

    def __len__(self) -> int:
        return len(self.bytes)


class _Part:
    """A further part of a multipart message: only its length crosses (the node refuses those)."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


# Counted, beside sends.py's: the node queued `send_hwm` frames for that connection already, or
# `routed_bound()` bytes for the process in all; a frame over the socket's frame bound.
SEND_QUEUE_FULL, SEND_TOO_LARGE = "routed_send_queue_full", "routed_send_too_large"


class _Waiting:
    """The frames the node has queued for an ingress process and it has not taken yet: how many
    per connection (routing id) and how many bytes in all."""

    def __init__(self) -> None:
        self.by: Counter[bytes] = Counter()
        self.bytes = 0

    def admit(self, routing_id: bytes, size: int, per_connection: int, in_all: int) -> bool:
        """Count one more frame of `size` bytes for `routing_id`, if both bounds allow it."""
        if self.by[routing_id] >= per_connection or self.bytes + size > in_all:
            return False
        self.by[routing_id] += 1
        self.bytes += size
        return True

    def left(self, routing_id: bytes, size: int) -> None:
        self.bytes -= size
        self.by[routing_id] -= 1
        if self.by[routing_id] <= 0:
            del self.by[routing_id]


@dataclass
class _Child:
    pid: int
    control: MessagePipe
    frames: MessagePipe
    outbound: MessagePipe
    generation: int = 0  # set when it binds
    gone: trio.Event = field(default_factory=trio.Event)


class Ingress:
    """One inbound socket (PUBLIC or PEERS), in its process: `start` binds, `supervise` keeps it
    up, `receive` takes frames, `reply` sends over a connection a frame came on, `close` ends
    it. CLIENT, a node nobody can dial (issue #46), binds nothing: `connect` dials, and `send`
    sends over a connection it dialled."""

    def __init__(
        self,
        name: str,
        settings: TransportSettings,
        max_frame_bytes: int,
        curve: tuple[bytes, bytes] | None,
        connections: Connections,
        counts: Counter[str],
        log_level: str = "INFO",
        forks: TrioForkServer | None = None,
    ) -> None:
        """`max_frame_bytes`: the socket's frame bound; `counts`: Metrics.connections, where
        connection events and refusals are counted; `forks`: what forks its processes (the
        node's `ingress_fork_server`, shared by both sockets; default: one of its own, ended
        with it)."""
        self.name, self.settings, self.max_frame_bytes, self.curve = name, settings, max_frame_bytes, curve
        self.connections, self.counts, self.log_level = connections, counts, log_level
        self.endpoint: str | None = None
        self.messages_read = 0  # each counted by the node as taken or refused
        self.restarts = 0
        self.exits: list[dict] = []  # the latest ones: when, how (exit code or signal), how long it was up
        self._child: _Child | None = None
        self.forks, self._own_forks = forks or ingress_fork_server(), forks is None
        self._up = trio.Event()
        self._generation = 0
        self.dials: dict[str, tuple[bytes, bytes | None]] = {}  # CLIENT: endpoint -> routing id, server key
        self._server_keys: dict[bytes, str] = {}  # CLIENT, with CURVE: routing id -> server key (hex)
        self.connected: set[str] = set()  # CLIENT: the endpoints whose connection is up (handshake done)
        # In order, for the process: (generation, or None for any; [kind, *arguments]). Bounded per
        # connection, not in all: a relay's frames for one client (a round's payloads of every other
        # client at once) must not be dropped because its other connections keep the process busy
        # (a stranger's many keys being pinged: 80 RELAYED lost so, tools/bench/nat_fleet.py).
        self._to_send, self._outbound = trio.open_memory_channel[tuple[int | None, list]](math.inf)
        self._waiting = _Waiting()

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self, endpoint: str | None) -> str | None:
        """Start the process and bind; returns the endpoint bound (a port 0 chosen). Raises
        BindError if it cannot bind (the process is gone again then). CLIENT: None, nothing bound."""
        try:
            child = await self._spawn()
        except ForkServerError as exc:
            raise BindError(str(exc), self.name) from None
        self._child = await self._bind(child, endpoint)
        self.connections.socket_up(self.name, trio.current_time())
        self._up.set()
        return self.endpoint

    async def supervise(self) -> None:
        """Relay the process's events and ZAP requests; when it ends, start another on the same
        endpoint, forked at once. Runs until cancelled."""
        failures = 0
        while True:
            if self._child is None:
                await trio.sleep(RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)])
                try:
                    self._child = await self._bind(await self._spawn(), self.endpoint)
                except (BindError, OSError) as exc:
                    failures += 1
                    log.error(
                        "the %s socket's ingress process could not start again (try %d): %s", self.name, failures, exc
                    )
                    continue
                failures = 0
                self.connections.socket_up(self.name, trio.current_time())
                self._up.set()
                log.warning("the %s socket's ingress process is back on %s", self.name, self.endpoint)
            child = self._child
            started = time.monotonic()
            await self._relay(child)
            self._up = trio.Event()
            self._child = None
            self.connected.clear()
            how = await self._end(child)  # its pipes broke: it has ended, or is ended now
            banned = self.connections.forget_all(self.name, trio.current_time(), aborted=how in _ABORTED)
            if banned:
                log.warning(
                    "refusing %s for %.0f s: connected just before each of the aborts",
                    ", ".join(banned),
                    self.connections.settings.abort_ban_s,
                )
            child.gone.set()
            self.restarts += 1
            self.exits = [*self.exits, {"at": time.time(), "how": how, "up_s": round(time.monotonic() - started, 3)}][
                -EXITS_KEPT:
            ]
            log.error(
                "the %s socket's ingress process ended (%s): starting another; peers and rounds go on", self.name, how
            )

    async def close(self) -> None:
        """End the process (it leaves once its control pipe closes), and the fork server if it is its own."""
        child, self._child = self._child, None
        with trio.CancelScope(shield=True):
            if child is not None:
                await self._end(child)
                child.gone.set()
            if self._own_forks:
                await self.forks.close()

    # --- frames ------------------------------------------------------------------------------

    def reply(self, routing_id: bytes, frame: bytes) -> bool:
        """Send `frame` over the connection a frame came on with `routing_id` (as `receive`
        gave it), never waiting; False if it is dropped here: that connection's process has
        ended, or `send_hwm` frames wait for the process (counted). The process may drop it
        too (sends.py: counted there)."""
        generation, routing_id = int.from_bytes(routing_id[:4], "big"), routing_id[4:]
        if self._child is None or self._child.generation != generation:
            self.counts[SEND_GONE] += 1
            return False
        return self._send(generation, routing_id, frame)

    def send(self, routing_id: bytes, frame: bytes) -> bool:
        """CLIENT: `frame` over the connection `connect` named `routing_id`, as `reply`."""
        return self._send(None, routing_id, frame)

    def _send(self, generation: int | None, routing_id: bytes, frame: bytes) -> bool:
        if len(frame) > self.max_frame_bytes:  # the public socket sends handshakes, not models
            self.counts[SEND_TOO_LARGE] += 1
            return False
        if not self._waiting.admit(routing_id, len(frame), self.settings.send_hwm, self.routed_bound()):
            self.counts[SEND_QUEUE_FULL] += 1
            return False
        self._queue(generation, ["send", routing_id, frame])
        return True

    def connect(self, endpoint: str, routing_id: bytes, server_key: bytes | None = None) -> None:
        """CLIENT: dial `endpoint` (with CURVE, where the X25519 `server_key` is expected), its
        connection named `routing_id`; dialled again by every later process."""
        self.dials[endpoint] = (routing_id, server_key)
        if server_key is not None:  # CURVE proved it: what the gate takes a frame's User-Id for
            self._server_keys[routing_id] = server_key.hex()
        self._queue(None, ["connect", endpoint, routing_id, server_key])

    def disconnect(self, endpoint: str) -> None:
        routing_id, _ = self.dials.get(endpoint, (None, None))
        self._server_keys.pop(routing_id, None)
        if self.dials.pop(endpoint, None) is not None:
            self._queue(None, ["disconnect", endpoint])

    def _follow_dial(self, event: int, endpoint: str) -> None:
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.connected.add(endpoint)
        elif event == zmq.EVENT_DISCONNECTED or event in FAILED_EVENTS:
            self.connected.discard(endpoint)

    def _queue(self, generation: int | None, action: list) -> None:
        """For the process, in order: the channel is unbounded, its frames bounded by `_send`
        (dials and hang-ups are few and small)."""
        self._to_send.send_nowait((generation, action))

    async def _pump(self, child: _Child) -> None:
        """What the node queued for the process, to it, in order; a reply meant for an earlier
        process is dropped (counted)."""
        try:
            while True:
                generation, action = await self._outbound.receive()
                try:
                    if generation is not None and generation != child.generation:
                        self.counts[SEND_GONE] += 1
                        continue
                    await child.outbound.send(action)
                finally:
                    if action[0] == "send":  # it waits no more: gone to the process, or dropped
                        self._waiting.left(action[1], len(action[2]))
        except (PipeError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # it has ended: supervise() starts the next one

    async def receive(self, max_messages: int, max_bytes: int) -> list[list]:
        """Wait for inbound messages; each is [routing id (bytes), frame (RelayedFrame),
        ...further parts]. Routing ids carry the process's generation: a connection of an earlier
        process never shares one with a later one's."""
        while True:
            child = self._child
            if child is None:
                await self._up.wait()
                continue
            try:
                await child.frames.send([max_messages, max_bytes])
                relayed = await child.frames.receive()
            except (PipeError, trio.BrokenResourceError, trio.ClosedResourceError):
                await child.gone.wait()  # supervise() starts the next one
                continue
            return self._unpack(relayed, child.generation)

    def _unpack(self, relayed: list, generation: int) -> list[list]:
        prefix = generation.to_bytes(4, "big")
        batch = []
        for routing_id, data, address, user_id, more in relayed:
            metadata = {"Peer-Address": address}
            user_id = user_id or self._server_keys.get(routing_id)  # a client's: the key it dialled
            if user_id is not None:
                metadata["User-Id"] = user_id
            batch.append([prefix + routing_id, RelayedFrame(data, metadata), *(_Part(size) for size in more)])
        self.messages_read += len(batch)
        return batch

    def status(self) -> dict:
        """For `p2pnode status`: the process now, and how often and how it ended before."""
        pid = self.pid
        memory = process_memory(f"/proc/{pid}/status") if pid is not None else {"rss_mb": None, "peak_rss_mb": None}
        return {"pid": pid, "up": pid is not None, "restarts": self.restarts, "exits": list(self.exits), **memory}

    @property
    def pid(self) -> int | None:
        """The process's id while one runs."""
        return None if self._child is None else self._child.pid

    # --- the process ---------------------------------------------------------------------

    async def _spawn(self) -> _Child:
        """A new ingress process (forked by the fork server), waiting for its setup."""
        pairs = [socket_pair() for _ in ("control", "frames", "outbound")]
        try:
            pid = await self.forks.fork({}, [pair[1].detach() for pair in pairs])
        except ForkServerError:
            for ours, _ in pairs:
                ours.close()
            raise
        return _Child(pid, *(MessagePipe(ours, 1 << 20) for ours, _ in pairs))

    async def _end(self, child: _Child) -> str:
        """Close its pipes (it leaves once they close) and wait for it, at most STOP_WAIT_S
        before it is killed; how it ended, in words."""
        with trio.CancelScope(shield=True):
            await _close_pipes(child)
            return describe_exit(await self.forks.wait(child.pid, STOP_WAIT_S))

    def data_limit_bytes(self) -> int:
        """The hard bound beyond buffers.py's soft one (process.py `DataLimit`, which
        adds PER_CONNECTION_BYTES per live connection): room for what it lets through, and for
        the largest frame and a batch of them in flight to the node."""
        bound = self.buffered_bound()
        return bound + bound // 2 + 2 * (self.max_frame_bytes + self.settings.verify_batch_bytes) + self.routed_bound()

    def buffered_bound(self) -> int:
        """What ZeroMQ may hold for this socket before buffers.py sheds connections."""
        s = self.settings
        return s.max_public_buffered_bytes if self.name == PUBLIC else s.max_peers_buffered_bytes  # CLIENT: models

    def routed_bound(self) -> int:
        """What the process may hold to send (sends.py): on the public socket, which sends
        handshakes only, a quarter of what it may hold received."""
        bound = self.settings.max_routed_send_bytes
        return min(bound, self.settings.max_public_buffered_bytes // 4) if self.name == PUBLIC else bound

    def _setup(self, endpoint: str | None) -> dict:
        s, public = self.settings, self.name == PUBLIC
        return {
            "name": self.name,
            "endpoint": endpoint,
            "max_message_bytes": self.max_frame_bytes + CURVE_SLACK,
            "recv_hwm": s.public_recv_hwm if public else s.recv_hwm,
            "send_hwm": s.send_hwm,
            "redial_s": s.redial_s,
            "redial_max_s": s.redial_max_s,
            "max_routed_send_bytes": self.routed_bound(),
            "max_routed_send_bytes_per_connection": s.max_routed_send_bytes_per_connection,
            "max_buffered_bytes": self.buffered_bound(),
            "data_limit_bytes": self.data_limit_bytes(),
            "curve": list(self.curve) if self.curve is not None else None,
            "handshake_ivl_ms": s.handshake_ivl_ms,
            "silent_s": self.connections.settings.silent_s,
            "keepalive_s": s.keepalive_s,
            "buffer_check_ms": s.buffer_check_ms,
            "growth_check_ms": s.growth_check_ms,
            "log_level": self.log_level.upper(),
        }

    async def _bind(self, child: _Child, endpoint: str | None) -> _Child:
        """Set `child` up on `endpoint`; raises BindError (the process gone again) if it
        cannot bind or ends first."""
        self._generation += 1
        child.generation = self._generation
        child.frames.max_bytes = self.settings.verify_batch_bytes + self.max_frame_bytes + _PIPE_SLACK
        child.outbound.max_bytes = self.max_frame_bytes + CURVE_SLACK + OUTBOUND_SLACK
        try:
            await child.control.send(self._setup(endpoint))
            kind, bound = await child.control.receive()
        except BaseException as exc:
            how = await self._end(child)
            if isinstance(exc, PipeError | trio.BrokenResourceError):
                raise BindError(f"the ingress process ended before binding ({how})", self.name) from None
            raise
        if kind != "bound" or "error" in bound:
            await self._end(child)
            raise BindError(bound.get("error", f"unexpected answer {kind!r}"), self.name)
        self.endpoint = bound["endpoint"]
        for dialled, (routing_id, server_key) in self.dials.items():  # a later process dials again
            await child.outbound.send(["connect", dialled, routing_id, server_key])
        return child

    async def _relay(self, child: _Child) -> None:
        """Until the process ends: its connection events, ZAP requests, counts and log records
        from it, and what the node sends to it."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, child)
            await self._relay_control(child)
            nursery.cancel_scope.cancel()

    async def _relay_control(self, child: _Child) -> None:
        control = child.control
        try:
            while True:
                message = await control.receive()
                kind = message[0]
                if kind == "event":
                    _, event, fd, address = message
                    self.connections.on_event(event, fd, address, self.name, trio.current_time())
                    if self.name == CLIENT:  # `address` is the endpoint it dialled
                        self._follow_dial(event, address)
                elif kind == "reset":
                    self.connections.reset(self.name, message[2], trio.current_time())
                elif kind == "zap":
                    await control.send(["zap", self.connections.reply(message[1], trio.current_time())])
                elif kind == "counts":
                    self.counts.update(message[1])
                elif kind == "log":
                    _, level, name, text = message
                    logging.getLogger(name).log(level, "%s", text)
        except (PipeError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def _close_pipes(child: _Child) -> None:
    for pipe in (child.control, child.frames, child.outbound):
        try:
            await pipe.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
