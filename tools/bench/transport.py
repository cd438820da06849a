"""`p2pnode bench transport`: signed messages between two nodes' transports, against a tight
loop of blocking pyzmq doing the same signing and checking, measured in the same run.

trio side: node A, a process of its own as a peer is (until 2026-11-25 it shared node B's event
loop, and signing there starved B's reader: BENCHMARKS.md), signs as the node does (signing.py:
on the event loop, in a worker thread for large payloads) and sends on its DEALER to B's peers'
socket, where an admitted peer's frames go (transport.py; waiting, not dropping, when the queue
is full); node B's real receive path for a peer (the peers' socket in its ingress process, as a
node's since 2026-11-25: p2pnode/wire/inbound/supervisor.py; then reader.py: gate with its
per-connection rate limit, batches, verify threads, replay guard) takes them. Not the public
socket: it is read no faster than the strangers' budget, behind a queue of `public_recv_hwm` (4)
frames, on purpose.
Blocking side: a sender in a process of its own too, signing and sending in a loop, and a
receiver that decodes and checks, over the same kind of socket pair with the peers' socket's
queue: two processes on this machine's cores on either side. (Until issue #31 the blocking
sender was a thread sharing its receiver's GIL, which flattered the trio side.) Ratio = trio
msg/s ÷ blocking msg/s; the goal is ≥ 0.7 at 20 KB.

The trio side runs under two sets of transport settings, interleaved:
- DEFAULTS, a user's: node A sends as fast as it can, as a node does, and B refuses what comes
  faster than `rate_per_connection` (beyond a burst of `burst_per_connection`) as `rate_limited`.
  A trial ends when every frame is delivered or refused; msg/s counts the delivered ones. It
  does not pace the sender: what a user gets from a peer that sends faster is the limit, and the
  refusals are reported beside the figure.
- LIFTED: the rate limit lifted (LIFTED_LIMITS): the raw capacity of the path.
A frame neither delivered nor refused by TRIAL_DEADLINE_S (none should be) ends the trial too,
reported as unaccounted.

Each runs twice per trial: plaintext, and with CURVE on the connection (keys derived from the
two identities, the ZAP handler answering, the gate binding frames to the connection, as
`[security].curve` does in the node). `curve ratio` = CURVE msg/s ÷ blocking msg/s, goal ≥ 0.6
at 20 KB (issue #14); `curve/plain` = what encryption costs the trio side.

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
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from multiprocessing.connection import Connection

import numpy as np
import trio
import zmq

from p2pnode.metrics import Metrics
from p2pnode.wire.gate import Gate
from p2pnode.wire.inbound.reader import Inbound
from p2pnode.wire.inbound.supervisor import Ingress, ingress_fork_server
from p2pnode.wire.settings import SecuritySettings, TransportSettings
from p2pnode.wire.signing import encode
from p2pnode.wire.transport import Transport
from p2pnode.wire.zap import PEERS, PUBLIC, Connections
from p2pnode.wire.zmqtrio import send_waiting
from protocol import Decoder, Encoder, Identity, Model, ReplayGuard, SequenceCounter
from protocol.curve import curve_public_from_ed25519

DEFAULT_SIZES = (1024, 20 * 1024, 200 * 1024)
GOAL_RATIO_20K = 0.7
GOAL_CURVE_RATIO_20K = 0.6
PRESIGNED_BYTES = 256 << 20
CONNECT_TIMEOUT_S = 60  # node A's start (a fresh interpreter) and its connection, handshake included
# A trial ends when every frame is delivered or refused; this is the backstop for frames lost
# in between (none should be), after which it ends and reports them as unaccounted.
TRIAL_DEADLINE_S = 120
DEFAULTS, LIFTED = "defaults", "lifted"
VARIANTS = (DEFAULTS, LIFTED)
# What LIFTED changes: no per-connection flood limit, to measure raw capacity.
LIFTED_LIMITS = {"rate_per_connection": 1_000_000_000, "burst_per_connection": 1_000_000}
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


def trial_settings(variant: str, verify_threads: int = TransportSettings().verify_threads) -> TransportSettings:
    """Node A's and node B's transport settings: a user's defaults, or (LIFTED) with the
    per-connection rate limit lifted to measure raw capacity. (The strangers' budget never
    applies: node A is an admitted peer, sending on the peers' socket.)"""
    defaults = replace(TransportSettings(), verify_threads=verify_threads)
    return replace(defaults, **LIFTED_LIMITS) if variant == LIFTED else defaults


def _signed(encoder: Encoder, body: Model, count: int) -> list[bytes]:
    counter = _counter()
    return [encoder.encode(body, seq=counter.next(), timestamp_us=_clock_us(), round=0) for _ in range(count)]


def run_trio(
    size: int,
    count: int,
    settings: TransportSettings,
    *,
    curve: bool = False,
    presigned: bool = False,
    deadline_s: float = TRIAL_DEADLINE_S,
) -> dict:
    """Node A (a process of its own) sends `count` frames to node B's receive path, both under
    trio with `settings` (CURVE if `curve`; frames signed before the clock if `presigned`).
    Ends when B has delivered or refused every frame, or at `deadline_s`: {"per_s": delivered
    per second, "delivered", "refused": {reason: frames}, "unaccounted": neither, by then}."""
    sender_identity, receiver_identity = Identity.generate(), Identity.generate()
    processes = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited ZeroMQ state

    async def main() -> dict:
        receiver_curve = receiver_identity.curve_keypair() if curve else None
        connections = _connections(sender_identity.public_key, curve)
        receiver = await _start_receiver(settings, receiver_curve, connections)
        endpoint, peers_endpoint = receiver[PUBLIC].endpoint, receiver[PEERS].endpoint
        metrics = Metrics()
        inbound = _receive_path(receiver, settings, sender_identity.public_key, curve, metrics)
        tally = _Tally(count, metrics)
        control, sender_end = processes.Pipe()
        arguments = (sender_end, sender_identity.to_pem(), receiver_identity.public_key, endpoint, peers_endpoint)
        options = {"size": size, "count": count, "settings": settings, "curve": curve, "presigned": presigned}
        sender = processes.Process(target=_send, args=arguments, kwargs=options, daemon=True)
        sender.start()
        try:
            async with trio.open_nursery() as nursery:
                for ingress in receiver.values():
                    nursery.start_soon(ingress.supervise)
                nursery.start_soon(inbound.run, tally.handle)
                nursery.start_soon(_watch, sender)
                with trio.move_on_after(CONNECT_TIMEOUT_S) as connecting:
                    await _message(control)  # connected: the clock starts with the first frame signed
                if connecting.cancelled_caught:
                    raise RuntimeError(f"the sending node did not connect within {CONNECT_TIMEOUT_S} s")
                started = time.perf_counter()
                control.send(_GO)
                nursery.start_soon(tally.watch_refusals)
                with trio.move_on_after(deadline_s):
                    await tally.done.wait()
                elapsed = time.perf_counter() - started
                nursery.cancel_scope.cancel()
        finally:
            with contextlib.suppress(OSError):  # gone already
                control.send(_STOP)
            sender.join(5)
            sender.kill()
            for ingress in receiver.values():
                await ingress.close()
            await receiver[PUBLIC].forks.close()  # the one both share
        if receiver[PUBLIC].messages_read:  # the path measured is a peer's
            raise RuntimeError(f"{receiver[PUBLIC].messages_read} frames read on the public socket, not the peers' one")
        return tally.report(elapsed)

    return trio.run(main)


class _Tally:
    """Node B's account of the trial's frames: delivered, or refused (counted in `metrics` with
    their reason); `done` once every frame sent is one or the other."""

    def __init__(self, count: int, metrics: Metrics) -> None:
        self.count, self.metrics, self.delivered = count, metrics, 0
        self.done = trio.Event()

    def _check(self) -> None:
        if self.delivered + sum(self.metrics.rejections.values()) >= self.count:
            self.done.set()

    async def handle(self, envelope, frame, source) -> None:
        self.delivered += 1
        self._check()

    async def watch_refusals(self) -> None:
        """Refused frames reach no handler: the last frames may be refused ones."""
        while not self.done.is_set():
            await trio.sleep(0.002)
            self._check()

    def report(self, elapsed: float) -> dict:
        refused = dict(self.metrics.rejections)
        return {
            "per_s": self.delivered / elapsed,
            "delivered": self.delivered,
            "refused": refused,
            "unaccounted": self.count - self.delivered - sum(refused.values()),
        }


async def _start_receiver(
    settings: TransportSettings, curve: tuple[bytes, bytes] | None, connections: Connections
) -> dict[str, Ingress]:
    """Node B's two inbound sockets, each in its ingress process as a node's, bound on loopback."""
    forks, counts = ingress_fork_server(), Counter()
    receiver = {
        name: Ingress(name, settings, 64 << 20, curve, connections, counts, forks=forks) for name in (PUBLIC, PEERS)
    }
    for ingress in receiver.values():
        await ingress.start("tcp://127.0.0.1:0")
    return receiver


def _connections(sender_key: bytes, curve: bool) -> Connections:
    """With CURVE, node B's ZAP handler lets node A's transport key onto the peers' socket."""
    sender_transport_key = curve_public_from_ed25519(sender_key)
    return Connections(SecuritySettings(curve=curve), Counter(), lambda key: key == sender_transport_key)


def _receive_path(
    receiver: dict[str, Ingress], settings: TransportSettings, sender_key: bytes, curve: bool, metrics: Metrics
) -> Inbound:
    """Node B's receive path (its inbound sockets in their ingress process, as a node's), with
    node A's key admitted as a peer's: its frames pass the gate as a peer's."""
    guard = ReplayGuard()
    guard.trust(sender_key, 0)
    gate = Gate(settings, 1, lambda key: key == sender_key, curve=curve)
    return Inbound(receiver, Decoder(_NETWORK), guard, gate, metrics, settings, _clock_us)


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
    send `count` frames as the node does, until _STOP (closing earlier could drop frames still
    queued)."""
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

            async def send_all() -> None:
                async for frame in _frames(encoder, body, count, settings.sign_in_thread_bytes, signed):
                    await send_waiting(socket, frame)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_all)
                # _STOP: B has every frame, or its trial ended without them (then stop sending). Asked
                # for seldom while sending: a wake-up per ms would cost the measured side CPU.
                await _message(control, every_s=0.05)
                nursery.cancel_scope.cancel()
        finally:
            await sender.close()

    trio.run(main)


async def _message(control: Connection, every_s: float = 0.001) -> str:
    while not control.poll():
        await trio.sleep(every_s)
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
    """Messages per second, blocking pyzmq: a sender in a process of its own, as node A is,
    signing in a loop (or sending frames signed before the clock starts if `presigned`), and a
    receiver here that decodes, verifies and checks each frame against a replay guard."""
    identity = Identity.generate()
    processes = multiprocessing.get_context("spawn")  # as node A's: a fresh interpreter
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVHWM, TransportSettings().recv_hwm)
    router.setsockopt(zmq.RCVTIMEO, 1000)  # to notice a sender gone, at no cost per frame
    router.bind("tcp://127.0.0.1:0")
    decoder, guard = Decoder(_NETWORK), ReplayGuard()
    guard.trust(identity.public_key, 0)
    control, sender_end = processes.Pipe()
    sender = processes.Process(
        target=_send_blocking,
        args=(sender_end, identity.to_pem(), router.getsockopt_string(zmq.LAST_ENDPOINT)),
        kwargs={"size": size, "count": count, "presigned": presigned},
        daemon=True,
    )
    sender.start()
    try:
        if not control.poll(CONNECT_TIMEOUT_S):
            raise RuntimeError(f"the blocking sender did not connect within {CONNECT_TIMEOUT_S} s")
        control.recv()
        started = time.perf_counter()
        control.send(_GO)
        received = 0
        while received < count:
            try:
                _, frame = router.recv_multipart()
            except zmq.Again:
                if not sender.is_alive():
                    raise RuntimeError(f"the blocking sender exited early, with code {sender.exitcode}") from None
                continue
            envelope = decoder.decode(frame)
            guard.admit(envelope.sender, envelope.seq, envelope.timestamp_us, _clock_us())
            received += 1
        elapsed = time.perf_counter() - started
    finally:
        with contextlib.suppress(OSError):
            control.send(_STOP)
        sender.join(5)
        sender.kill()
        router.close()
        context.term()
    return count / elapsed


def _send_blocking(control: Connection, pem: bytes, endpoint: str, *, size: int, count: int, presigned: bool) -> None:
    """The blocking sender, in its own process: connect, then on _GO sign and send `count`
    frames in a loop, then wait for _STOP (closing earlier could drop frames still queued)."""
    identity, body = Identity.from_pem(pem), _body(size)
    encoder, counter = Encoder(identity, _NETWORK), _counter()
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.SNDHWM, TransportSettings().send_hwm)
    dealer.connect(endpoint)
    frames = _signed(encoder, body, count) if presigned else None
    while not dealer.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
        time.sleep(0.005)
    control.send(_READY)
    control.recv()
    for i in range(count):
        if frames is not None:
            dealer.send(frames[i])
        else:
            dealer.send(encoder.encode(body, seq=counter.next(), timestamp_us=_clock_us(), round=0))
    control.recv()
    dealer.close()
    context.term()


def run(
    sizes=DEFAULT_SIZES,
    *,
    trials: int = 3,
    seconds: float = 1.0,
    verify_threads: int = 2,
    presigned: bool = False,
    deadline_s: float = TRIAL_DEADLINE_S,
) -> dict:
    """Per size, `trials` interleaved trials of the blocking pair and of the trio side, plain and
    with CURVE, each under a user's default transport settings (DEFAULTS) and with the rate limit
    lifted (LIFTED)."""
    results = [_measure(size, trials, seconds, verify_threads, presigned, deadline_s) for size in sizes]
    twenty = next((r for r in results if r["payload_bytes"] == 20 * 1024), None)
    goal_met = None  # the goals are for the whole exchange, signing included
    if twenty is not None and not presigned:
        goal_met = {
            variant: twenty[variant]["ratio"] >= GOAL_RATIO_20K
            and twenty[variant]["curve_ratio"] >= GOAL_CURVE_RATIO_20K
            for variant in VARIANTS
        }
    return {
        "benchmark": "transport",
        "goal": f"ratio >= {GOAL_RATIO_20K} and curve ratio >= {GOAL_CURVE_RATIO_20K} at 20 KiB",
        "goal_met": goal_met,
        "method": f"median of {trials} interleaved trials of ~{seconds:g} s; "
        f"signed MODEL frames{', signed before the clock starts (the receive path alone)' if presigned else ''}, "
        f"loopback TCP, each sender a process of its own, verify_threads={verify_threads}",
        "presigned": presigned,
        "variants": {variant: _changes(trial_settings(variant, verify_threads)) for variant in VARIANTS},
        "adapter": "p2pnode.zmqtrio (ZMQ_FD + ZMQ_EVENTS, NOBLOCK)",
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "results": results,
    }


def _measure(size: int, trials: int, seconds: float, verify_threads: int, presigned: bool, deadline_s: float) -> dict:
    # Calibrate the message count so one trial takes about `seconds` (frames signed ahead are
    # held at once: at most PRESIGNED_BYTES of them).
    probe = max(50, int(2e6 / size))
    count = max(200, int(run_blocking(size, probe, presigned) * seconds))
    if presigned:
        count = max(50, min(count, PRESIGNED_BYTES // size))
    blocking_rates = []
    trio_trials = {(variant, curve): [] for variant in VARIANTS for curve in (False, True)}
    for _ in range(trials):  # interleaved
        blocking_rates.append(run_blocking(size, count, presigned))
        for (variant, curve), outcomes in trio_trials.items():
            settings = trial_settings(variant, verify_threads)
            outcomes.append(run_trio(size, count, settings, curve=curve, presigned=presigned, deadline_s=deadline_s))
    blocking_rate = statistics.median(blocking_rates)
    row = {
        "payload_bytes": size,
        "messages": count,
        "blocking_per_s": round(blocking_rate, 1),
        "blocking_trials": [round(r, 1) for r in blocking_rates],
    }
    for variant in VARIANTS:
        row[variant] = _variant_row(trio_trials[variant, False], trio_trials[variant, True], blocking_rate)
    return row


def _variant_row(plain: list[dict], curve: list[dict], blocking_rate: float) -> dict:
    """One variant's figures at one size: medians of the delivered rates, and every refusal."""
    trio_rate = statistics.median(t["per_s"] for t in plain)
    curve_rate = statistics.median(t["per_s"] for t in curve)
    return {
        "trio_per_s": round(trio_rate, 1),
        "curve_per_s": round(curve_rate, 1),
        "ratio": round(trio_rate / blocking_rate, 3),
        "curve_ratio": round(curve_rate / blocking_rate, 3),
        "curve_over_plain": round(curve_rate / trio_rate, 3) if trio_rate else None,
        "trio_trials": [round(t["per_s"], 1) for t in plain],
        "curve_trials": [round(t["per_s"], 1) for t in curve],
        "frames": sum(t["delivered"] + sum(t["refused"].values()) + t["unaccounted"] for t in plain + curve),
        "refused": dict(sum((Counter(t["refused"]) for t in plain + curve), Counter())),
        "unaccounted": sum(t["unaccounted"] for t in plain + curve),
    }


def _changes(lifted: TransportSettings) -> dict:
    """The transport settings of `lifted` that differ from a user's defaults, as "transport.key"."""
    defaults = TransportSettings()
    return {
        f"transport.{key}": getattr(lifted, key)
        for key in ("rate_per_connection", "burst_per_connection", "verify_threads")
        if getattr(lifted, key) != getattr(defaults, key)
    }


def _refusals(row: dict) -> str:
    """What node B refused (and left unaccounted) of a variant's frames, in all trials."""
    parts = [f"{reason} {n:,}" for reason, n in sorted(row["refused"].items())]
    if row["unaccounted"]:
        parts.append(f"{row['unaccounted']:,} neither delivered nor refused by the deadline")
    return f"{', '.join(parts)} of {row['frames']:,}" if parts else "none"


def format_table(report: dict) -> str:
    lines = [
        f"{'payload':>9} {'messages':>9} {'blocking msg/s':>15} {'limits':>9} {'trio msg/s':>11} {'curve msg/s':>12} "
        f"{'ratio':>7} {'curve ratio':>12} {'curve/plain':>12}  refused"
    ]
    for r in report["results"]:
        for variant in VARIANTS:
            v = r[variant]
            plain_share = f"{v['curve_over_plain']:>12.2f}" if v["curve_over_plain"] is not None else f"{'-':>12}"
            lines.append(
                f"{r['payload_bytes']:>9} {r['messages']:>9} {r['blocking_per_s']:>15.0f} {variant:>9} "
                f"{v['trio_per_s']:>11.0f} {v['curve_per_s']:>12.0f} {v['ratio']:>7.2f} {v['curve_ratio']:>12.2f} "
                f"{plain_share}  {_refusals(v)}"
            )
    goal = report["goal_met"]
    met = {True: "met", False: "NOT met"}
    verdict = "not measured" if goal is None else "; ".join(f"{v}: {met[goal[v]]}" for v in VARIANTS)
    if report.get("presigned"):
        verdict = "not for the receive path alone"
    lines.append(f"goal {report['goal']}: {verdict}. {report['method']}")
    lines.append(f"limits: {DEFAULTS} = a user's [transport] settings; {LIFTED} = {report['variants'][LIFTED]}")
    return "\n".join(lines)


def settings(presigned: bool = False) -> dict:
    """What differs from a user's defaults, as "section.key": value: in the LIFTED runs, the
    rate limit (the DEFAULTS runs change nothing)."""
    lifted = {f"{LIFTED} runs: {key}": value for key, value in _changes(trial_settings(LIFTED)).items()}
    return lifted | ({"frames": "signed before the clock starts"} if presigned else {})


def render(result: dict) -> str:
    """BENCHMARKS.md's table: every run's ratios under a user's defaults beside those with the
    rate limit lifted, what the defaults refused, and the goal at 20 KiB."""
    runs = result["data"]["runs"]
    n = len(runs)
    rows = [
        f"| payload | blocking msg/s ({n} runs) | ratio, defaults | ratio, lifted | curve ratio, defaults "
        f"| curve ratio, lifted | curve/plain, lifted | refused under the defaults ({n} runs) |",
        "|---:|---|---|---|---|---|---|---|",
    ]
    for index, row in enumerate(runs[0]["results"]):
        at = [run["results"][index] for run in runs]
        blocking = [r["blocking_per_s"] for r in at]
        cells = [f"{_number(min(blocking))}–{_number(max(blocking))}"]
        for variant, key in (
            (DEFAULTS, "ratio"),
            (LIFTED, "ratio"),
            (DEFAULTS, "curve_ratio"),
            (LIFTED, "curve_ratio"),
        ):
            cells.append(", ".join(f"{r[variant][key]:.2f}" for r in at))
        cells.append(
            ", ".join(
                "–" if r[LIFTED]["curve_over_plain"] is None else f"{r[LIFTED]['curve_over_plain']:.2f}" for r in at
            )
        )
        cells.append(_refusals(_summed([r[DEFAULTS] for r in at])))
        rows.append(f"| {_size(row['payload_bytes'])} | " + " | ".join(cells) + " |")
    rows.append("")
    rows.append(_goal_line(runs))
    lifted = ", ".join(f"`{key} = {value}`" for key, value in runs[0]["variants"][LIFTED].items())
    method = runs[0]["method"]
    rows.append(f"*defaults*: a user's `[transport]` settings; *lifted*: {lifted} (raw capacity).")
    rows.append(f"{method[0].upper()}{method[1:]}.")
    return "\n".join(rows)


def _summed(rows: list[dict]) -> dict:
    return {
        "frames": sum(r["frames"] for r in rows),
        "refused": dict(sum((Counter(r["refused"]) for r in rows), Counter())),
        "unaccounted": sum(r["unaccounted"] for r in rows),
    }


def _goal_line(runs: list[dict]) -> str:
    goals = [run["goal_met"] for run in runs]
    if any(goal is None for goal in goals):
        return f"Goal ({runs[0]['goal']}): not measured here."
    verdicts = []
    for variant in VARIANTS:
        met = sum(goal[variant] for goal in goals)
        verdicts.append(f"{variant}: met in {met} of {len(goals)} runs")
    return f"Goal ({runs[0]['goal'].replace('>=', '≥')}): " + "; ".join(verdicts) + "."


def _number(value: float) -> str:
    return f"{value:,.0f}".replace(",", " ")


def _size(payload: int) -> str:
    return f"{payload // 1024} KiB" if payload % 1024 == 0 else f"{payload} B"
