"""`Cluster.stop()` keeps the exit code of a node that stopped but took long to exit, and still
kills one that never stops. The daemons here are stand-ins (a few lines of Python run through
`NodeSpec.prefix`) that act as a daemon does with its control socket and SIGTERM."""

import signal
import sys
import time

import pytest

from testnet.launch.cluster import Cluster
from testnet.launch.placement import NodeSpec, spawn_daemon

# Creates the "control socket" once SIGTERM is handled; on SIGTERM removes it (the node has
# stopped: its nursery is closed) and then exits after `argv[1]` seconds (interpreter teardown).
STOPS_THEN_EXITS_LATE = """
import os, signal, sys, time
socket = sys.argv[-1].replace("node.toml", "data/control.sock")
def stop(*_):
    os.remove(socket); time.sleep(float(sys.argv[1])); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
os.makedirs(os.path.dirname(socket), exist_ok=True); open(socket, "w").close()
while True: time.sleep(1)
"""
NEVER_STOPS = STOPS_THEN_EXITS_LATE.replace("os.remove(socket); time.sleep(float(sys.argv[1])); sys.exit(0)", "pass")


def stand_in(tmp_path, script: str, *args: str) -> NodeSpec:
    directory = tmp_path / "node00"
    directory.mkdir()
    spec = NodeSpec(0, directory, {}, prefix=(sys.executable, "-c", script, *args))
    spec.process = spawn_daemon(spec)
    deadline = time.monotonic() + 30
    while not spec.control_socket.exists():  # its SIGTERM handler is in place
        assert spec.process.poll() is None and time.monotonic() < deadline, spec.log_path.read_text()
        time.sleep(0.02)
    return spec


@pytest.mark.parametrize(
    "script, args, code",
    [(STOPS_THEN_EXITS_LATE, ("1.0",), 0), (NEVER_STOPS, (), None)],
    ids=["stopped-then-exits-after-the-grace", "never-stops"],
)
def test_stop_keeps_the_code_of_a_node_that_stopped_and_kills_one_that_did_not(tmp_path, script, args, code):
    spec = stand_in(tmp_path, script, *args)
    cluster = Cluster([spec], stop_grace_s=0.2, exit_grace_s=30.0)
    assert cluster.stop() == {0: code}
    assert spec.process.returncode == (0 if code == 0 else -signal.SIGKILL)
