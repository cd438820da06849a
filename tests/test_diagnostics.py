"""Diagnostics that name the cause (issue #28): a bootstrap entry whose key is not the key of the
node at its address, peers left out of learning and why, refusals and failed handshakes by
reason in the status table, and the images per class a node found and held out."""

import logging
import re

import numpy as np
import trio

from p2pnode.discovery.capabilities import (
    announced_algorithm,
    labels_capability,
    learning_capability,
    learning_verdict,
)
from p2pnode.learning.algorithm import data_summary
from p2pnode.operations.doctor import diagnose
from p2pnode.operations.status import format_status
from p2pnode.wire.zap import PEERS
from protocol import Identity
from protocol.messages import client_address

from .adversarial.attacker import Attacker
from .helpers import bootstrap_entry, free_ports, full_mesh, start_node, wait_until

QUICK = {"dial_attempts": 3, "dial_retry_initial_s": 0.05, "dial_retry_max_s": 0.2}


def _said(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "p2pnode.node"]


async def test_a_bootstrap_entry_with_another_key_is_named_as_such(tmp_path, caplog):
    """Two daemons with CURVE: a's second bootstrap entry points at b's address with a key that
    is not b's. a says which entry, that the node there has another key and how often the
    handshake failed, instead of "unreachable"; both status tables count the failures. A node
    that refuses a's key (an allowlist) is named as refusing, and a dead address stays
    "unreachable"."""
    caplog.set_level(logging.INFO, logger="p2pnode")
    curve = {"security": {"curve": True}}
    async with trio.open_nursery() as nursery:
        b = await start_node(nursery, tmp_path / "b", **curve)
        wrong = Identity.generate().public_key.hex()
        closed = Identity.generate()  # c admits only this key, which no node holds
        c = await start_node(nursery, tmp_path / "c", security={"curve": True, "allowlist": [closed.public_key.hex()]})
        bootstrap = [f"{wrong}@{b.address}", f"{c.identity.public_key.hex()}@{c.address}"]
        a = await start_node(nursery, tmp_path / "a", bootstrap, discovery=QUICK, **curve)
        await wait_until(lambda: a.membership.counts["bootstrap_unreachable"] >= 2, timeout=20)
        status = a.status()
        for node in (a, b, c):
            node.request_stop()
    said = _said(caplog)
    (another_key,) = [line for line in said if line.startswith("bootstrap entry 1: ")]
    assert another_key.startswith(f"bootstrap entry 1: the node at {b.address} has another key (or CURVE off); ")
    times = re.search(r"handshake failed (once|(\d+) times) in ", another_key)
    failed = int(times[2] or 1)
    assert failed >= 1 and "still retrying" in another_key and "p2pnode keyinfo" in another_key
    (refused,) = [line for line in said if line.startswith("bootstrap entry 2: ")]
    assert refused.startswith(f"bootstrap entry 2: the node at {c.address} refused this node's connection ")
    assert not [line for line in said if "unreachable" in line]
    connections = status["traffic"]["connections"]
    assert connections["dial_handshake_failed"] >= failed and connections["dial_handshake_refused"] >= 1
    table = format_status(status)
    assert "connections refused or failed: dial_handshake_failed" in table, table
    assert b.status()["traffic"]["connections"]["handshake_failed"] >= 1
    assert c.status()["traffic"]["connections"]["zap_denied_allowlist"] >= 1


def test_why_a_peer_is_not_a_learning_peer():
    ours = labels_capability(("cat", "dog"))
    theirs = labels_capability(("dog", "cat"))
    mapl = learning_capability("mapl")
    assert learning_verdict("mapl", ours, (mapl, *ours, "gpu")) is None
    assert learning_verdict("mapl", (), (mapl,)) is None  # both on a benchmark dataset
    assert learning_verdict("mapl", ours, ("gpu",)) == "runs no learning algorithm"
    assert (
        learning_verdict("mapl", ours, (learning_capability("mapl+"), *ours))
        == "learns with mapl+, this node with mapl"
    )
    assert learning_verdict("mapl", ours, (mapl, *theirs)) == (
        f"learns over other classes: it announces {theirs[0]}, this node {ours[0]}"
    )
    assert learning_verdict("mapl", ours, (mapl,)).startswith("learns on a benchmark dataset, this node on its own")
    assert learning_verdict("mapl", (), (mapl, *ours)).startswith("learns on its own data ([data].path), this node on")
    assert announced_algorithm((learning_capability("mapl+"),)) == "mapl+" and announced_algorithm(("gpu",)) is None


