"""An ingress process: one of the node's inbound ROUTERs (the public socket or the peers'), its
ZAP hook, monitor and buffer bound, in a process of its own (supervisor.py explains why). Run by
the node, never by hand:

    python -m p2pnode.wire.inbound.process NODE_FD

starts the node's fork server (`main`: p2pnode/forkserver.py `serve`, with what an ingress process
needs imported), which forks one ingress process per socket, and again when one ends. Each
ingress process gets three descriptors, each one end of a socket pair (pipes.py) whose other end
the node holds:
- control: first the node's setup (endpoint, socket settings, CURVE keys), answered with the
  endpoint bound or why not; then, this way, each connection event, each connection reset by
  its other end (resets.py), each ZAP request, log record and counter change; the other way,
  each ZAP verdict. The ZAP handler itself stays in
  the node (zap.py `Connections`): this process only carries requests and answers.
- frames: the node asks for a batch ([max messages, max bytes]) and gets what the ROUTER had,
  up to that; nothing is read from the ROUTER unless the node asked for it, so the node's
  pacing (gate.py) still decides how fast strangers are read, and ZeroMQ still pushes back.
- outbound: what the node does with the ROUTER's connections, in order: ["send", routing id,
  frame] (sends.py), and a client ingress's ["connect", endpoint, routing id, server key] and
  ["disconnect", endpoint].

A client ingress (issue #46: a node nobody can dial) binds nothing: its ROUTER connects to the
nodes the node dials, each connection named by a routing id the node chose, and reads and
sends there as above.

The process ends when the node closes the control pipe (or dies), and aborts with libzmq.
It imports neither torch nor the node: it starts in a fraction of a second.
"""

from __future__ import annotations

import logging
import math
import resource
import signal
import socket
import sys
import traceback
from collections import Counter

import trio
import zmq

from ...forkserver import serve
from ..zmqsetup import (
    DOMAINS,
    FAILED_EVENTS,
    PUBLIC,
    close_zap,
    monitor_event,
    open_zap,
    remote_peer,
    set_liveness,
    unwatch,
    watch,
)
from ..zmqtrio import Wakeup, receive_batch, receive_routed, wait_for
from .buffers import PER_CONNECTION_BYTES, GrowthAlarm, watch_buffers
from .pipes import MessagePipe, PipeError
from .resets import ResetWatch
from .sends import OUTBOUND_SLACK, RoutedSends
from .silence import HANDSHAKE_BYTES, SilentConnections

log = logging.getLogger("p2pnode.ingress")

OUT_OF_MEMORY = 3  # the exit code past `DataLimit`
CONTROL_MAX_BYTES = 1 << 20  # setup, ZAP verdicts: small
COUNTS_EVERY_S = 0.25  # how often counter changes go to the node


class _ForwardLogs(logging.Handler):
    """Log records go to the node, which writes them where its own go ([log])."""

    def __init__(self, outbox: trio.MemorySendChannel) -> None:
        super().__init__()
        self.outbox = outbox

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.outbox.send_nowait(["log", record.levelno, record.name, record.getMessage()])
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the node is not reading: a log line is not worth waiting for


