"""`p2pnode bench transport`: signed messages between two nodes' transports, against a tight
loop of blocking pyzmq doing the same signing and checking, measured in the same run.

trio side: node A, a process of its own as a peer is (until 2026-11-25 it shared node B's event
loop, and signing there starved B's reader: BENCHMARKS.md), signs as the node does (signing.py:
on the event loop, in a worker thread for large payloads) and sends on its DEALER to B's peers'
socket, where an admitted peer's frames go (transport.py; waiting, not dropping, when the queue
is full, so no message is lost); node B's real receive path for a peer (the peers' socket in its
ingress process, as a node's since 2026-11-25: ingress.py; then inbound.py: batches, verify
threads, replay guard) takes them. Not the public socket: it is read no faster than the
strangers' budget, behind a queue of `public_recv_hwm` (4) frames, on purpose. Blocking side:
one thread signs and sends, another receives, decodes and checks, over the same kind of socket
pair with the peers' socket's queue. Both sides share this machine's cores. Ratio = trio msg/s
÷ blocking msg/s; the goal is ≥ 0.7 at 20 KB.

The trio side runs twice per trial: plaintext, and with CURVE on the connection (keys derived
from the two identities, the ZAP handler answering, the gate binding frames to the connection,
as `[security].curve` does in the node). `curve ratio` = CURVE msg/s ÷ blocking msg/s, goal
≥ 0.6 at 20 KB (issue #14); `curve/plain` = what encryption costs the trio side.

With `presigned`, both senders send frames signed before the clock starts: what is measured is
then the receive path alone.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.process
import os
import platform
import statistics
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from multiprocessing.connection import Connection

import numpy as np
import trio
import zmq

from p2pnode.config import SecuritySettings, TransportSettings
from p2pnode.gate import Gate
from p2pnode.inbound import Inbound
from p2pnode.ingress import Ingress
from p2pnode.metrics import Metrics
from p2pnode.signing import encode
from p2pnode.transport import Transport
from p2pnode.zap import PEERS, PUBLIC, Connections
from p2pnode.zmqtrio import send_waiting
from p2pnode.zygote import Zygote
from protocol import Decoder, Encoder, Identity, Model, ReplayGuard, SequenceCounter
from protocol.curve import curve_public_from_ed25519

DEFAULT_SIZES = (1024, 20 * 1024, 200 * 1024)
GOAL_RATIO_20K = 0.7
GOAL_CURVE_RATIO_20K = 0.6
PRESIGNED_BYTES = 256 << 20
CONNECT_TIMEOUT_S = 60  # node A's start (a fresh interpreter) and its connection, handshake included
_NETWORK = "bench"
_READY, _GO, _STOP = "ready", "go", "stop"  # from node A's process; to it, twice


def _clock_us() -> int:
    return time.time_ns() // 1000


def _body(size: int) -> Model:
    return Model(kind="params", tensors={"w": np.random.default_rng(size).standard_normal(size // 4, dtype=np.float32)})


def _counter() -> SequenceCounter:
    counter = SequenceCounter(persisted=0, now_us=_clock_us(), block=1 << 40)
    counter.confirm_reservation(counter.propose_reservation())
    return counter


def _settings(verify_threads: int) -> TransportSettings:
    # No flood limit in a benchmark. (The strangers' budget never applies: node A is an admitted
    # peer, sending on the peers' socket.)
    return replace(
        TransportSettings(),
        rate_per_connection=1e9,
        burst_per_connection=1_000_000,
        verify_threads=verify_threads,
    )


def _signed(encoder: Encoder, body: Model, count: int) -> list[bytes]:
    counter = _counter()
    return [encoder.encode(body, seq=counter.next(), timestamp_us=_clock_us(), round=0) for _ in range(count)]


def run_trio(size: int, count: int, verify_threads: int = 2, curve: bool = False, presigned: bool = False) -> float:
    """Messages per second from node A (a process of its own) to node B's receive path, both
    under trio (with CURVE if `curve`; frames signed before the clock starts if `presigned`)."""
    sender_identity, receiver_identity = Identity.generate(), Identity.generate()
    settings = _settings(verify_threads)
    processes = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited ZeroMQ state

    async def main() -> float:
        receiver_curve = receiver_identity.curve_keypair() if curve else None
        connections = _connections(sender_identity.public_key, curve)
        receiver = await _start_receiver(settings, receiver_curve, connections)
        endpoint, peers_endpoint = receiver[PUBLIC].endpoint, receiver[PEERS].endpoint
        inbound = _receive_path(receiver, settings, sender_identity.public_key, curve)
        done = trio.Event()
        received = 0

        async def handle(envelope, frame, source):
            nonlocal received
            received += 1
            if received == count:
                done.set()
            return None

        control, sender_end = processes.Pipe()
        sender = processes.Process(
            target=_send,
            args=(sender_end, sender_identity.to_pem(), receiver_identity.public_key, endpoint, peers_endpoint),
            kwargs={"size": size, "count": count, "settings": settings, "curve": curve, "presigned": presigned},
            daemon=True,
        )
        sender.start()
        try:
            async with trio.open_nursery() as nursery:
                for ingress in receiver.values():
                    nursery.start_soon(ingress.supervise)
                nursery.start_soon(inbound.run, handle)
                nursery.start_soon(_watch, sender)
                with trio.move_on_after(CONNECT_TIMEOUT_S) as connecting:
                    await _message(control)  # connected: the clock starts with the first frame signed
                if connecting.cancelled_caught:
                    raise RuntimeError(f"the sending node did not connect within {CONNECT_TIMEOUT_S} s")
                started = time.perf_counter()
                control.send(_GO)
                await done.wait()
                elapsed = time.perf_counter() - started
                nursery.cancel_scope.cancel()
        finally:
            with contextlib.suppress(OSError):  # gone already
                control.send(_STOP)
            sender.join(5)
            sender.kill()
            for ingress in receiver.values():
                await ingress.close()
            await receiver[PUBLIC].zygote.close()  # the one both share
        read = {name: ingress.messages_read for name, ingress in receiver.items()}
        if read[PEERS] != count:  # the path measured is a peer's
            raise RuntimeError(f"{read} frames read by socket, {count} sent to the peers' one")
        return count / elapsed

    return trio.run(main)


async def _start_receiver(
    settings: TransportSettings, curve: tuple[bytes, bytes] | None, connections: Connections
) -> dict[str, Ingress]:
    """Node B's two inbound sockets, each in its ingress process as a node's, bound on loopback."""
    zygote, counts = Zygote(), Counter()
    receiver = {
        name: Ingress(name, settings, 64 << 20, curve, connections, counts, zygote=zygote) for name in (PUBLIC, PEERS)
    }
    for ingress in receiver.values():
        await ingress.start("tcp://127.0.0.1:0")
    return receiver


def _connections(sender_key: bytes, curve: bool) -> Connections:
    """With CURVE, node B's ZAP handler lets node A's transport key onto the peers' socket."""
    sender_transport_key = curve_public_from_ed25519(sender_key)
    return Connections(SecuritySettings(curve=curve), Counter(), lambda key: key == sender_transport_key)


