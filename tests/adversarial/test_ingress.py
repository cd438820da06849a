"""Raw-ZMTP attackers (tools/attack.py, tools/zmtp.py: no pyzmq) at real daemons, with CURVE and
without: libzmq 4.3 aborts the process that holds the attacked socket (`Assertion failed:
!_io_error`), and that process is an ingress process, never the node
(p2pnode/wire/inbound/supervisor.py). The node keeps answering, keeps its peers, and the socket
is back; a stranger on the public socket never touches the peers' socket's process."""

import json
import signal
import subprocess
import sys
import time

import pytest

from protocol.curve import curve_public_from_ed25519
from testnet.launch.cluster import Cluster
from tools.bench.campaign import _Probe

from ..helpers import wait_for

ATTACK_S = 2.5
# The attack on the peers' socket goes on past this until the abort comes; the malformed catalogue
# is cycled dozens of times in it (680 to 1462 cases sent in 1 s on a quiet machine).
SHORT_ATTACK_S = 1.5
STATUS_BOUND_S = 2.0  # the bound on `status` during an attack: the one bound on the wall clock here
UNTIL_DEADLINE_S = 60.0  # an attack that goes on until the node counted something: failing after this


@pytest.fixture(scope="module", params=[False, True], ids=["plaintext", "curve"])
def cluster(request, tmp_path_factory):
    """Bans of the suspects of aborts off: every attack here aborts as often as it can (the
    attacker's address would be banned after two otherwise: test_abort_bans_*)."""
    security = {"curve": request.param, "abort_ban_s": 0}
    with Cluster.prepare(tmp_path_factory.mktemp("ingress") / "net", 2, extra={"security": security}) as cluster:
        cluster.start_all()
        wait_for(lambda: all((cluster.status(spec) or {}).get("peer_count") == 1 for spec in cluster.specs))
        cluster.curve = request.param
        yield cluster


def _attack(
    cluster, target, *args: str, seconds: float = ATTACK_S, curve: bool | None = None, until=None
) -> tuple[dict, list[float], list[dict]]:
    """tools/attack.py against `target` while its status is asked every 0.2 s: the attack's JSON
    line, how long each status took, and each status. With `until` (a test of a status), the attack
    goes on past `seconds` until a status passes it, and is stopped there (its JSON line is then
    {}): what the node counted is compared, not how much a loaded machine did in `seconds`; never
    passing it within UNTIL_DEADLINE_S fails."""
    length = seconds if until is None else seconds + UNTIL_DEADLINE_S
    command = [sys.executable, "-m", "tools.attack", "--seconds", str(length), *args]
    if cluster.curve if curve is None else curve:
        command += ["--target-key", target.public_key.hex()]
    started = time.monotonic()
    attack = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    latencies, statuses, met = [], [], False
    try:
        while attack.poll() is None and not met:
            asked = time.perf_counter()
            status = cluster.status(target, timeout=STATUS_BOUND_S)
            latencies.append(time.perf_counter() - asked)
            assert status is not None, "status did not answer"
            statuses.append(status)
            met = until is not None and time.monotonic() - started >= seconds and until(status)
            if not met:
                time.sleep(0.2)
    finally:
        if attack.poll() is None:
            attack.send_signal(signal.SIGTERM)  # `until` passed, or a check failed: not left attacking
        out, err = attack.communicate()
    if met:
        return {}, latencies, statuses
    assert attack.returncode == 0, err[-2000:]
    assert until is None, f"never counted, by the deadline: {statuses[-1]['traffic']['connections']}"
    return json.loads(out.strip().splitlines()[-1]), latencies, statuses


def _peer_counts(statuses: list[dict]) -> set[int]:
    return {status["peer_count"] for status in statuses}


def _denied(name: str, count: int):
    """`until` for _attack: the node refused `count` connections for `name` (a ZAP refusal)."""
    return lambda status: status["traffic"]["connections"].get(name, 0) >= count


def _untraced(connections: dict) -> int:
    """Aborts traced to no reset: at most one in an attack of a few (test_abort_bans_...)."""
    untraced = connections.get("abort_untraced", 0)
    assert untraced <= 1, connections
    return untraced


def _ingress(cluster, spec) -> dict:
    return cluster.status(spec, timeout=STATUS_BOUND_S)["ingress"]


