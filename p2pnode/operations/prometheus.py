"""An optional Prometheus endpoint: `GET /metrics` on `[metrics].listen`, served by trio.

prometheus_client's own server runs in a thread of its own; this one is a task in the node's
nursery like everything else, and reads the node's counters at scrape time (no copies to keep
in step) through the handles the node passes in. Requests are bounded ([metrics]): a few KiB of
headers, a deadline, one request per connection, a cap on connections at once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from ..learning.driver import RoundDriver
    from ..metrics import Metrics
    from ..operations.settings import MetricsSettings

__all__ = ["NodeCollector", "serve_prometheus", "registry_for"]

log = logging.getLogger("p2pnode.prometheus")


class NodeCollector:
    """Turns the node's counters and the round driver's state into Prometheus metrics."""

    def __init__(
        self, metrics: Metrics, peer_count: Callable[[], int], driver: Callable[[], RoundDriver | None]
    ) -> None:
        self.metrics = metrics
        self.peer_count = peer_count
        self.driver = driver

    def collect(self) -> Iterator[Metric]:
        metrics = self.metrics
        peers = GaugeMetricFamily("p2pnode_peers", "admitted peers")
        peers.add_metric([], self.peer_count())
        yield peers
        for name, helptext, counter in (
            ("p2pnode_messages_sent", "frames sent, by message type", metrics.messages_out),
            ("p2pnode_bytes_sent", "frame bytes sent, by message type", metrics.bytes_out),
            ("p2pnode_messages_received", "frames received and accepted, by message type", metrics.messages_in),
            ("p2pnode_bytes_received", "frame bytes received and accepted, by message type", metrics.bytes_in),
            (
                "p2pnode_sends_dropped",
                "frames not sent (peer queue full or not connected), by type",
                metrics.send_dropped,
            ),
            (
                "p2pnode_sends_refused",
                "frames not signed: no sequence number reserved (the data directory is full), by type",
                metrics.send_refused,
            ),
        ):
            family = CounterMetricFamily(name, helptext, labels=["type"])
            for kind, value in sorted(counter.items()):
                family.add_metric([kind], value)
            yield family
        rejected = CounterMetricFamily(
            "p2pnode_rejections", "refused frames and payloads, by reason", labels=["reason"]
        )
        for reason, value in sorted(metrics.rejections.items()):
            rejected.add_metric([reason], value)
        yield rejected
        state = CounterMetricFamily(
            "p2pnode_state_write_failures", "failed saves of the sequence reservation to the data directory"
        )
        state.add_metric([], metrics.state_write_failures)
        yield state
        closed = CounterMetricFamily(
            "p2pnode_metrics_connections_closed",
            "connections to this endpoint closed unanswered ([metrics].max_connections, request_timeout_s), by reason",
            labels=["reason"],
        )
        for reason, value in sorted(metrics.metrics_connections_closed.items()):
            closed.add_metric([reason], value)
        yield closed
        driver = self.driver()
        if driver is not None:
            yield from _learning(driver)


def _learning(driver: RoundDriver) -> Iterator[Metric]:
    state = driver.state
    round_ = GaugeMetricFamily("p2pnode_round", "the learning round in progress")
    round_.add_metric([], state.round)
    yield round_
    completed = GaugeMetricFamily(
        "p2pnode_rounds_completed", "learning rounds completed (the last one finished + 1), as status's `completed`"
    )
    completed.add_metric([], state.completed)
    yield completed
    last = state.history[-1] if state.history else None
    if last is not None:
        accuracy = GaugeMetricFamily("p2pnode_accuracy", "accuracy on the node's own test split, last round")
        accuracy.add_metric([], last.accuracy)
        yield accuracy
        weights = GaugeMetricFamily(
            "p2pnode_neighbour_weight", "learned collaboration weight, by peer", labels=["peer"]
        )
        for peer, weight in sorted(last.weights.items()):
            if weight > 0:
                weights.add_metric([peer], weight)
        yield weights
    failures = CounterMetricFamily(
        "p2pnode_checkpoint_failures", "checkpoints not saved (the previous one stays), e.g. on a full disk"
    )
    failures.add_metric([], driver.checkpoint_failures)
    yield failures
    if driver.history is not None:
        lost = CounterMetricFamily(
            "p2pnode_history_failures", "round records not written to history.jsonl (e.g. on a full disk)"
        )
        lost.add_metric([], driver.history.failures)
        yield lost
    missing = CounterMetricFamily(
        "p2pnode_missing_payloads", "expected payloads that did not arrive in time, by peer", labels=["peer"]
    )
    for peer, value in sorted(state.missing.items()):
        missing.add_metric([peer], value)
    yield missing


def registry_for(collector: NodeCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


# Why a connection was closed unanswered (Metrics.metrics_connections_closed, by reason).
EVICTED = "evicted"  # still sending its request when a newcomer needed its place
BUSY = "busy"  # came when every place was taken by a connection being answered
TIMEOUT = "timeout"  # request and answer not done within request_timeout_s


class ConnectionSlots:
    """At most `capacity` connections at once, so that idle ones cannot pile up (a slowloris).
    A newcomer beyond it takes the place of the oldest connection still sending its request,
    which is cancelled; a scrape sends its request at once, so what is closed is the one that
    waits longest, not the one that just came. Only if every place is taken by a connection
    being answered (each within the deadline) is the newcomer closed instead."""

    def __init__(self, capacity: int, closed: Counter[str]) -> None:
        self.capacity = capacity
        self.closed = closed
        self.waiting: dict[trio.CancelScope, None] = {}  # reading their request, oldest first
        self.answering: set[trio.CancelScope] = set()

    def admit(self, connection: trio.CancelScope) -> bool:
        if len(self.waiting) + len(self.answering) >= self.capacity:
            if not self.waiting:
                self.closed[BUSY] += 1
                return False
            oldest = next(iter(self.waiting))
            del self.waiting[oldest]
            oldest.cancel()
            self.closed[EVICTED] += 1
        self.waiting[connection] = None
        return True

    def answer(self, connection: trio.CancelScope) -> None:
        """The request is in: from now on the connection keeps its place until it is done."""
        if connection in self.waiting:  # else evicted as its request came in: it is cancelled
            del self.waiting[connection]
            self.answering.add(connection)

    def release(self, connection: trio.CancelScope) -> None:
        self.waiting.pop(connection, None)
        self.answering.discard(connection)


async def _read_request(stream: trio.SocketStream, max_bytes: int) -> bytes | None:
    """The request up to its blank line or `max_bytes`, whichever first; None if the client left."""
    request = b""
    while b"\r\n\r\n" not in request and len(request) < max_bytes:
        chunk = await stream.receive_some(max_bytes - len(request))
        if not chunk:
            return None
        request += chunk
    return request


def _answer(request: bytes, render: Callable[[], bytes]) -> bytes:
    first = request.split(b"\r\n", 1)[0].split()
    if len(first) >= 2 and first[0] == b"GET" and first[1].split(b"?")[0] == b"/metrics":
        status, body, kind = b"200 OK", render(), b"text/plain; version=0.0.4; charset=utf-8"
    else:
        status, body, kind = b"404 Not Found", b"try GET /metrics\n", b"text/plain"
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\nContent-Type: "
        + kind
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: close\r\n\r\n"
        + body
    )


async def serve_prometheus(
    settings: MetricsSettings,
    render: Callable[[], bytes],
    closed: Counter[str],
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `GET /metrics` on `settings.listen`, one request per connection, at most
    `max_connections` at once; connections closed unanswered are counted in `closed`."""
    slots = ConnectionSlots(settings.max_connections, closed)

    async def handle(stream: trio.SocketStream) -> None:
        connection = trio.CancelScope()
        try:
            if not slots.admit(connection):
                return
            with connection, trio.move_on_after(settings.request_timeout_s) as deadline:
                request = await _read_request(stream, settings.max_request_bytes)
                if request is None:
                    return
                slots.answer(connection)
                await stream.send_all(_answer(request, render))
            if deadline.cancelled_caught:
                closed[TIMEOUT] += 1
        except trio.BrokenResourceError:
            pass
        finally:
            slots.release(connection)
            await stream.aclose()

    assert settings.host_port is not None
    host, port = settings.host_port
    listeners = await trio.open_tcp_listeners(port, host=host)
    log.info("Prometheus metrics on http://%s:%d/metrics", host, listeners[0].socket.getsockname()[1])
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


def render_for(
    metrics: Metrics, peer_count: Callable[[], int], driver: Callable[[], RoundDriver | None]
) -> Callable[[], bytes]:
    """The text of a scrape, rendered afresh each call from the handles given."""
    registry = registry_for(NodeCollector(metrics, peer_count, driver))
    return lambda: generate_latest(registry)