def _receive_path(receiver: dict[str, Ingress], settings: TransportSettings, sender_key: bytes, curve: bool) -> Inbound:
    """Node B's receive path (its inbound sockets in their ingress process, as a node's), with
    node A's key admitted as a peer's: its frames pass the gate as a peer's."""
    guard = ReplayGuard()
    guard.trust(sender_key, 0)
    gate = Gate(settings, 1, lambda key: key == sender_key, curve=curve)
    return Inbound(receiver, Decoder(_NETWORK), guard, gate, Metrics(), settings, _clock_us)


def _send(
    control: Connection,
    pem: bytes,
    receiver_key: bytes,
    endpoint: str,
    peers_endpoint: str,
    *,
    size: int,
    count: int,
    settings: TransportSettings,
    curve: bool,
    presigned: bool,
) -> None:
    """Node A, in its own process: connect to B as an admitted peer does, then on _GO sign and
    send `count` frames as the node does, then wait for _STOP (closing earlier could drop frames
    still queued)."""
    identity, body = Identity.from_pem(pem), _body(size)

    async def main() -> None:
        sender = Transport(settings, 64 << 20, identity.curve_keypair() if curve else None)
        try:
            sender.dial(endpoint, receiver_key)
            sender.dial_peers(endpoint, peers_endpoint)
            encoder = Encoder(identity, _NETWORK)
            signed = _signed(encoder, body, count) if presigned else None
            socket = sender.outbound_socket(endpoint)
            await _wait_connected(socket)
            control.send(_READY)
            await _message(control)
            async for frame in _frames(encoder, body, count, settings.sign_in_thread_bytes, signed):
                await send_waiting(socket, frame)
            await _message(control)
        finally:
            await sender.close()

    trio.run(main)