class InboundRouter:
    """One inbound ROUTER, as the node set it up (supervisor.py `Ingress._setup`)."""

    def __init__(self, setup: dict, control: MessagePipe, frames: MessagePipe, outbound: MessagePipe) -> None:
        self.setup, self.control, self.frames, self.outbound = setup, control, frames, outbound
        self.name = setup["name"]  # PUBLIC or PEERS
        self.context = zmq.Context(io_threads=1)
        self.router: zmq.Socket | None = None
        self.monitor: zmq.Socket | None = None
        self.routed: RoutedSends | None = None  # set once bound
        # A client's: endpoint -> its connection's routing id and server key; those refused.
        self.dialled: dict[str, tuple[bytes, bytes | None]] = {}
        self.refused = RefusedDials(setup["redial_s"], setup["redial_max_s"])
        self.wakeup = Wakeup()  # the reader, after a send (zmqtrio.py)
        self._events = trio.Lock()  # the monitor's events are read and told under it (`_forward_events`)
        self.zap = open_zap(self.context)
        self.tcp: dict[int, tuple] = {}  # live connections: descriptor -> remote end (buffers.py)
        self.counts: Counter[str] = Counter()
        self.read = [0, 0]  # bytes and parts the node took, routing ids aside
        self.data_limit: DataLimit | None = None  # set once every thread is up
        self.outbox, self._outbox = trio.open_memory_channel(10_000)
        self.verdicts, self._verdicts = trio.open_memory_channel(1)
        self.resets: ResetWatch | None = None  # set once the process runs
        self._resets_found, self._reset_sent = trio.Event(), trio.lowlevel.ParkingLot()
        self.resets_told = [0, 0]  # resets queued for the node, and sent

    def bind(self) -> dict:
        """The ROUTER bound: {"endpoint": ...}, or {"error": ...} (nothing left open then: a
        socket left open would hold `close` in `context.term()`); a client ingress's binds
        nothing ({"endpoint": None})."""
        router = self.context.socket(zmq.ROUTER)
        monitor = None
        endpoint = self.setup["endpoint"]
        try:
            self._set_up(router)
            monitor = watch(self.context, router, DOMAINS[self.name])
            if endpoint is not None:
                router.bind(endpoint)
        except zmq.ZMQError as exc:
            if monitor is not None:
                unwatch(router, monitor)
            router.close(linger=0)
            return {"error": f"cannot bind {endpoint}: {exc.strerror}"}
        self.router, self.monitor = router, monitor
        self.routed = RoutedSends(
            router, self.setup["max_routed_send_bytes"], self.counts, self.setup["max_routed_send_bytes_per_connection"]
        )
        return {"endpoint": None if endpoint is None else router.getsockopt_string(zmq.LAST_ENDPOINT)}

    def _set_up(self, router: zmq.Socket) -> None:
        for option, value in (
            (zmq.MAXMSGSIZE, self.setup["max_message_bytes"]),
            (zmq.RCVHWM, self.setup["recv_hwm"]),
            (zmq.SNDHWM, self.setup["send_hwm"]),
            (zmq.ROUTER_MANDATORY, 1),  # a frame for a connection that is gone raises, not vanishes
            (zmq.LINGER, 0),
        ):
            router.setsockopt(option, value)
        set_liveness(router, self.setup["handshake_ivl_ms"], self.setup["keepalive_s"])
        if self.setup["curve"] is not None:
            secret, public = self.setup["curve"]
            # A client's ROUTER is a CURVE client: each of its connects names the server's key.
            router.setsockopt(zmq.CURVE_SERVER, int(self.setup["endpoint"] is not None))
            router.setsockopt(zmq.CURVE_SECRETKEY, secret)
            router.setsockopt(zmq.CURVE_PUBLICKEY, public)

    def connect(self, endpoint: str, routing_id: bytes, server_key: bytes | None) -> None:
        """A client ingress dials `endpoint` (with CURVE, where `server_key` is expected), and
        names the connection `routing_id`; libzmq reconnects it as it does a DEALER's."""
        if self.dialled.get(endpoint) == (routing_id, server_key):
            return  # dialled already (the node's dials are replayed to every new process)
        if endpoint in self.dialled:
            self.disconnect(endpoint)
        try:
            self.router.setsockopt(zmq.CONNECT_ROUTING_ID, routing_id)
            if server_key is not None:
                self.router.setsockopt(zmq.CURVE_SERVERKEY, server_key)
            self.router.connect(endpoint)
            self.dialled[endpoint] = (routing_id, server_key)
        except zmq.ZMQError as exc:  # e.g. a host name that does not resolve, or a routing id in use
            self.counts["connect_failed"] += 1
            log.warning("cannot connect to %s: %s", endpoint, exc.strerror)

    def disconnect(self, endpoint: str) -> None:
        self.dialled.pop(endpoint, None)
        self.refused.forget(endpoint)
        self._undo_dial(endpoint)

    def _undo_dial(self, endpoint: str) -> None:
        try:
            self.router.disconnect(endpoint)
        except zmq.ZMQError:
            pass  # not connected: nothing to undo

    async def run(self) -> None:
        token = trio.lowlevel.current_trio_token()

        def found() -> None:  # in the watch's thread
            trio.from_thread.run_sync(lambda: self._resets_found.set(), trio_token=token)

        with ResetWatch(found) as self.resets:
            for fd, peer in self.tcp.items():
                self.resets.watch(fd, peer)
            await self._run()

    async def _report_resets(self) -> None:
        """Connections reset by their other end, to the node as the watch finds them."""
        while True:
            await self._resets_found.wait()
            self._resets_found = trio.Event()
            await self._tell_resets()

    async def _tell_resets(self) -> None:
        """Every reset so far is on the control pipe on return: the node hears of a reset before
        the abort it causes (resets.py)."""
        for fd, peer in self.resets.take() if self.resets is not None else ():
            if self.tcp.get(fd) == peer:
                self.resets_told[0] += 1
                await self.outbox.send(["reset", fd, peer[0]])
        while self.resets_told[1] < self.resets_told[0]:
            await self._reset_sent.park()

    async def _run(self) -> None:
        async with trio.open_nursery() as nursery:
            # Every thread is up once the alarm's is: from here on the process grows only by
            # what libzmq holds and the batches in flight, and the limit is the last word on it.
            nursery.start_soon(self._watch_buffers)
            await trio.sleep(0)
            self.data_limit = DataLimit(self.setup["data_limit_bytes"])
            self.data_limit.set(len(self.tcp))
            nursery.start_soon(self._send_outbox)
            nursery.start_soon(self._read_control, nursery.cancel_scope)
            nursery.start_soon(self._relay_zap)
            nursery.start_soon(self._forward_counts)
            nursery.start_soon(self._follow)
            nursery.start_soon(self._report_resets)
            nursery.start_soon(self._serve)
            nursery.start_soon(self._act, nursery.cancel_scope)
            if self.setup["endpoint"] is None:
                nursery.start_soon(self._redial)

    async def _send_outbox(self) -> None:
        try:
            async for message in self._outbox:
                await self.control.send(message)
                if message[0] == "reset":
                    self.resets_told[1] += 1
                    self._reset_sent.unpark_all()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the node is going: the control pipe's end ends this process

    async def _read_control(self, done: trio.CancelScope) -> None:
        """ZAP verdicts, until the node closes the pipe: then this process ends."""
        try:
            while True:
                message = await self.control.receive()
                if message[0] == "zap":
                    await self.verdicts.send(message[1])
        except PipeError:
            done.cancel()

    async def _act(self, done: trio.CancelScope) -> None:
        """The node's frames for the ROUTER's connections (sends.py), and a client's dials."""
        while True:
            try:
                kind, *args = await self.outbound.receive()
            except PipeError:
                done.cancel()  # the node is going, or sent what it must not: this process ends
                return
            if kind == "send":
                self.routed.send(*args)
                self.wakeup.wake()
            elif kind == "connect":
                self.connect(*args)
            elif kind == "disconnect":
                self.disconnect(*args)

    def _drop_refused(self, endpoint: str) -> None:
        """Undo a dial whose handshake failed, at once: libzmq keeps its connection (and routing
        id) but never dials it again. Undone later, right before the dial anew, libzmq may not have
        let go of that routing id yet (it aborts: router.cpp `!has_out_pipe`) and has been seen to
        end another connection of this socket instead (tests/test_routed.py, tests/test_client_mode.py)."""
        if endpoint in self.dialled:
            self._undo_dial(endpoint)

    async def _redial(self) -> None:
        """A client's dials that were refused or failed, dialled anew when due (RefusedDials),
        undone since the refusal (`_drop_refused`)."""
        while True:
            with trio.move_on_at(self.refused.next_at()):
                await self.refused.changed.wait()
            self.refused.changed = trio.Event()
            for endpoint in self.refused.take_due(trio.current_time()):
                if endpoint in self.dialled:
                    routing_id, server_key = self.dialled.pop(endpoint)
                    self.connect(endpoint, routing_id, server_key)
                    self.counts["redialled"] += 1

    async def _event(self, parts: list[bytes]) -> None:
        """Waits while the node does not take events: the monitor's queue then fills and
        libzmq's I/O thread waits too, so no event is ever dropped (zap.py)."""
        event, fd = monitor_event(parts)
        dialled = None
        if self.setup["endpoint"] is None:  # a client's: the event names the endpoint it dialled
            dialled = parts[1].decode(errors="replace")
            self.refused.on_event(event, dialled, trio.current_time())
            if event in FAILED_EVENTS:
                self._drop_refused(dialled)
        address = None
        if event in (zmq.EVENT_ACCEPTED, zmq.EVENT_CONNECTED):  # CONNECTED: a client ingress's dial
            peer = remote_peer(fd)
            if peer is not None:
                self.tcp[fd] = peer
                if self.resets is not None:
                    self.resets.watch(fd, peer)
            address = "?" if peer is None else peer[0]
        elif event == zmq.EVENT_DISCONNECTED:
            self.tcp.pop(fd, None)
            if self.resets is not None:
                self.resets.forget(fd)
        if self.data_limit is not None:
            self.data_limit.set(len(self.tcp))
        # A client's: which of its dials (supervisor.py follows them by endpoint).
        await self.outbox.send(["event", event, fd, address if dialled is None else dialled])

    async def _follow(self) -> None:
        while True:
            await wait_for(self.monitor, zmq.POLLIN)
            async with self._events:
                await self._forward_events()

    async def _forward_events(self) -> None:
        """Every connection event queued, to the node; called holding `_events`, so that no event
        read is still on its way while a ZAP request overtakes it: under load a connection was
        once judged before its own ACCEPTED had been counted, and the total cap let one more in."""
        while True:
            try:
                parts = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            await self._event(parts)

    async def _relay_zap(self) -> None:
        """Each ZAP request to the node, after every connection event before it (the request's
        own ACCEPTED among them), and the node's verdict back to libzmq."""
        while True:
            for request in await receive_batch(self.zap, 1):
                async with self._events:
                    await self._forward_events()
                    await self.outbox.send(["zap", request])
                self.zap.send_multipart(await self._verdicts.receive(), zmq.NOBLOCK)

    async def _serve(self) -> None:
        """Batches for the node, as it asks for them (see the module's docstring)."""
        while True:
            try:
                max_messages, max_bytes = await self.frames.receive()
            except PipeError:
                return  # the node is going: the control pipe ends this process
            relayed = []
            # Resets are told before each read that could let libzmq abort on one, and after it.
            routed = await receive_routed(
                self.router, max_messages, max_bytes, before_read=self._tell_resets, wakeup=self.wakeup
            )
            await self._tell_resets()
            for routing_id, frame, *more in routed:
                sizes = [len(part) for part in more]  # a peer never sends more parts: the node refuses them
                relayed.append([routing_id, frame.bytes, frame.get("Peer-Address"), self._user_id(frame), sizes])
                self.read[0] += len(frame) + sum(sizes)
                self.read[1] += 1 + len(sizes)
            try:
                await self.frames.send(relayed)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    def _user_id(self, frame: zmq.Frame) -> str | None:
        """The CURVE key (hex) the frame's connection was authenticated with (zap.py). A client's
        connections asked no ZAP handler: the node knows the server key each one dialled."""
        return frame.get("User-Id") if self.setup["curve"] is not None and self.setup["endpoint"] is not None else None

    async def _forward_counts(self) -> None:
        while True:
            await trio.sleep(COUNTS_EVERY_S)
            if self.counts:
                counts = dict(self.counts)
                self.counts.clear()
                await self.outbox.send(["counts", counts])

    async def _watch_buffers(self) -> None:
        """buffers.py's bound on what libzmq holds; on the public socket, a connection whose
        sender has gone (its stream ended) is also shut with what it left unread."""
        with GrowthAlarm(self.setup["growth_check_ms"] / 1000) as alarm:
            await watch_buffers(
                lambda: list(self.tcp.items()),
                lambda: (self.read[0], self.read[1]),
                self.setup["max_buffered_bytes"],
                self.setup["buffer_check_ms"] / 1000,
                self.counts,
                self.name,
                alarm,
                drop_ended=self.name == PUBLIC,
                silence=self._silence(),
            )

    def _silence(self) -> SilentConnections | None:
        """On the public socket, where strangers connect (silence.py)."""
        if self.name != PUBLIC or not self.setup["silent_s"]:
            return None
        mechanism = "NULL" if self.setup["curve"] is None else "CURVE"
        return SilentConnections(self.setup["silent_s"], HANDSHAKE_BYTES[mechanism])

    def close(self) -> None:
        if self.router is not None:
            unwatch(self.router, self.monitor)
            self.router.close(linger=0)
        close_zap(self.zap)
        self.context.term()


