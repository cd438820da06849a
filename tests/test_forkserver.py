"""testnet/launch/warm_parent.py, on p2pnode/forkserver.py: a daemon forked from the warm parent
is what `python -m` would have started, as the launcher sees it (exit codes, signals, waiting)
and as the program sees itself (argv, its own process group, stdin, its log, fresh random seeds,
default signal handlers)."""

import signal
import subprocess
import sys
import threading

import pytest

from p2pnode.forkserver import _Replies
from testnet.launch.warm_parent import WarmParent

PROGRAM = ("tests.forked_program",)


@pytest.fixture(scope="module")
def server():
    server = WarmParent()
    yield server
    server.close()


def _lines(log) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in log.read_text().splitlines() if " " in line}


def test_a_forked_program_sees_what_python_m_would_give_it(server, tmp_path):
    forked, executed = tmp_path / "forked.log", tmp_path / "executed.log"
    daemon = server.spawn(PROGRAM, ["--config", "node.toml"], forked)
    assert daemon.wait(30) == 0 and daemon.returncode == 0 and daemon.poll() == 0
    with executed.open("w") as log:
        command = [sys.executable, "-m", *PROGRAM, "--config", "node.toml"]
        # As started from a terminal: a suite run in the background (`make test &`, nohup) ignores
        # SIGINT, which an exec'd Python would inherit; the fork server gives Python's defaults.
        subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    ours, theirs = _lines(forked), _lines(executed)
    assert ours["argv"] == theirs["argv"] == "['--config', 'node.toml']"
    assert ours["group"] == "True stdin True"  # a process group of its own, stdin empty
    assert ours["handlers"] == theirs["handlers"] and ours["handlers"].startswith("True")


def test_exit_codes_are_popens_and_wait_times_out_while_it_runs(server, tmp_path):
    assert server.spawn(PROGRAM, ["--exit", "3"], tmp_path / "a.log").wait(30) == 3
    failed = server.spawn(PROGRAM, ["--raise"], tmp_path / "b.log")
    assert failed.wait(30) == 1 and "RuntimeError: failed on purpose" in (tmp_path / "b.log").read_text()
    sleeper = server.spawn(PROGRAM, ["--sleep", "60"], tmp_path / "c.log")
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(0.2)
    assert sleeper.poll() is None
    sleeper.send_signal(signal.SIGTERM)
    assert sleeper.wait(30) == -signal.SIGTERM
    killed = server.spawn(PROGRAM, ["--sleep", "60"], tmp_path / "d.log")
    killed.kill_group()
    assert killed.wait(30) == -signal.SIGKILL
    killed.send_signal(signal.SIGTERM)  # reaped: its pid is no longer its own, nothing is sent


def test_each_forked_child_draws_its_own_random_numbers(server, tmp_path):
    logs = [tmp_path / f"{i}.log" for i in range(3)]
    for log in logs:
        assert server.spawn(PROGRAM, [], log).wait(30) == 0
    draws = [_lines(log)["draws"] for log in logs]
    assert len(set(draws)) == 3, draws


def test_a_thread_s_warm_parents_serve_testnet_after_testnet_and_start_again_once_gone(tmp_path):
    """One warm parent of each kind per thread, kept for the next testnet; the discovery kind has
    not imported torch, so neither have its children; a parent that died is replaced."""
    learning, discovery = WarmParent.shared(), WarmParent.shared(learning=False)
    assert WarmParent.shared() is learning and WarmParent.shared(learning=False) is discovery
    for parent, name in ((learning, "learning"), (discovery, "discovery")):
        assert parent.spawn(PROGRAM, [], tmp_path / f"{name}.log").wait(30) == 0
    assert _lines(tmp_path / "learning.log")["torch"] == "True"
    assert _lines(tmp_path / "discovery.log")["torch"] == "False"
    elsewhere = []
    thread = threading.Thread(target=lambda: elsewhere.append(WarmParent.shared(learning=False)))
    thread.start()
    thread.join()
    assert elsewhere[0] is not discovery  # and it died with its thread (PR_SET_PDEATHSIG)
    assert elsewhere[0].server.process.wait(30) == -signal.SIGKILL
    discovery.server.process.kill()
    discovery.server.process.wait()
    again = WarmParent.shared(learning=False)
    assert again is not discovery and again.spawn(PROGRAM, ["--exit", "4"], tmp_path / "again.log").wait(30) == 4


def test_an_exit_told_for_a_pid_is_forgotten_when_the_pid_is_given_to_a_new_child():
    replies = _Replies()
    replies.feed(b'{"exited": 41, "code": 0}\n{"pid": 41}\n')
    assert replies.forked == [41] and 41 not in replies.exits  # the new child is running
    replies.feed(b'{"exited": 41, "code": -9}\n')
    assert replies.exits[41] == -9