async def _message(control: Connection) -> str:
    while not control.poll():
        await trio.sleep(0.001)
    return control.recv()


async def _watch(sender: multiprocessing.process.BaseProcess) -> None:
    """The sender leaves only when told to, after every frame arrived: earlier, it failed."""
    while sender.is_alive():
        await trio.sleep(0.05)
    raise RuntimeError(f"the sending node's process exited early, with code {sender.exitcode}")


async def _frames(
    encoder: Encoder, body: Model, count: int, threshold: int, signed: list[bytes] | None
) -> AsyncIterator[bytes]:
    """The frames `signed` ahead, or `count` frames each signed as the node signs it
    (signing.py), when it is to be sent."""
    if signed is not None:
        for frame in signed:
            yield frame
        return
    counter = _counter()
    for _ in range(count):
        yield await encode(encoder, body, seq=counter.next(), timestamp_us=_clock_us(), round=0, threshold=threshold)


async def _wait_connected(socket: zmq.Socket) -> None:
    while not socket.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
        await trio.sleep(0.005)


def run_blocking(size: int, count: int, presigned: bool = False) -> float:
    """Messages per second, blocking pyzmq: a signing sender thread (sending frames signed
    before the clock starts if `presigned`), a checking receiver thread."""
    body = _body(size)
    identity = Identity.generate()
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    for socket in (router, dealer):
        socket.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVHWM, TransportSettings().recv_hwm)
    dealer.setsockopt(zmq.SNDHWM, TransportSettings().send_hwm)
    router.bind("tcp://127.0.0.1:0")
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    encoder, counter, decoder, guard = Encoder(identity, _NETWORK), _counter(), Decoder(_NETWORK), ReplayGuard()
    guard.trust(identity.public_key, 0)
    frames = _signed(encoder, body, count) if presigned else None
    while not dealer.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
        time.sleep(0.005)

    def send() -> None:
        for i in range(count):
            if frames is not None:
                dealer.send(frames[i])
            else:
                dealer.send(encoder.encode(body, seq=counter.next(), timestamp_us=_clock_us(), round=0))

    thread = threading.Thread(target=send)
    started = time.perf_counter()
    thread.start()
    for _ in range(count):
        _, frame = router.recv_multipart()
        envelope = decoder.decode(frame)
        guard.admit(envelope.sender, envelope.seq, envelope.timestamp_us, _clock_us())
    elapsed = time.perf_counter() - started
    thread.join()
    router.close()
    dealer.close()
    context.term()
    return count / elapsed


