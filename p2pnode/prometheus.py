"""An optional Prometheus endpoint: `GET /metrics` on `[metrics].listen`, served by trio.

prometheus_client's own server runs in a thread of its own; this one is a task in the node's
nursery like everything else, and reads the node's counters at scrape time (no copies to keep
in step) through the handles the node passes in. Requests are bounded: a few KiB of headers, a
deadline, one request per connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from .learning import RoundDriver
    from .metrics import Metrics

__all__ = ["NodeCollector", "serve_prometheus", "registry_for"]

log = logging.getLogger("p2pnode.prometheus")

MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT_S = 5.0


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


async def serve_prometheus(
    host: str, port: int, render: Callable[[], bytes], *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    async def handle(stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                request = b""
                while b"\r\n\r\n" not in request and len(request) < MAX_REQUEST_BYTES:
                    chunk = await stream.receive_some(MAX_REQUEST_BYTES)
                    if not chunk:
                        return
                    request += chunk
                first = request.split(b"\r\n", 1)[0].split()
                if len(first) >= 2 and first[0] == b"GET" and first[1].split(b"?")[0] == b"/metrics":
                    status, body, kind = b"200 OK", render(), b"text/plain; version=0.0.4; charset=utf-8"
                else:
                    status, body, kind = b"404 Not Found", b"try GET /metrics\n", b"text/plain"
                await stream.send_all(
                    b"HTTP/1.1 "
                    + status
                    + b"\r\nContent-Type: "
                    + kind
                    + b"\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\nConnection: close\r\n\r\n"
                    + body
                )
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()

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