def _status(**learning) -> dict:
    """A node's status as `Node.status` gives it, cut to what the table reads."""
    peers = [
        {"node_id": "a" * 16, "address": "tcp://10.0.0.2:7000", "last_seen_s": 0.2, "rtt_ms": 1.5},
        {"node_id": "b" * 16, "address": "tcp://10.0.0.3:7000", "last_seen_s": 0.4, "rtt_ms": None},
    ]
    traffic = {
        "by_type": {},
        **dict.fromkeys(("messages_in", "bytes_in", "messages_out", "bytes_out"), 0),
        "rejections": {"not_allowed": 3, "wrong_network": 1},
        "send_dropped": {},
        "connections": {
            "accepted": 9,
            "dial_handshake_failed": 8,
            "handshake_failed": 266,
            "handshake_succeeded": 7,
            "zap_denied_allowlist": 2,
        },
    }
    node = {"node_id": "c" * 16, "address": "tcp://10.0.0.1:7000", "network": "lab", "uptime_s": 27.0}
    return {**node, "round": 0, "pid": 1, "peer_count": 2, "max_peers": 64, "dialing": [], "peers": peers} | {
        "traffic": traffic,
        "learning": learning or None,
    }


def test_the_status_table_names_excluded_peers_and_failed_connections_by_reason():
    learning = {
        "algorithm": "mapl",
        "phase": "training",
        "completed": 3,
        "rounds": 60,
        "accuracy": 0.9,
        "resumed_from": None,
        "catch_ups": 0,
        "neighbours": {},
        "last_payloads": {},
        "missing_payloads": {},
        "excluded": {"b" * 16: "learns with mapl+, this node with mapl"},
    }
    table = format_status(_status(**learning)).splitlines()
    assert "peers 2/64  (1 not learning with this node: see below)" in table
    (row_a,) = [line for line in table if line.startswith("  " + "a" * 16)]
    (row_b,) = [line for line in table if line.startswith("  " + "b" * 16)]
    assert "not learning" not in row_a
    assert row_b.endswith("  not learning with it: it learns with mapl+, this node with mapl")
    assert "rejections: not_allowed 3, wrong_network 1" in table
    # Accepted and succeeded connections are no news; the failed and refused ones, each by reason, are.
    assert (
        "connections refused or failed: dial_handshake_failed 8, handshake_failed 266, zap_denied_allowlist 2" in table
    )
    plain = format_status(_status()).splitlines()  # no learning: no exclusions
    assert "peers 2/64" in plain and not [line for line in plain if "not learning" in line]


def test_the_status_table_keeps_its_columns_for_a_client_node_s_long_address():
    status = _status()
    status["peers"][1]["address"] = client_address(bytes(range(32)))  # 49 characters
    header, row_a, row_b = _peer_rows(status)
    column = header.index("last seen") + len("last seen")  # right-aligned: the column ends there
    assert all(row[:column].endswith("s") and row[column] == " " for row in (row_a, row_b)), (header, row_a, row_b)
    assert status["peers"][1]["address"] + " " in row_b


def _peer_rows(status: dict) -> list[str]:
    lines = format_status(status).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  node id"))
    return lines[start : start + 3]


RACE_LINE = (
    "start-up race (resolved): zap_denied_not_peer {} from keys admitted as peers within "
    "[security].not_peer_race_s after (normal when nodes start together; not counted above)"
)


def test_the_start_up_race_is_shown_apart_from_refusals():
    """Issue #45: a peer's connection refused before this node admitted it, and the handshake it
    failed, are no trouble once that peer is admitted: a line of their own, and the refusals
    line only where something else was refused."""
    status = _status()
    race = {"handshake_failed": 3, "handshake_succeeded": 4, "zap_denied_not_peer": 3, "not_peer_race_resolved": 3}
    status["traffic"]["connections"] = race
    table = format_status(status).splitlines()
    assert RACE_LINE.format(3) in table
    assert not [line for line in table if line.startswith("connections refused or failed")], table
    # A stranger's refusal (and its handshake) stays one.
    status["traffic"]["connections"] = {**race, "handshake_failed": 4, "zap_denied_not_peer": 4}
    table = format_status(status).splitlines()
    assert "connections refused or failed: handshake_failed 1, zap_denied_not_peer 1" in table
    assert RACE_LINE.format(3) in table


