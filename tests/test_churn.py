"""Testnets under churn: daemons stopped and restarted on a schedule (`--churn`), daemons that
die and are started again (`--restart`, at most `--max-restarts` times), and daemons that exit
on their own while the others go on (`--keep-going`)."""

import contextlib
import io
import json
import os
import re
import resource
import signal
import threading
import time

import pytest

from p2pnode_cli import EXIT_OK, EXIT_USAGE, main
from testnet.launch.churn import NOT_RESTARTED, ChurnSpec, RestartPolicy, Supervisor
from testnet.launch.discovery import run_discovery_testnet
from testnet.launch.placement import LocalPlacement, NodeSpec, read_status

from .helpers import signal_each_start


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


def test_with_keep_going_a_daemon_that_dies_is_reported_and_the_run_goes_on(tmp_path):
    out, killed = tmp_path / "net", []
    killer = threading.Thread(target=lambda: killed.extend(signal_each_start(out / "node02")), daemon=True)
    killer.start()
    code, report = run_discovery_testnet(out, 3, 5, keep_going=True, progress=io.StringIO())
    killer.join(timeout=5)
    assert len(killed) == 1
    assert code == 1  # a daemon died: the run went on, but it did not pass
    (exit_,) = report["exits"]
    assert exit_["node"] == 2 and exit_["exit_code"] == -signal.SIGKILL and exit_["exited_s"] < 5
    assert report["wall_time_s"] >= 5  # it ran its whole duration
    assert report["node_exit_codes"] == [0, 0, -signal.SIGKILL] and report["churn"] is None


LEARNING = [
    "testnet",
    "--nodes", "3",
    "--algorithm", "mapl",
    "--dataset", "digits",
    "--rounds", "100",  # tens of milliseconds each: still learning when the stops come, on a fast machine too
    "--samples-per-class", "10",
    "--backbones", "mlp",
    "--set", "warmup_rounds=4",
    "--round-deadline", "2",
    "--check", "--check-mass", "0",  # 3 nodes, 2 clusters: no graph to judge
    # Armed once every daemon has finished a round; the stop comes at the launcher's next poll
    # (0.5 s), long before 100 rounds of tens of milliseconds are over, on a fast machine too.
    "--churn", "every=0.3s,down=0.5s,count=1",
    "--restart", "--restart-backoff", "0.2",
]  # fmt: skip
CRASH_AFTER_ROUND = 3  # the crashed daemon's checkpoint is of this round or a later one


def _crash_mid_run(out, progress: io.StringIO, crashed: dict) -> None:
    """Once `--churn` has stopped a daemon of testnet `out` (its line in `progress`), SIGKILL
    the first other one that has a checkpoint of round CRASH_AFTER_ROUND; keep which node it
    was, and the round of its checkpoint, in `crashed`. After the stop, not before: the other
    two are then still learning whatever the machine's speed."""
    deadline, stop = time.monotonic() + 120, None
    while stop is None and time.monotonic() < deadline:
        stop = re.search(r"churn: node (\d) stopped", progress.getvalue())
        time.sleep(0.05)
    while stop is not None and time.monotonic() < deadline:
        for node in sorted({0, 1, 2} - {int(stop[1])}):
            status = read_status(out / f"node{node:02d}" / "data" / "control.sock", timeout=1.0)
            learning = (status or {}).get("learning") or {}
            if (learning.get("checkpoint_round") or -1) >= CRASH_AFTER_ROUND:
                os.kill(status["pid"], signal.SIGKILL)
                crashed.update(node=node, checkpoint_round=learning["checkpoint_round"])
                return
        time.sleep(0.05)


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory):
    """One learning testnet, shared by the tests below: `--churn` stops a daemon once, then a
    daemon that `--churn` did not stop is killed mid-run from outside, which `--restart` heals.
    Its exit code, report.json, report.md, progress lines, and which node was killed."""
    out, crashed, progress = tmp_path_factory.mktemp("churn") / "net", {}, io.StringIO()
    killer = threading.Thread(target=_crash_mid_run, args=(out, progress, crashed), daemon=True)
    killer.start()
    with contextlib.redirect_stderr(progress), contextlib.redirect_stdout(io.StringIO()):
        code = main([*LEARNING, "--out", str(out)])
    killer.join(timeout=5)
    report = json.loads((out / "report.json").read_text())
    return code, report, (out / "report.md").read_text(), progress.getvalue(), crashed