class RefusedDials:
    """A client's dials whose handshake failed or was refused (the other side's ZAP handler: a
    node that has not admitted this one yet, a cap): libzmq never tries those again, so each is
    dialled anew after `first_s`, then twice as long each time up to `max_s`, until one
    succeeds (as transport.py's `Redial` reopens a DEALER)."""

    def __init__(self, first_s: float, max_s: float) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.due: dict[str, float] = {}
        self.waits: dict[str, float] = {}
        self.changed = trio.Event()

    def on_event(self, event: int, endpoint: str, now: float) -> None:
        if event in FAILED_EVENTS:
            wait = min(self.max_s, 2 * self.waits[endpoint]) if endpoint in self.waits else self.first_s
            self.waits[endpoint], self.due[endpoint] = wait, now + wait
            self.changed.set()
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.forget(endpoint)

    def forget(self, endpoint: str) -> None:
        self.due.pop(endpoint, None)
        self.waits.pop(endpoint, None)

    def next_at(self) -> float:
        return min(self.due.values(), default=math.inf)

    def take_due(self, now: float) -> list[str]:
        taken = [endpoint for endpoint, at in self.due.items() if at <= now]
        for endpoint in taken:
            del self.due[endpoint]  # its wait stays: the next refusal waits twice as long
        return taken