async def test_a_real_status_tells_the_start_up_race_from_a_strangers_refusal(tmp_path):
    """A daemon with CURVE: a peer's key knocks at its peers' socket before it is admitted (the
    start-up race, forced here), then its node starts and is admitted; a stranger knocks too. The
    status table shows the peer's refusal as the race, the stranger's as a refusal."""
    curve = {"security": {"curve": True}}
    peer = Identity.generate()
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, tmp_path / "a", **curve)
        early, stranger = (
            Attacker(a.ingress[PEERS].endpoint, curve=(who, a.identity.public_key))
            for who in (peer, Identity.generate())
        )
        try:
            for knocker in (early, stranger):
                await knocker.send(b"knock")  # queued until a handshake that is refused
            connections = a.metrics.connections
            await wait_until(lambda: connections["zap_denied_not_peer"] >= 2, timeout=5)
            b = await start_node(nursery, tmp_path / "b", [bootstrap_entry(a)], peer, **curve)
            await wait_until(lambda: full_mesh([a, b]), timeout=10)
            await wait_until(lambda: connections["handshake_failed"] == connections["zap_denied_not_peer"], timeout=5)
        finally:
            early.close()
            stranger.close()
        status = a.status()
        for node in (a, b):
            node.request_stop()
    resolved = status["traffic"]["connections"].get("not_peer_race_resolved", 0)
    assert resolved >= 1 and status["traffic"]["connections"]["zap_denied_not_peer"] == resolved + 1
    table = format_status(status).splitlines()
    assert RACE_LINE.format(resolved) in table
    assert "connections refused or failed: handshake_failed 1, zap_denied_not_peer 1" in table, table


def test_the_images_per_class_found_and_held_out_are_logged_at_start(tmp_path, caplog):
    from p2pnode.config import load_config
    from p2pnode.learning.algorithm import _node_setup

    from .helpers import ANY_PORT, DIGITS, own_data_sections, write_config, write_digit_pngs

    write_digit_pngs(tmp_path / "images", (1, 7), per_class=10)
    write_digit_pngs(tmp_path / "images", (4,), per_class=3)
    config = load_config(write_config(tmp_path / "node", ANY_PORT, **own_data_sections(tmp_path / "images")))
    caplog.set_level(logging.INFO, logger="p2pnode")
    setup = _node_setup(config, "0123456789abcdef")
    (line,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("[data].path ")]
    assert line == (
        f"[data].path {tmp_path / 'images'}: 23 images of 3/10 classes, 5 held out for testing; per class, found "
        f"(held out): '1' 10 (2), '4' 3 (1), '7' 10 (2); class list {labels_capability(DIGITS)[0]}"
    )
    assert len(setup.data.test_labels) == 5
    many = tuple(f"c{k}" for k in range(20))
    summary = data_summary(many, np.arange(20).repeat(4), np.arange(20))
    assert summary.startswith("100 images of 20/20 classes, 20 held out") and summary.endswith("(20 classes in all)")


async def test_a_node_its_bootstrap_cannot_reach_back_says_it_is_likely_behind_a_nat(tmp_path, caplog):
    """a dials b and its handshake succeeds, but a advertises an address where nothing listens,
    as a node behind a NAT does: b's answers go there and never arrive. a says that b took its
    connection and that its own advertised address is out of b's reach, not that b is unreachable.
    (On real NATs: tests/test_nat.py.)"""
    caplog.set_level(logging.INFO, logger="p2pnode")
    curve = {"security": {"curve": True}}
    nowhere = f"tcp://127.0.0.1:{free_ports(1)}"
    async with trio.open_nursery() as nursery:
        b = await start_node(nursery, tmp_path / "b", **curve)
        c = await start_node(nursery, tmp_path / "c", [bootstrap_entry(b)], **curve)
        a = await start_node(
            nursery, tmp_path / "a", [bootstrap_entry(b)], node={"advertise": nowhere}, discovery=QUICK, **curve
        )
        await wait_until(lambda: a.membership.counts["bootstrap_unreachable"] >= 1, timeout=20)
        reachability = {name: node.status()["reachability"] for name, node in (("a", a), ("b", b), ("c", c))}
        table = format_status(a.status())
        doctor = {name: diagnose(node.status()) for name, node in (("a", a), ("b", b))}
        for node in (a, b, c):
            node.request_stop()
    # a: b took its connection and never answered, and nobody reached it; b: both challenged it
    # at its address; c: only b (one of the two peers needed).
    assert reachability["a"]["state"] == "private" and reachability["a"]["unanswered_bootstraps"] == [b.address]
    assert reachability["a"]["address"] == nowhere and "likely behind a NAT or a firewall" in reachability["a"]["why"]
    assert (reachability["b"]["state"], reachability["b"]["reached_by"]) == ("public", 2)
    assert (reachability["c"]["state"], reachability["c"]["reached_by"]) == ("unknown", 1)
    assert f"reachability: private ({b.address} took its connection and never answered" in table
    assert any(line.startswith("reachability: private (") for line in _said(caplog))
    # `p2pnode doctor`: a names the entry that cannot reach it, and what to change; b is fine.
    lines, problems = doctor["a"]
    assert problems == 2 and lines[-1] == "2 problems found", lines  # private, and its bootstrap entry
    (entry,) = [line for line in lines if line.startswith("bootstrap entry 1 ")]
    assert entry.startswith(f"bootstrap entry 1 ({b.address}): takes this node's connection but its answers never")
    assert f"it cannot reach {nowhere}" in entry and "[node].advertise" in entry
    assert doctor["b"] == (
        [
            f"advertises {b.address}: loopback, reachable from this host only (other hosts: [node].listen / advertise)",
            f"reachability: public (2 peers reached it at {b.address})",
            "peers: 1/64",
            "no problem found",
        ],
        0,
    )
    (line,) = [line for line in _said(caplog) if line.startswith("bootstrap entry 1: ")]
    assert line.startswith(f"bootstrap entry 1: the node at {b.address} accepted this node's connection "), line
    assert f"its answers go to this node's advertised address {nowhere}, which it cannot reach" in line
    assert "behind a NAT or a firewall" in line and "still retrying" in line
    assert not [line for line in _said(caplog) if "unreachable" in line and "reachability:" not in line]


