"""Testnets under churn: daemons stopped and restarted on a schedule (`--churn`), and daemons
that exit on their own while the others go on (`--keep-going`)."""

import io
import os
import signal
import threading
import time

import pytest

from p2pnode.cli import main
from testnet.churn import ChurnSpec
from testnet.discovery import run_discovery_testnet


def test_churn_spec_is_parsed_and_bad_ones_are_refused_naming_the_part():
    assert ChurnSpec.parse("every=20s,down=10s") == ChurnSpec(20.0, 10.0, None, "kill")
    assert ChurnSpec.parse(" every=2.5, down=0s, count=3, signal=term ") == ChurnSpec(2.5, 0.0, 3, "term")
    for text, message in (
        ("down=1s", "every missing"),
        ("every=1s,down=1s,often=2", "'often=2' is not one of"),
        ("every=0s,down=1s", "every: must be above 0 s"),
        ("every=1m,down=1s", "every: expected seconds such as 20s"),
        ("every=1s,down=-1", "down: expected a non-negative number"),
        ("every=1s,down=1s,count=0", "count: expected a positive integer"),
        ("every=1s,down=1s,signal=hup", "signal: expected kill or term"),
    ):
        with pytest.raises(ValueError, match=message):
            ChurnSpec.parse(text)


def test_a_bad_churn_spec_is_a_usage_error(tmp_path, capsys):
    argv = ["testnet", "--nodes", "2", "--duration", "5", "--out", str(tmp_path), "--churn", "every=soon"]
    assert main(argv) == 2
    assert "p2pnode: error: --churn: down missing" in capsys.readouterr().err
    assert not (tmp_path / "node00").exists()  # nothing was started


def test_churned_daemons_come_back_and_are_readmitted(tmp_path):
    churn = ChurnSpec(every_s=2.0, down_s=1.0, count=2)
    code, report = run_discovery_testnet(
        tmp_path / "net", 4, 40, exit_on_mesh=True, churn=churn, seed=0, progress=io.StringIO()
    )
    assert code == 0, report["churn"]
    events = report["churn"]["events"]
    assert report["churn"]["spec"] == {"every_s": 2.0, "down_s": 1.0, "count": 2, "signal": "kill"}
    assert len(events) == 2 and report["exits"] == []
    for event in events:
        assert event["signal"] == "SIGKILL" and event["exit_code"] == -signal.SIGKILL
        assert event["killed_s"] + 1.0 <= event["restarted_s"] <= event["up_s"] <= event["mesh_s"]
    assert events[1]["killed_s"] >= events[0]["killed_s"] + 2.0
    # Back in the mesh: everyone knows everyone, and the restarted processes stopped cleanly.
    assert report["discovery"]["peer_counts"] == [3] * 4
    assert report["node_exit_codes"] == [0] * 4


def _kill_when_up(directory, done: threading.Event) -> None:
    """SIGKILL the daemon of `directory` once it answers on its control socket: a crash the
    launcher did not cause."""
    lock, socket = directory / "data" / "node.lock", directory / "data" / "control.sock"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pid = lock.read_text().strip() if lock.exists() else ""  # the node writes its pid once it holds the lock
        if socket.exists() and pid.isdigit():
            os.kill(int(pid), signal.SIGKILL)
            done.set()
            return
        time.sleep(0.05)


def test_with_keep_going_a_daemon_that_dies_is_reported_and_the_run_goes_on(tmp_path):
    out, killed = tmp_path / "net", threading.Event()
    killer = threading.Thread(target=_kill_when_up, args=(out / "node02", killed), daemon=True)
    killer.start()
    code, report = run_discovery_testnet(out, 3, 10, keep_going=True, progress=io.StringIO())
    killer.join(timeout=5)
    assert killed.is_set()
    assert code == 1  # a daemon died: the run went on, but it did not pass
    (exit_,) = report["exits"]
    assert exit_["node"] == 2 and exit_["exit_code"] == -signal.SIGKILL and exit_["exited_s"] < 10
    assert report["wall_time_s"] >= 10  # it ran its whole duration
    assert report["node_exit_codes"] == [0, 0, -signal.SIGKILL] and report["churn"] is None


def test_a_learning_testnet_under_churn_finishes_and_the_victim_resumes(tmp_path):
    from testnet.learning import run_learning_testnet
    from testnet.report import CheckThresholds
    from testnet.simulator import SimulationSpec

    spec = SimulationSpec(
        algorithm="mapl",
        dataset="digits",
        nodes=3,
        rounds=100,  # tens of milliseconds each: still learning when the stop comes, on a fast machine too
        samples_per_class=10,
        backbones=("mlp",),
        overrides={"warmup_rounds": "4"},
    )
    code, report = run_learning_testnet(
        spec,
        tmp_path / "net",
        round_deadline_s=2.0,
        check=CheckThresholds(accuracy=0.6, within_cluster_mass=0.0),  # 3 nodes, 2 clusters: no graph to judge
        churn=ChurnSpec(every_s=1.0, down_s=0.5, count=1),  # a second in: a few rounds are checkpointed
        keep_going=True,
        progress=io.StringIO(),
    )
    assert code == 0, report["check"]
    processes = report["processes"]
    (event,) = processes["churn"]["events"]
    victim = event["node"]
    assert event["exit_code"] == -signal.SIGKILL and processes["exits"] == []
    # It came back from the checkpoint of a round it had finished before the kill, and finished.
    assert event["resumed_from"] is not None and event["resumed_from"] == processes["resumed_from"][victim]
    assert report["last_round_per_node"] == [99] * 3
    assert processes["exit_codes"] == [0, 0, 0]
