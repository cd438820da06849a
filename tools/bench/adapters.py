"""`p2pnode bench adapters`: how fast a ROUTER takes in raw frames under each trio ↔ ZeroMQ
integration, next to a blocking receive loop. The sender is the same blocking thread in every
case and nothing is signed, so only the receiving adapter differs (the node's inbound socket is
what the adapter drives). This is how p2pnode.zmqtrio was chosen over zmq-anyio
(BENCHMARKS.md); zmq-anyio is measured when installed (`pip install zmq-anyio==0.4.1`).
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time

import trio
import zmq

from p2pnode.wire.settings import TransportSettings
from p2pnode.wire.zmqtrio import receive_batch

DEFAULT_SIZES = (1024, 20 * 1024, 200 * 1024)
_HWM = 1000
_DEFAULTS = TransportSettings()  # the node's own batch bounds


def _pair(context: zmq.Context) -> tuple[zmq.Socket, zmq.Socket]:
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    for socket in (router, dealer):
        socket.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVHWM, _HWM)
    dealer.setsockopt(zmq.SNDHWM, _HWM)
    router.bind("tcp://127.0.0.1:0")
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    while not dealer.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
        time.sleep(0.005)
    return router, dealer


def _measure(size: int, count: int, receive) -> float:
    """Messages per second while `receive(router, count)` takes `count` frames from a blocking sender."""
    payload = os.urandom(size)
    context = zmq.Context()
    router, dealer = _pair(context)
    sender = threading.Thread(target=lambda: [dealer.send(payload) for _ in range(count)])
    try:
        started = time.perf_counter()
        sender.start()
        receive(router, count)
        elapsed = time.perf_counter() - started
    finally:
        sender.join()
        router.close()
        dealer.close()
        context.term()
    return count / elapsed


def _blocking(router: zmq.Socket, count: int) -> None:
    for _ in range(count):
        router.recv_multipart()


def _zmqtrio(router: zmq.Socket, count: int) -> None:
    async def main() -> None:
        received = 0
        while received < count:
            received += len(await receive_batch(router, _DEFAULTS.verify_batch, _DEFAULTS.verify_batch_bytes))

    trio.run(main)


def _zmq_anyio(router: zmq.Socket, count: int) -> None:
    import zmq_anyio

    async def main() -> None:
        async with zmq_anyio.Socket(router) as socket:
            for _ in range(count):
                await socket.arecv_multipart().wait()

    trio.run(main)


def _has_zmq_anyio() -> bool:
    try:
        import zmq_anyio  # noqa: F401
    except ImportError:
        return False
    return True


def run(sizes=DEFAULT_SIZES, *, trials: int = 3, seconds: float = 0.5) -> dict:
    results = []
    for size in sizes:
        count = max(200, int(_measure(size, max(100, int(2e6 / size)), _blocking) * seconds))
        rates: dict[str, list[float]] = {"blocking": [], "zmqtrio": [], "zmq_anyio": []}
        for _ in range(trials):
            rates["blocking"].append(_measure(size, count, _blocking))
            rates["zmqtrio"].append(_measure(size, count, _zmqtrio))
            if _has_zmq_anyio():
                # ~10x slower: a tenth of the messages keeps its trial about as long.
                rates["zmq_anyio"].append(_measure(size, max(100, count // 10), _zmq_anyio))
        base = statistics.median(rates["blocking"])
        row = {"payload_bytes": size, "messages": count}
        for name, values in rates.items():
            row[f"{name}_per_s"] = round(statistics.median(values), 1) if values else None
            row[f"{name}_ratio"] = round(statistics.median(values) / base, 3) if values else None
        results.append(row)
    return {
        "benchmark": "adapters",
        "method": f"median of {trials} interleaved trials of ~{seconds:g} s; "
        f"unsigned frames from a blocking sender thread, loopback TCP, HWM {_HWM}",
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "results": results,
    }


def format_table(report: dict) -> str:
    lines = [f"{'payload':>9} {'blocking/s':>11} {'zmqtrio/s':>10} {'ratio':>6} {'zmq-anyio/s':>12} {'ratio':>6}"]
    for r in report["results"]:
        anyio = (
            "not installed"
            if r["zmq_anyio_per_s"] is None
            else f"{r['zmq_anyio_per_s']:>12.0f} {r['zmq_anyio_ratio']:>6.2f}"
        )
        lines.append(
            f"{r['payload_bytes']:>9} {r['blocking_per_s']:>11.0f} {r['zmqtrio_per_s']:>10.0f} "
            f"{r['zmqtrio_ratio']:>6.2f} {anyio:>19}"
        )
    lines.append(report["method"])
    return "\n".join(lines)


def settings() -> dict:
    """What differs from a user's defaults: nothing (raw frames, no daemon settings)."""
    return {}


def render(result: dict) -> str:
    """BENCHMARKS.md's table: each run's blocking rate, and each adapter's rate against it."""
    runs = result["data"]["runs"]

    def cells(index: int, key: str, scale: float = 1.0, digits: int = 2) -> str:
        values = [run["results"][index][key] for run in runs]
        if None in values:
            return "not installed"
        return ", ".join(f"{value / scale:.{digits}f}" for value in values)

    rows = [
        "| payload | blocking recv/s, k | zmqtrio / blocking | zmq-anyio / blocking |",
        "|---:|---:|---|---|",
    ]
    for index, row in enumerate(runs[0]["results"]):
        rows.append(
            f"| {row['payload_bytes'] // 1024} KiB | {cells(index, 'blocking_per_s', 1000, 0)} | "
            f"{cells(index, 'zmqtrio_ratio')} | {cells(index, 'zmq_anyio_ratio')} |"
        )
    rows += ["", f"One value per run, in order; each the {runs[0]['method']}."]
    return "\n".join(rows)