class DataLimit:
    """A hard bound on this process's memory (RLIMIT_DATA): what it held once set up, plus
    `extra_bytes`, plus PER_CONNECTION_BYTES for each live connection (libzmq's own for one:
    about 100 KiB measured, its buffers and queues). buffers.py sheds the connections that make
    libzmq hold too much, but it reacts after the fact, and on a loaded machine late (8
    connections each sending a multipart message never finished grew the process by 40 MB
    against a 16 MiB bound); past this limit libzmq's next allocation fails and it aborts, so
    the process ends, is started again with nothing held (supervisor.py), and the connections that
    were coming in just then are suspects of an abort (zap.py)."""

    def __init__(self, extra_bytes: int | None) -> None:
        """`extra_bytes` None: no limit."""
        self.base: int | None = None
        if extra_bytes is not None and hasattr(resource, "RLIMIT_DATA"):
            try:
                with open("/proc/self/status") as status:
                    data_kib = next(int(line.split()[1]) for line in status if line.startswith("VmData:"))
                self.base = data_kib * 1024 + extra_bytes
            except (OSError, StopIteration, ValueError):
                pass  # no /proc: buffers.py's bound alone

    def set(self, connections: int) -> None:
        if self.base is not None:
            limit = self.base + connections * PER_CONNECTION_BYTES
            resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))


