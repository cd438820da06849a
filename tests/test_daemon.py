"""Real daemons, real sockets, in this process (pytest-trio)."""

import json
import re
import threading

import pytest
import trio
import zmq

from p2pnode.config import load_config
from p2pnode.node import Node, NodeStartError
from p2pnode_cli import main as cli
from protocol import Identity

from .helpers import ANY_PORT, free_udp_port, full_mesh, start_chain, start_node, wait_until, write_config


async def test_three_nodes_with_one_bootstrap_each_reach_a_full_mesh(tmp_path):
    async with trio.open_nursery() as nursery:
        nodes = await start_chain(nursery, tmp_path, 3)
        await wait_until(lambda: full_mesh(nodes), timeout=30)  # a hang fails; the machine's load may not
        # Liveness keeps it: every peer answered a PING and has a round-trip time.
        await wait_until(
            lambda: all(p.rtt_s is not None for n in nodes for p in n.membership.peers.values()), timeout=5
        )
        status = nodes[0].status()
        # A PING may overtake the PEERS that completes a handshake (verify threads finish out of
        # order) and be ignored as `unknown_peer`; nothing else may be refused.
        assert status["peer_count"] == 2 and set(status["traffic"]["rejections"]) <= {"unknown_peer"}
        assert {"HELLO", "PEERS", "PING", "PONG"} <= set(status["traffic"]["by_type"])
        for node in nodes:
            node.request_stop()


async def test_a_node_off_the_allowlist_gets_nothing_through(tmp_path):
    a_id, b_id = Identity.generate(), Identity.generate()
    allow = {"allowlist": [a_id.public_key.hex(), b_id.public_key.hex()]}
    async with trio.open_nursery() as nursery:
        na = await start_node(nursery, tmp_path / "a", identity=a_id, security=allow)
        nb = await start_node(nursery, tmp_path / "b", [na.address], identity=b_id, security=allow)
        nc = await start_node(nursery, tmp_path / "c", [na.address])
        await wait_until(lambda: full_mesh([na, nb]), timeout=10)
        await wait_until(lambda: na.metrics.rejections["not_allowed"] >= 3, timeout=10)
        # Not a pause to show that nothing happens: c keeps knocking (its bootstrap is retried
        # forever) and is refused each time; three more refusals span several of its retries.
        refused = na.metrics.rejections["not_allowed"]
        await wait_until(lambda: na.metrics.rejections["not_allowed"] >= refused + 3, timeout=10)
        assert nc.identity.public_key not in na.membership.peers and nc.identity.public_key not in nb.membership.peers
        assert not nc.membership.peers  # c never hears back
        for node in (na, nb, nc):
            node.request_stop()


async def test_lan_beacon_finds_peers_without_bootstrap(tmp_path):
    beacon = {"enabled": True, "interface": "127.0.0.1", "port": free_udp_port(), "interval_s": 0.2}
    async with trio.open_nursery() as nursery:
        nodes = [await start_node(nursery, tmp_path / f"n{i}", beacon=beacon) for i in range(3)]  # no bootstrap
        await wait_until(lambda: full_mesh(nodes), timeout=10)
        for node in nodes:
            node.request_stop()


async def test_a_data_directory_serves_one_node_only(tmp_path):
    async with trio.open_nursery() as nursery:
        first = await start_node(nursery, tmp_path / "n")
        config = first.config
        with pytest.raises(NodeStartError, match=r"\[node\].data_dir: another p2pnode \(pid \d+\)"):
            await Node(config).run()
        first.request_stop()


async def test_a_busy_metrics_port_stops_the_start_with_every_problem_named(tmp_path):
    import socket

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        config = load_config(write_config(tmp_path / "n", ANY_PORT, metrics={"listen": f"127.0.0.1:{port}"}))
        with trio.fail_after(30), pytest.raises(NodeStartError) as caught:
            await Node(config).run()  # raised as itself, after the node's nursery has exited
    assert caught.value.problems == (f"[metrics].listen: cannot listen on 127.0.0.1:{port}: Address already in use",)
    assert not config.control_socket.exists()  # the control socket it had opened is gone again


async def test_busy_address_is_a_start_error_and_leaves_nothing_behind(tmp_path):
    context = zmq.Context()
    blocker = context.socket(zmq.ROUTER)
    blocker.bind(ANY_PORT)  # the address is held by the blocker from here on: no other process can take it
    try:
        busy = blocker.getsockopt_string(zmq.LAST_ENDPOINT)
        config = load_config(write_config(tmp_path / "n", busy))
        with pytest.raises(NodeStartError, match=r"\[node\].listen: cannot bind .*Address already in use"):
            await Node(config).run()
    finally:
        blocker.close(linger=0)
        context.term()
    assert not config.control_socket.exists()
    # The data directory's lock was released: the same node (key, data directory) starts now.
    config = load_config(write_config(tmp_path / "n", ANY_PORT))
    async with trio.open_nursery() as nursery:
        node = await nursery.start(Node(config).run)
        node.request_stop()


