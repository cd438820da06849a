"""Daemons as separate processes: kill -9, SIGTERM, exit codes, the testnet launcher."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testnet.launch.cluster import Cluster

from .helpers import FAST_DISCOVERY, peer_ids, wait_for, write_config

P2PNODE = [sys.executable, "-m", "p2pnode_cli"]


def test_killed_peer_is_evicted_within_the_timeout_and_readmitted_on_restart(tmp_path):
    with Cluster.prepare(tmp_path, 3, discovery=FAST_DISCOVERY) as cluster:
        cluster.start_all()
        ids = {spec.node_id for spec in cluster.specs}
        wait_for(lambda: all(peer_ids(cluster, s) == ids - {s.node_id} for s in cluster.specs), timeout=30)
        victim, others = cluster.specs[1], [cluster.specs[0], cluster.specs[2]]
        cluster.kill(victim, signal.SIGKILL)  # no BYE: only silence tells
        # Evicted for its silence (no BYE came): when, on the daemons' own clock, is what
        # test_membership.py's simulated network checks (peer_timeout_s plus one ping interval);
        # a bound on this machine's wall clock would measure its load.
        wait_for(lambda: all(victim.node_id not in peer_ids(cluster, s) for s in others), timeout=30, interval=0.05)
        for spec in others:
            assert cluster.status(spec)["membership"]["evicted_timeout"] == 1
        cluster.start(victim)  # same key, same data directory
        wait_for(lambda: all(peer_ids(cluster, s) == ids - {s.node_id} for s in cluster.specs), timeout=30)
        status = cluster.status(others[0])
        assert "replay" not in status["traffic"]["rejections"]  # the restarted node never reused a seq


def test_sigterm_stops_a_node_cleanly_within_a_bound(tmp_path):
    with Cluster.prepare(tmp_path, 2, discovery=FAST_DISCOVERY) as cluster:
        cluster.start_all()
        a, b = cluster.specs
        wait_for(lambda: peer_ids(cluster, a) == {b.node_id} and peer_ids(cluster, b) == {a.node_id}, timeout=30)
        a.process.send_signal(signal.SIGTERM)
        assert a.process.wait(timeout=30) == 0  # a hang fails; the machine's load may not
        assert not a.control_socket.exists()
        log = a.log_path.read_text()
        assert "SIGTERM received: shutting down" in log and "stopped" in log and "Traceback" not in log
        status = wait_for(lambda: (s := cluster.status(b)) and s["peer_count"] == 0 and s, timeout=2)
        assert status["membership"]["evicted_bye"] == 1  # told, not timed out


def test_config_errors_exit_2_with_the_documented_messages(tmp_path):
    path = write_config(tmp_path, "tcp://127.0.0.1:1")
    path.write_text(path.read_text() + "\n[transport]\nverify_thread = 3\nlinger_ms = -1\n")
    result = subprocess.run([*P2PNODE, "start", "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"p2pnode: error: invalid configuration {path}:" in result.stderr
    assert "[transport].verify_thread: unknown key (did you mean 'verify_threads'?)" in result.stderr
    assert "[transport].linger_ms: must be between 0 and 60000, got -1" in result.stderr
    assert not (tmp_path / "data").exists()  # nothing half-started


def test_an_address_in_use_exits_1_naming_the_field(tmp_path):
    with Cluster.prepare(tmp_path / "running", 1) as cluster:
        cluster.start_all()
        (spec,) = cluster.specs
        wait_for(lambda: cluster.status(spec), timeout=30)
        path = write_config(tmp_path / "second", spec.address)
        result = subprocess.run([*P2PNODE, "start", "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "[node].listen: cannot bind" in result.stderr and "Address already in use" in result.stderr


def test_status_of_a_node_that_is_not_running(tmp_path):
    path = write_config(tmp_path, "tcp://127.0.0.1:1")
    result = subprocess.run([*P2PNODE, "status", "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "no node is running with this configuration" in result.stderr


def test_testnet_with_a_bounded_view_reports_a_connected_overlay_with_every_view_at_target(tmp_path):
    """12 daemons seeking 4 peers each (at most 6): not a full mesh, but every view at its
    target, one connected overlay (networkx, from the peer tables), and what it costs."""
    out = tmp_path / "net"
    # Peer exchange every 0.5 s (2 s by default): every view is at target within about 5 s on a
    # quiet 2-core machine (11 s at 2 s). The run stops 7 s after it: the steady rates start 5 s
    # after the target.
    command = ["testnet", "--nodes", "12", "--algorithm", "none", "--duration", "120", "--out", str(out)]
    command += ["--exit-on-mesh", "--hold", "7", "--daemon", "discovery.exchange_interval_s=0.5"]
    views = ["--active-view", "4", "--max-peers", "6"]
    result = subprocess.run([*P2PNODE, *command, *views], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "every view at target in" in result.stderr and "overlay connected" in result.stderr
    report = json.loads((out / "report.json").read_text())
    discovery = report["discovery"]
    assert discovery["full_mesh_s"] is None and discovery["target_s"] > 0
    assert discovery["active_view"] == [4] * 12 and all(4 <= count <= 6 for count in discovery["peer_counts"])
    assert discovery["reachability"] == ["public"] * 12  # each reached by at least two peers at its address
    overlay = discovery["overlay"]
    # A connected graph of n nodes with minimum degree d has diameter at most 3n/(d + 1) - 1 (6 here):
    # more means a table lied about its peers; 1 would be a full mesh, which the view bound forbids.
    assert overlay["connected"] and overlay["components"] == 1 and 2 <= overlay["diameter"] <= 3 * 12 // (4 + 1) - 1
    assert sum(overlay["degree_distribution"].values()) == 12 and overlay["mutual_edges"] == overlay["edges"]
    steady = discovery["steady"]  # measured from 5 s after the target was reached
    assert steady["nodes"] == 12 and 4 <= steady["liveness_frames_per_s"]["mean"] / 2 <= 6.5  # PING + PONG per peer
    resources = report["resources"]
    assert all(cpu > 0 for cpu in resources["cpu_s"]) and all(rss > 0 for rss in resources["rss_mb"])


def _daemon_pids(out: Path) -> list[int]:
    pids = []
    for lock in out.glob("node*/data/node.lock"):
        text = lock.read_text().strip()
        if text:
            pids.append(int(text))
    return pids


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


LEARNING = ["--algorithm", "mapl", "--dataset", "digits", "--rounds", "100000", "--samples-per-class", "5"]


@pytest.mark.parametrize(
    "how, learning",
    [(signal.SIGINT, False), (signal.SIGKILL, False), (signal.SIGKILL, True)],
    # learning daemons are forked by testnet/launch/warm_parent.py: a launcher killed with SIGKILL takes
    # the fork server with it (PR_SET_PDEATHSIG), and the server its daemons
    ids=["ctrl-c", "kill-9", "kill-9-forked-learners"],
)
def test_testnet_leaves_no_orphans(tmp_path, how, learning):
    out = tmp_path / "net"
    run = [*LEARNING, "--backbones", "mlp"] if learning else ["--duration", "60"]
    with subprocess.Popen(
        [*P2PNODE, "testnet", "--nodes", "3", *run, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal's foreground job gets it: a shell starts background jobs (a test run
        # with `&`) with SIGINT ignored, which Python and so the launcher would inherit.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as launcher:
        try:
            pids = wait_for(lambda: len(p := _daemon_pids(out)) == 3 and p, timeout=30)
            launcher.send_signal(how)
            _, stderr = launcher.communicate(timeout=30)
            wait_for(lambda: not any(_running(pid) for pid in pids), timeout=15)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    if how == signal.SIGINT:
        assert launcher.returncode == 130
        assert "interrupted: stopping every node" in stderr
        assert json.loads((out / "report.json").read_text())["node_exit_codes"] == [0, 0, 0]