def test_a_learning_testnet_under_churn_and_a_crash_finishes_and_every_victim_resumes(learning_run):
    code, report, _, progress, _ = learning_run
    assert code == EXIT_OK, (report["check"], progress)
    processes = report["processes"]
    (event,) = processes["churn"]["events"]
    assert event["exit_code"] == -signal.SIGKILL and processes["exits"] == []
    assert event["killed_s"] + 0.5 <= event["restarted_s"] <= event["up_s"]
    # Each came back from the checkpoint of a round it had finished before the kill, and finished.
    downtimes = sorted([event, *processes["restarts"]["events"]], key=lambda e: e.get("killed_s", e.get("exited_s")))
    for downtime in downtimes:
        assert downtime["resumed_from"] is not None, downtime
    for node, last in {downtime["node"]: downtime for downtime in downtimes}.items():
        assert processes["resumed_from"][node] == last["resumed_from"]
    assert report["last_round_per_node"] == [99] * 3
    assert processes["exit_codes"] == [0, 0, 0]


def test_a_learning_daemon_killed_mid_run_is_restarted_from_its_checkpoint(learning_run):
    _, report, _, progress, crashed = learning_run
    assert crashed, f"no daemon reached its checkpoint round: nothing was killed\n{progress}"
    restarts = report["processes"]["restarts"]
    assert restarts["policy"] == {"max_restarts": 3, "backoff_s": 0.2}
    (event,) = restarts["events"]
    assert event["node"] == crashed["node"] and event["restart"] == 1
    assert event["exit_code"] == -signal.SIGKILL and event["signal"] == "SIGKILL"
    assert event["exited_s"] + 0.2 <= event["restarted_s"] <= event["up_s"]
    assert event["back_after_s"] == pytest.approx(event["up_s"] - event["exited_s"], abs=1e-3)
    # From the checkpoint it had when it was killed (or a later one), not from round 0.
    assert event["resumed_from"] >= crashed["checkpoint_round"] >= CRASH_AFTER_ROUND


def test_the_restart_is_in_the_progress_lines_and_in_report_md(learning_run):
    _, report, page, progress, crashed = learning_run
    (event,) = report["processes"]["restarts"]["events"]
    node = crashed["node"]
    assert f"restart: node {node} died (SIGKILL) at {event['exited_s']:.1f} s; restart 1 of 3 in 0.2 s" in progress
    assert f"restart: node {node} restarted" in progress
    assert f"restart: node {node} answers again, {event['back_after_s']:.1f} s after it went down" in progress
    assert f"restart: node {node} resumed after round {event['resumed_from']}" in progress
    row = (
        f"| {event['exited_s']:.1f} | {node} | died (SIGKILL); restart 1 | {event['back_after_s']:.1f} "
        f"| {event['resumed_from']} |"
    )
    assert "## Daemons down during the run" in page and row in page
    assert "| stopped by --churn (SIGKILL) |" in page