async def _main(control_fd: int, frames_fd: int, outbound_fd: int) -> None:
    control = MessagePipe(socket.socket(fileno=control_fd), CONTROL_MAX_BYTES)
    try:
        setup = await control.receive()
    except PipeError:
        return  # the node went before it said what to bind
    outbound = MessagePipe(socket.socket(fileno=outbound_fd), setup["max_message_bytes"] + OUTBOUND_SLACK)
    ingress = InboundRouter(setup, control, MessagePipe(socket.socket(fileno=frames_fd), 1 << 10), outbound)
    root = logging.getLogger("p2pnode")
    root.handlers[:] = [_ForwardLogs(ingress.outbox)]
    root.setLevel(setup["log_level"])
    root.propagate = False
    try:
        bound = ingress.bind()
        await control.send(["bound", bound])
        if "error" not in bound:
            await ingress.run()
    finally:
        ingress.close()


def run_ingress(control_fd: int, frames_fd: int, outbound_fd: int) -> int:
    """One ingress process's life, in a child the fork server forked; its exit code."""
    try:
        trio.run(_main, control_fd, frames_fd, outbound_fd)
    except BaseException as exc:
        # Past `DataLimit` in Python rather than in libzmq (which aborts): said by the exit
        # code, so that the node counts it as what it is, an attack (supervisor.py).
        if isinstance(exc, MemoryError) or (isinstance(exc, BaseExceptionGroup) and exc.subgroup(MemoryError)):
            return OUT_OF_MEMORY
        traceback.print_exc()
        return 1
    return 0


def _ingress_child(request: dict, fds: list[int]) -> int:
    """A forked child: the ingress process on its three pipe ends (control, frames, outbound)."""
    return run_ingress(*fds)


def main(argv: list[str] | None = None) -> int:
    """The node's fork server of ingress processes: with everything an ingress process needs
    imported and nothing started, it forks one per request (its two pipe ends passed with it)
    and tells when each ends, until the node closes its end (p2pnode/forkserver.py)."""
    (node_fd,) = (int(fd) for fd in (argv or sys.argv[1:]))
    # A terminal's Ctrl-C or a service manager's SIGTERM reaches the node's whole group: the
    # node stops the server and its children itself, by closing their pipes, after its goodbyes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(node_fd, _ingress_child)
    return 0


if __name__ == "__main__":
    sys.exit(main())