def _settled(cluster, spec, quiet_s: float = 1.0) -> dict:
    """`_ingress` once every socket is up and no restart has come for `quiet_s`: the attack of
    the test before may still end a process a moment after it stopped (it once did, on a loaded
    machine, between the check that the socket was back and the next test's first count)."""

    def restarts(ingress: dict) -> dict:
        return {name: (socket["restarts"], socket["up"]) for name, socket in ingress.items()}

    last, since, deadline = _ingress(cluster, spec), time.monotonic(), time.monotonic() + 30
    while time.monotonic() - since < quiet_s or not all(socket["up"] for socket in last.values()):
        assert time.monotonic() < deadline, last
        time.sleep(0.1)
        now = _ingress(cluster, spec)
        if restarts(now) != restarts(last):
            since = time.monotonic()
        last = now
    return last


def test_a_stranger_aborting_the_public_socket_stops_neither_the_node_nor_its_peers(cluster):
    target, _peer = cluster.specs
    before = _settled(cluster, target)
    result, latencies, statuses = _attack(cluster, target, "--target", target.address, "--kind", "stall-reset")
    after = _ingress(cluster, target)
    # The attack is real: libzmq aborted the public socket's process, again and again.
    aborts = after["public"]["restarts"] - before["public"]["restarts"]
    assert aborts >= 1 and result["lost"] >= 1, (result, after)
    assert all(exit["how"] == "signal SIGABRT" for exit in after["public"]["exits"])
    # The node never stopped: it answered every status within the bound, before and after an
    # abort while the attack went on (two statuses showed different counts of restarts), its
    # peer stayed, and the peers' socket, in a process of its own, was never touched.
    assert cluster.alive(target), cluster.log(target).read_text()[-2000:]
    assert max(latencies) < STATUS_BOUND_S
    restarts_seen = [status["ingress"]["public"]["restarts"] for status in statuses]
    assert min(restarts_seen) < max(restarts_seen), restarts_seen
    assert _peer_counts(statuses) == {1}
    assert after["peers"]["restarts"] == before["peers"]["restarts"]
    # And the public socket is back: a newcomer could join now.
    wait_for(lambda: _ingress(cluster, target)["public"]["up"], timeout=5)


def test_the_peers_socket_aborted_costs_a_restart_and_no_peer(cluster):
    """With CURVE only an admitted peer reaches the peers' socket: here the attacker holds the
    other node's key (what a Byzantine peer could do). Without CURVE anyone reaches it."""
    target, peer = cluster.specs
    before = _settled(cluster, target)
    # Its queue holds recv_hwm (1000) frames per connection, and the node reads it without a
    # budget: a few more than that in one go fill it.
    as_key = ["--as-key", str(peer.directory / "key.pem")] if cluster.curve else []
    peers_listen = cluster.status(target)["peers_listen"]

    def restarted(status: dict) -> bool:
        return status["ingress"]["peers"]["restarts"] > before["peers"]["restarts"]

    args = ("--target", peers_listen, "--kind", "stall-reset", "--frames", "1005", *as_key)
    result, latencies, _statuses = _attack(cluster, target, *args, seconds=SHORT_ATTACK_S, until=restarted)
    after = _ingress(cluster, target)
    assert after["peers"]["restarts"] - before["peers"]["restarts"] >= 1, (result, after)
    assert after["public"]["restarts"] == before["public"]["restarts"]
    assert cluster.alive(target) and max(latencies) < STATUS_BOUND_S
    wait_for(lambda: _ingress(cluster, target)["peers"]["up"], timeout=5)
    # The honest connection comes back with the socket (its DEALER reconnects).
    wait_for(lambda: (cluster.status(target) or {}).get("peer_count") == 1)


def test_a_catalogue_of_malformed_zmtp_leaves_the_node_and_its_peer_up(cluster):
    target, _peer = cluster.specs
    args = ("--target", target.address, "--kind", "malformed")
    result, latencies, statuses = _attack(cluster, target, *args, seconds=SHORT_ATTACK_S)
    assert result["sent"] >= 20, result  # every case at least once
    assert cluster.alive(target), cluster.log(target).read_text()[-2000:]
    assert max(latencies) < STATUS_BOUND_S and _peer_counts(statuses) == {1}
    wait_for(lambda: _ingress(cluster, target)["public"]["up"], timeout=5)