@pytest.fixture
def no_core_dumps():
    """A daemon that aborts dumps no core into the working directory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def test_a_daemon_that_keeps_aborting_is_restarted_max_restarts_times_then_ends_the_run(tmp_path, no_core_dumps):
    out, aborted = tmp_path / "net", []
    # SIGABRT: what a failed libzmq assertion does to the process. Once, and again after each restart.
    killer = threading.Thread(
        target=lambda: aborted.extend(signal_each_start(out / "node01", signal.SIGABRT, times=3)), daemon=True
    )
    killer.start()
    progress = io.StringIO()
    policy = RestartPolicy(max_restarts=2, backoff_s=0.1)
    code, report = run_discovery_testnet(out, 2, 60, exit_on_mesh=True, restart=policy, progress=progress)
    killer.join(timeout=5)
    assert len(aborted) == 3, progress.getvalue()
    assert code == 1 and report["wall_time_s"] < 60  # given up: the run stopped (no --keep-going)
    first, second = report["restarts"]["events"]
    for number, event in enumerate((first, second), start=1):
        assert event["node"] == 1 and event["restart"] == number
        assert event["exit_code"] == -signal.SIGABRT and event["signal"] == "SIGABRT"
    # The backoff doubles: 0.1 s before the first restart, 0.2 s before the second.
    assert first["restarted_s"] >= first["exited_s"] + 0.1 and second["restarted_s"] >= second["exited_s"] + 0.2
    (given_up,) = report["exits"]
    assert given_up["node"] == 1 and given_up["restarts"] == 2 and given_up["signal"] == "SIGABRT"
    assert given_up["exited_s"] >= second["restarted_s"]
    assert "node 1 exited (SIGABRT) after 2 restarts (--max-restarts 2)" in progress.getvalue()
    assert report["node_exit_codes"] == [0, -signal.SIGABRT]


class _Exited:
    def __init__(self, code: int | None) -> None:
        self.returncode = code


class _Cluster:
    """Daemons that have exited with the given codes (None: still running), and must not be started."""

    placement = LocalPlacement()

    def __init__(self, tmp_path, codes) -> None:
        self.specs = [NodeSpec(i, tmp_path / f"node{i}", {}, process=_Exited(code)) for i, code in enumerate(codes)]

    def alive(self, spec) -> bool:
        return spec.process.returncode is None

    def log(self, spec):
        return spec.log_path

    def start(self, spec) -> None:
        raise AssertionError(f"node {spec.index} started again too soon")


def test_a_clean_exit_and_an_invalid_configuration_are_not_restarted(tmp_path):
    assert NOT_RESTARTED.keys() == {EXIT_OK, EXIT_USAGE}  # as the systemd unit: RestartPreventExitStatus=2
    cluster, progress = _Cluster(tmp_path, [None, 0, 2, 1]), io.StringIO()
    restart = RestartPolicy(max_restarts=1, backoff_s=60.0)
    supervisor = Supervisor(
        cluster, None, seed=0, keep_going=True, started=time.monotonic(), restart=restart, progress=progress
    )
    assert supervisor.poll([None] * 4)  # --keep-going: the others go on
    assert [(entry["node"], entry["exit_code"], entry["restarts"]) for entry in supervisor.exits] == [
        (1, 0, 0),
        (2, 2, 0),
    ]
    (event,) = supervisor.restarts  # exit 1 is a failure: restarted, in a minute
    assert (event["node"], event["exit_code"], event["signal"], event["restart"]) == (3, 1, None, 1)
    assert supervisor.busy() and not supervisor.done()  # the run waits for it
    assert "node 2 exited (code 2), not restarted: its configuration is invalid" in progress.getvalue()
    assert supervisor.report()["restarts"]["policy"] == {"max_restarts": 1, "backoff_s": 60.0}


def test_the_backoff_doubles_and_bad_policies_are_refused():
    assert [RestartPolicy(3, 0.5).delay_s(k) for k in range(3)] == [0.5, 1.0, 2.0]
    with pytest.raises(ValueError, match="--max-restarts: expected a positive integer"):
        RestartPolicy(max_restarts=0)
    with pytest.raises(ValueError, match="--restart-backoff: expected a positive number"):
        RestartPolicy(backoff_s=float("inf"))


@pytest.mark.parametrize("option", [["--max-restarts", "2"], ["--restart-backoff", "1"]])
def test_restart_options_without_restart_are_usage_errors(tmp_path, capsys, option):
    argv = ["testnet", "--nodes", "2", "--duration", "5", "--out", str(tmp_path), *option]
    assert main(argv) == EXIT_USAGE
    assert f"p2pnode: error: {option[0]} goes with --restart" in capsys.readouterr().err
    assert not (tmp_path / "node00").exists()  # nothing was started
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--restart", option[0], "0"])
    assert exit_.value.code == EXIT_USAGE and "expected a positive" in capsys.readouterr().err