async def test_status_and_stop_through_the_cli_and_a_clean_exit(tmp_path, capsys):
    baseline = {t.name for t in threading.enumerate()}
    async with trio.open_nursery() as nursery:
        a, b = await start_chain(nursery, tmp_path, 2)
        await wait_until(lambda: full_mesh([a, b]), timeout=10)
        assert await trio.to_thread.run_sync(cli, ["status", "--config", str(a.config.source)]) == 0
        table = capsys.readouterr().out
        assert a.identity.node_id in table and b.identity.node_id in table and "rejections: none" in table
        assert await trio.to_thread.run_sync(cli, ["status", "--config", str(a.config.source), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert 10 < status["rss_mb"] < 10_000 and status["peak_rss_mb"] >= status["rss_mb"] - 1  # this process's
        assert re.search(r"pid \d+  rss \d+ MB \(peak \d+ MB\)\n", table), table
        # The fleet in one table, a node of it that is not running included (issue #45).
        write_config(tmp_path / "n9", ANY_PORT)
        assert await trio.to_thread.run_sync(cli, ["status", "--fleet", str(tmp_path)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split() == ["config", "node", "phase", "rounds", "peers", "accuracy", "local", "gain"]
        rows = {line.split()[0]: line.split() for line in lines[1:]}
        assert set(rows) == {"n0/node.toml", "n1/node.toml", "n9/node.toml"}, lines
        assert rows["n0/node.toml"][1:3] == [a.identity.node_id, "none"] and rows["n0/node.toml"][4] == "1"
        assert rows["n1/node.toml"][1] == b.identity.node_id
        assert " ".join(rows["n9/node.toml"][1:]).startswith("no node is running with this configuration")
        assert await trio.to_thread.run_sync(cli, ["stop", "--config", str(a.config.source)]) == 0
        await wait_until(lambda: b.membership.counts["evicted_bye"] == 1, timeout=2)  # a said BYE
        b.request_stop()
    assert a.transport.context.closed and b.transport.context.closed
    assert not a.config.control_socket.exists()
    leftover = {t.name for t in threading.enumerate()} - baseline
    assert all(name.startswith("Trio thread") for name in leftover), leftover  # only trio's idle thread cache


async def test_control_socket_answers_bad_requests(tmp_path):
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, tmp_path / "n")
        config = node.config
        stream = await trio.open_unix_socket(str(config.control_socket))
        async with stream:
            await stream.send_all(b'{"command": "dance"}\n')
            assert b"unknown command" in await stream.receive_some(4096)
        stream = await trio.open_unix_socket(str(config.control_socket))
        async with stream:
            await stream.send_all(b"[1, 2]\n")
            assert b"bad request" in await stream.receive_some(4096)
        node.request_stop()


async def test_an_unreachable_bootstrap_and_peers_coming_and_going_are_logged(tmp_path, caplog):
    """The log says when the bootstrap does not answer (once, after `dial_attempts`
    challenges; it is still retried) and when a peer is admitted or evicted, with the count."""
    import logging
    import socket

    caplog.set_level(logging.INFO, logger="p2pnode")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    quick = {"dial_attempts": 3, "dial_retry_initial_s": 0.02, "dial_retry_max_s": 0.1}
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, tmp_path / "a", [dead], discovery=quick)
        await wait_until(lambda: a.membership.counts["bootstrap_unreachable"] == 1, timeout=10)
        b = await start_node(nursery, tmp_path / "b", [a.address])
        await wait_until(lambda: full_mesh([a, b]), timeout=10)
        b.request_stop()  # its BYE evicts it at once
        await wait_until(lambda: not a.membership.peers, timeout=10)
        assert dead in a.membership.dialing and a.membership.counts["bootstrap_unreachable"] == 1
        a.request_stop()
    said = [record.getMessage() for record in caplog.records if record.name == "p2pnode.node"]
    (unreachable,) = [line for line in said if line.startswith(f"bootstrap {dead} unreachable")]
    assert unreachable.startswith(f"bootstrap {dead} unreachable: 3 challenges unanswered in ")
    assert "still retrying" in unreachable and "[discovery].bootstrap" in unreachable
    assert f"peer {b.identity.node_id} admitted at {b.address} (1/64 peers)" in said
    assert f"peer {b.identity.node_id} evicted (bye; 0/64 peers left)" in said