def test_abort_bans_refuse_a_stranger_after_two_aborts_and_the_public_socket_stays_up(tmp_path):
    with Cluster.prepare(tmp_path / "net", 2, extra={"security": {"curve": True}}) as bans:
        bans.start_all()
        target, _ = bans.specs
        wait_for(lambda: (bans.status(target) or {}).get("peer_count") == 1)
        time.sleep(2.5)  # past `abort_suspect_s` after the sockets came up
        args = ("--target", target.address, "--kind", "stall-reset")
        # 2.5 s, and on until ten reconnections were refused (about 0.5 s on a quiet machine): without
        # the ban a stranger aborts the public socket several times a second.
        until = _denied("zap_denied_aborts", 10)
        result, latencies, statuses = _attack(bans, target, *args, seconds=2.5, curve=True, until=until)
        status = bans.status(target)
        connections = status["traffic"]["connections"]
        # Two aborts traced to the stranger, then refused. An abort whose reset the node had not
        # heard of yet (a race resets.py narrows, to about 1 in 30 here on a loaded machine)
        # bans nobody and costs one more.
        untraced = _untraced(connections)
        assert status["ingress"]["public"]["restarts"] == 2 + untraced, str((result, connections))
        assert connections["abort_traced"] == 2 and connections["abort_banned"] == 1, connections
        assert connections["zap_denied_aborts"] >= 10, connections
        assert _peer_counts(statuses) == {1} and max(latencies) < STATUS_BOUND_S


def test_abort_bans_refuse_an_admitted_peers_key_that_crash_loops_the_peers_socket(tmp_path):
    """Issue #43: striking again the moment the process is back, when every peer reconnects,
    an admitted key made 185 aborts in 32 s, never suspected. The reset names it now."""
    with Cluster.prepare(tmp_path / "net", 2, extra={"security": {"curve": True}}) as bans:
        bans.start_all()
        target, byzantine = bans.specs
        wait_for(lambda: (bans.status(target) or {}).get("peer_count") == 1)
        peers_listen = bans.status(target)["peers_listen"]
        attack = ["--target", peers_listen, "--kind", "stall-reset", "--frames", "1005", "--pause", "0"]
        as_key = ("--as-key", str(byzantine.directory / "key.pem"))
        # 3 s (at #43's rate some 17 aborts, not 2), and on until the node refused ten reconnections
        result, latencies, _ = _attack(
            bans, target, *attack, *as_key, seconds=3.0, curve=True, until=_denied("zap_denied_aborts", 10)
        )
        status = bans.status(target)
        connections = status["traffic"]["connections"]
        restarts = status["ingress"]["peers"]["restarts"]
        assert restarts == 2 + _untraced(connections), str((result, connections))  # then refused
        assert status["ingress"]["public"]["restarts"] == 0
        assert connections["abort_banned"] == 1 and connections["abort_traced"] == 2, connections
        assert connections["zap_denied_aborts"] >= 10, connections  # each try since
        assert bans.alive(target) and max(latencies) < STATUS_BOUND_S


def test_an_attacker_with_many_addresses_gets_a_bounded_share_and_a_newcomer_from_elsewhere_gets_in(tmp_path):
    """Issue #43: from 2,000 loopback addresses one attacker made 810 aborts in 76 s, and whoever
    (re)connected in the 2 s before an abort was banned (650 of 868 bans fell on honest hosts).
    Here 40 addresses of one /24: the aborts are traced to the resets, the prefix is throttled
    after two, and a newcomer from another prefix, handshaking all along, is never refused for
    them (a refusal during one of the few restarts aside)."""
    with Cluster.prepare(tmp_path / "net", 2, extra={"security": {"curve": True}}) as bans:
        bans.start_all()
        target, _ = bans.specs
        wait_for(lambda: (bans.status(target) or {}).get("peer_count") == 1)
        time.sleep(2.5)  # past `abort_suspect_s` after the sockets came up
        server_key = curve_public_from_ed25519(target.public_key)
        newcomer = _Probe(target.address, server_key, "127.2.0.1", 0.2, fresh_key=True)
        newcomer.start()
        try:
            args = ("--target", target.address, "--kind", "stall-reset", "--sources", "40")
            # 4 s (before the fix: 35 aborts in 8 s, so some 17 here, not 4; the newcomer tries about
            # 20 times), and on until ten were refused
            until = _denied("zap_denied_prefix_throttled", 10)
            result, latencies, statuses = _attack(bans, target, *args, seconds=4.0, curve=True, until=until)
        finally:
            newcomer.stop.set()
            newcomer.join()
        status = bans.status(target)
        connections = status["traffic"]["connections"]
        assert status["ingress"]["public"]["restarts"] <= 4, (result, connections)
        assert connections["abort_prefix_throttled"] == 1 and connections["zap_denied_prefix_throttled"] >= 10
        assert connections.get("abort_banned", 0) == 0, connections  # each address aborted once at most
        assert newcomer.succeeded >= newcomer.tried - 2, (newcomer.tried, newcomer.succeeded)
        assert _peer_counts(statuses) == {1} and max(latencies) < STATUS_BOUND_S
