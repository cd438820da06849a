"""The Prometheus endpoint holds at most `[metrics].max_connections` connections (issue #27):
idle ones (a slowloris) cannot pile up, nor keep a scrape out, and every connection closed
unanswered is counted by reason."""

from __future__ import annotations

import re
import socket
from collections import Counter

import trio

from p2pnode.operations.prometheus import BUSY, EVICTED, ConnectionSlots

from .helpers import scrape, start_node, wait_until

SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"


def closed_by_the_node(client: socket.socket) -> bool:
    try:
        return client.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False  # open, nothing to read
    except ConnectionResetError:
        return True


def closed_count(text: str, reason: str) -> float:
    (value,) = re.findall(rf'^p2pnode_metrics_connections_closed_total\{{reason="{reason}"\}} (\S+)$', text, re.M)
    return float(value)


async def test_idle_connections_beyond_the_cap_are_closed_and_a_scrape_is_still_answered(tmp_path):
    cap, extra = 4, 3
    # A deadline far beyond the test: what closes idle connections here is the cap alone.
    metrics = {"listen": "127.0.0.1:0", "max_connections": cap, "request_timeout_s": 600}
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, tmp_path / "n", metrics=metrics)
        closed = node.metrics.metrics_connections_closed
        idle = [socket.create_connection(("127.0.0.1", node.metrics_port)) for _ in range(cap + extra)]
        try:
            await wait_until(lambda: closed[EVICTED] == extra, timeout=10)
            await wait_until(lambda: sum(map(closed_by_the_node, idle)) == extra, timeout=10)
            with trio.fail_after(10):  # generous: it takes milliseconds
                answer = (await scrape(node.metrics_port, SCRAPE)).decode()
            assert answer.startswith("HTTP/1.1 200 OK\r\n") and "p2pnode_peers 0.0" in answer
            assert closed_count(answer, EVICTED) == extra + 1  # the scrape took an idle one's place
            await wait_until(lambda: sum(map(closed_by_the_node, idle)) == extra + 1, timeout=10)
        finally:
            for client in idle:
                client.close()
        for _ in range(3):  # once they are gone, scrapes are answered as ever
            with trio.fail_after(10):
                assert (await scrape(node.metrics_port, SCRAPE)).startswith(b"HTTP/1.1 200 OK\r\n")
        assert closed[BUSY] == 0
        assert node.status()["traffic"]["metrics_connections_closed"][EVICTED] >= extra + 1
        node.request_stop()


async def test_a_connection_that_sends_no_request_is_closed_at_the_deadline_and_counted(tmp_path):
    metrics = {"listen": "127.0.0.1:0", "request_timeout_s": 0.2}
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, tmp_path / "n", metrics=metrics)
        with socket.create_connection(("127.0.0.1", node.metrics_port)) as quiet:
            await wait_until(lambda: closed_by_the_node(quiet), timeout=10)
        assert node.metrics.metrics_connections_closed == Counter(timeout=1)
        node.request_stop()


async def test_a_newcomer_takes_the_place_of_the_oldest_waiting_connection_or_is_refused_if_all_are_answered():
    closed: Counter[str] = Counter()
    slots = ConnectionSlots(2, closed)
    first, second, third, fourth = (trio.CancelScope() for _ in range(4))
    assert slots.admit(first) and slots.admit(second)
    slots.answer(second)
    assert slots.admit(third)  # in the place of `first`, the oldest still sending its request
    assert first.cancel_called and not second.cancel_called and closed == Counter(evicted=1)
    slots.answer(first)  # its request came in just as it was evicted: it keeps no place
    slots.answer(third)
    assert not slots.admit(fourth) and not fourth.cancel_called  # all answering: the newcomer goes
    assert closed == Counter(evicted=1, busy=1)
    slots.release(second)
    slots.release(first)
    assert slots.admit(fourth) and closed == Counter(evicted=1, busy=1)