def run(
    sizes=DEFAULT_SIZES, *, trials: int = 3, seconds: float = 1.0, verify_threads: int = 2, presigned: bool = False
) -> dict:
    results = []
    for size in sizes:
        # Calibrate the message count so one trial takes about `seconds` (frames signed ahead
        # are held at once: at most PRESIGNED_BYTES of them).
        probe = max(50, int(2e6 / size))
        count = max(200, int(run_blocking(size, probe, presigned) * seconds))
        if presigned:
            count = max(50, min(count, PRESIGNED_BYTES // size))
        trio_rates, curve_rates, blocking_rates = [], [], []
        for _ in range(trials):  # interleaved
            blocking_rates.append(run_blocking(size, count, presigned))
            trio_rates.append(run_trio(size, count, verify_threads, presigned=presigned))
            curve_rates.append(run_trio(size, count, verify_threads, curve=True, presigned=presigned))
        trio_rate, blocking_rate = statistics.median(trio_rates), statistics.median(blocking_rates)
        curve_rate = statistics.median(curve_rates)
        results.append(
            {
                "payload_bytes": size,
                "messages": count,
                "trio_per_s": round(trio_rate, 1),
                "curve_per_s": round(curve_rate, 1),
                "blocking_per_s": round(blocking_rate, 1),
                "ratio": round(trio_rate / blocking_rate, 3),
                "curve_ratio": round(curve_rate / blocking_rate, 3),
                "curve_over_plain": round(curve_rate / trio_rate, 3),
                "trio_trials": [round(r, 1) for r in trio_rates],
                "curve_trials": [round(r, 1) for r in curve_rates],
                "blocking_trials": [round(r, 1) for r in blocking_rates],
            }
        )
    twenty = next((r for r in results if r["payload_bytes"] == 20 * 1024), None)
    goal_met = None  # the goals are for the whole exchange, signing included
    if twenty is not None and not presigned:
        goal_met = twenty["ratio"] >= GOAL_RATIO_20K and twenty["curve_ratio"] >= GOAL_CURVE_RATIO_20K
    return {
        "benchmark": "transport",
        "goal": f"ratio >= {GOAL_RATIO_20K} and curve ratio >= {GOAL_CURVE_RATIO_20K} at 20 KiB",
        "goal_met": goal_met,
        "method": f"median of {trials} interleaved trials of ~{seconds:g} s; "
        f"signed MODEL frames{', signed before the clock starts (the receive path alone)' if presigned else ''}, "
        f"loopback TCP, verify_threads={verify_threads}",
        "presigned": presigned,
        "adapter": "p2pnode.zmqtrio (ZMQ_FD + ZMQ_EVENTS, NOBLOCK)",
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "results": results,
    }


def format_table(report: dict) -> str:
    lines = [
        f"{'payload':>9} {'messages':>9} {'trio msg/s':>11} {'curve msg/s':>12} {'blocking msg/s':>15} "
        f"{'ratio':>7} {'curve ratio':>12} {'curve/plain':>12}"
    ]
    for r in report["results"]:
        lines.append(
            f"{r['payload_bytes']:>9} {r['messages']:>9} {r['trio_per_s']:>11.0f} {r['curve_per_s']:>12.0f} "
            f"{r['blocking_per_s']:>15.0f} {r['ratio']:>7.2f} {r['curve_ratio']:>12.2f} {r['curve_over_plain']:>12.2f}"
        )
    met = {True: "met", False: "NOT met", None: "not measured"}[report["goal_met"]]
    if report.get("presigned"):
        met = "not for the receive path alone"
    lines.append(f"goal {report['goal']}: {met}. {report['method']}")
    return "\n".join(lines)


def settings(presigned: bool = False) -> dict:
    """What differs from a user's defaults, as "section.key": value."""
    lifted = _settings(TransportSettings().verify_threads)
    defaults = TransportSettings()
    return {
        f"transport.{key}": getattr(lifted, key)
        for key in ("rate_per_connection", "burst_per_connection")
        if getattr(lifted, key) != getattr(defaults, key)
    } | ({"frames": "signed before the clock starts"} if presigned else {})