def test_doctor_names_what_is_in_the_way_of_each_bootstrap_entry():
    """Each outcome of a bootstrap entry's dial, and each kind of advertised address."""
    base = {"peer_count": 0, "max_peers": 64, "reachability": None}
    entries = [
        {"entry": 1, "address": "tcp://198.51.100.1:7000", "admitted": True, "handshakes": {"succeeded": 1}},
        {"entry": 2, "address": "tcp://198.51.100.2:7000", "admitted": False, "handshakes": {"failed": 3}},
        {"entry": 3, "address": "tcp://198.51.100.3:7000", "admitted": False, "handshakes": {"refused": 1}},
        {"entry": 4, "address": "tcp://198.51.100.4:7000", "admitted": False, "handshakes": {}},
    ]
    status = {**base, "address": "tcp://203.0.113.9:7000", "bootstraps": entries}
    lines, problems = diagnose({key: value for key, value in status.items() if value is not None})
    assert lines[0] == "advertises tcp://203.0.113.9:7000: a public address" and problems == 3
    assert lines[1] == "bootstrap entry 1 (tcp://198.51.100.1:7000): a peer"
    assert "another key, or CURVE off" in lines[2] and "`p2pnode keyinfo`" in lines[2]
    assert "refuses this node" in lines[3] and "allowlist" in lines[3]
    assert "no connection yet" in lines[4] and lines[-1] == "3 problems found"
    for address, kind, problem in (
        ("tcp://10.1.2.3:7000", "a private address", 0),
        ("tcp://100.64.0.7:7000", "behind a carrier's NAT", 1),
        ("tcp://node.example:7000", "a host name", 0),
    ):
        lines, problems = diagnose({**base, "address": address, "bootstraps": [], "reachability": None})
        assert kind in lines[0] and problems == problem, lines


async def test_a_node_that_advertises_the_wrong_address_is_dialled_back_where_it_is_reached(tmp_path, caplog):
    """a listens on 127.0.0.1 but advertises 127.0.0.2 (as a node behind a router that forwards
    its port advertises its inside address): b's challenge never reaches it, but b dials it back
    at the host its connection comes from, and a learns, says and `doctor` tells where it is
    reached and what to advertise; b gave one dial-back."""
    caplog.set_level(logging.INFO, logger="p2pnode")
    curve = {"security": {"curve": True}}
    port = free_ports(1)
    reached, wrong = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.2:{port}"
    asking = {**QUICK, "dial_back_after_s": 0.2, "reachability_confirmations": 1}
    async with trio.open_nursery() as nursery:
        b = await start_node(nursery, tmp_path / "b", **curve)
        a = await start_node(
            nursery,
            tmp_path / "a",
            [bootstrap_entry(b)],
            node={"listen": reached, "advertise": wrong},
            discovery=asking,
            **curve,
        )
        await wait_until(lambda: a.membership.reachability.reachable_at, timeout=20)
        seen, lines = a.status()["reachability"], diagnose(a.status())[0]
        dial_backs = b.metrics.connections["dial_backs_sent"]
        for node in (a, b):
            node.request_stop()
    # Not public: nobody reached it at its advertised address (private once the entry gives up on it).
    assert seen["state"] in ("unknown", "private") and seen["reachable_at"] == [reached], seen
    assert f"nodes that dialled it back reached it at {reached}: advertise that ([node].advertise" in seen["why"]
    assert any(line.startswith("reachability: ") and f"reached it at {reached}: advertise" in line for line in lines)
    assert dial_backs == 1
    said = [line for line in _said(caplog) if line.startswith("reachability:") and f"reached it at {reached}" in line]
    assert said, _said(caplog)
