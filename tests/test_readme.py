"""Every command README.md shows is run here, and must give the outcome the README claims.

The commands are read from README.md itself: its `sh` blocks and the "try it" column of its
"What works today" table. Each one must be listed below, with how it is judged (RUN, or the
"Running a node" block as a whole) or why it is not run (NOT_RUN): a command added to the
README and not here fails `test_every_readme_command_is_accounted_for`, and so does one listed
here that the README no longer shows. The command synopsis (docs/cli.md) is checked against
the argument parser, and the Python example is run as it is.

The README's learning commands are small on purpose (digits, 4 nodes, a few rounds, the `mlp`
backbone) so that this module stays around a minute and a half on two idle cores. Each runs once
(`ran`); its testnets also stand for the learning testnet's own tests (tests/test_learning_daemon.py:
the testnet and the simulator on the same options agree), so no other module starts their like.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from p2pnode.learning.history import HISTORY_NAME, read_history
from p2pnode_cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def _command(line: str) -> str:
    """A command as written, without its comment and the `.venv/bin/` the README puts first."""
    return line.split("  #", 1)[0].strip().removeprefix(".venv/bin/")


def shell_commands() -> list[str]:
    return [_command(line) for block in _blocks("sh") for line in block.splitlines() if line.strip()]


def table_commands() -> list[str]:
    rows = [line for line in _section("What works today").splitlines() if line.startswith("| ")][1:]
    return [_command(code) for row in rows for code in re.findall(r"`([^`]+)`", row.rstrip(" |").rsplit(" | ", 1)[1])]


def running_a_node() -> list[str]:
    (block,) = _blocks("sh", _section("Running a node"))
    return [_command(line) for line in block.splitlines() if line.strip()]


@dataclass(frozen=True)
class Outcome:
    """What the README claims a command does: its exit status, a line it prints, and what its
    report.json (under DIR) says."""

    code: int = 0
    prints: str = ""  # a regular expression, searched in what it wrote (stdout, then stderr)
    report: Callable[[dict], bool] | None = None


def _checked(report: dict) -> bool:
    return report["check"]["passed"] and report["rounds_completed_per_node"] == [report["rounds"]] * report["nodes"]


MAPL_SIMULATE = (
    "p2pnode simulate --algorithm mapl --dataset digits --nodes 4 --rounds 8 --samples-per-class 10 --backbones mlp "
    "--set warmup_rounds=3 --out DIR --check"
)
MAPL_TESTNET = (
    "p2pnode testnet --algorithm mapl --dataset digits --nodes 4 --rounds 8 --samples-per-class 10 --backbones mlp "
    "--set warmup_rounds=3 --out DIR --check"
)
SCOOL_TESTNET = (
    "p2pnode testnet --algorithm scool-sbm --dataset digits --scenario noniid-sbm --clusters 2 --nodes 4 --rounds 6 "
    "--samples-per-class 10 --backbones mlp --set prune_round=3 --out DIR --check"
)
# SCooL's testnet beside the simulator on the same options (the README shows no simulate for it)
SCOOL_SIMULATE = SCOOL_TESTNET.replace("p2pnode testnet", "p2pnode simulate", 1)
DISCOVERY_TESTNET = "p2pnode testnet --nodes 5 --algorithm none --duration 30 --exit-on-mesh --out DIR"

RUN = {
    DISCOVERY_TESTNET: Outcome(
        prints=r"full mesh in [\d.]+ s",
        report=lambda r: r["discovery"]["full_mesh_s"] is not None and r["discovery"]["peer_counts"] == [4] * 5,
    ),
    # README: "MAPL recovers the clusters"; the same command shows the one structure (issue #12).
    MAPL_SIMULATE: Outcome(prints=r"^mapl: accuracy", report=_checked),
    MAPL_TESTNET: Outcome(
        prints=r"^mapl: accuracy", report=lambda r: _checked(r) and r["processes"]["exit_codes"] == [0] * 4
    ),
    SCOOL_TESTNET: Outcome(
        prints=r"^scool-sbm: accuracy", report=lambda r: _checked(r) and r["comm"]["by_type"]["SCORE"]["messages"] > 0
    ),
    "p2pnode simulate --algorithm mapl-dual --dataset digits --nodes 4 --rounds 8 --samples-per-class 10 "
    "--backbones mlp convnet --set warmup_rounds=3 --out DIR --check": Outcome(
        prints=r"^mapl-dual: accuracy", report=lambda r: _checked(r) and "ensemble" in r["accuracy_by_predictor"]
    ),
    # README: the async schedule with a slow node; overtime shows as rounds past the last.
    "p2pnode simulate --algorithm mapl-dual --dataset digits --nodes 4 --rounds 8 --samples-per-class 10 "
    "--backbones mlp convnet --set warmup_rounds=3 --slow 0.25:5 --schedule async --out DIR --check": Outcome(
        prints=r"^mapl-dual: accuracy",
        report=lambda r: (
            r["check"]["passed"]
            and r["schedule"]["schedule"] == "async"
            and r["slow"]["nodes"] == [0]
            and max(r["last_round_per_node"]) > r["rounds"] - 1
        ),
    ),
    # README: "poisoning peers shut out of MAPL": no weight on the poisoner in any honest row.
    "p2pnode simulate --algorithm mapl --dataset digits --nodes 4 --rounds 8 --samples-per-class 10 --backbones mlp "
    "--set warmup_rounds=3 --poisoners 1 --attack random --out DIR": Outcome(
        prints=r"poisoners \[1\] \(random\): honest accuracy",
        report=lambda r: r["poisoning"]["poisoner_weight"]["max"] <= 0.01,
    ),
}

NOT_RUN = {
    "make demo": "about 3 minutes of ten daemons on mnist5k, more than this module's whole budget; .ci/run "
    "does not run it either (lint and tests only). What it is made of is run here: the learning testnet "
    "and the simulator, on digits",
    "make test": "the test suite this module is part of",
    "p2pnode init --nodes 3 --out fleet": "writes into the current directory; tests/test_init.py runs `p2pnode init` "
    "with these options and starts the three daemons it configures",
    "make lint": ".ci/run runs it before the tests",
    "make bench": "a benchmark: minutes of measurement for BENCHMARKS.md; test_cli.py runs `p2pnode bench "
    "protocol|transport --quick`",
    "python -m tools.bench.heterogeneous --methods local mapl-dual --scenarios 1 --samples 10 --seeds 3": "a "
    "benchmark: 80 rounds of ten nodes per method and scenario; test_dual.py runs mapl-dual as simulator and testnet",
    "python -m tools.bench.fleets --nodes 4 --datasets mnist5k --seeds 3 4 5": "a benchmark: 21 runs of 40 rounds "
    "of four nodes for BENCHMARKS.md; test_bench_commands.py runs it on tiny sizes, test_dual.py runs mapl-auto "
    "as simulator and testnet",
    "python -m tools.bench.scale --nodes 10 30 100": "a benchmark: minutes of up to 100 daemons for BENCHMARKS.md; "
    "test_processes.py runs a 12-daemon testnet with a bounded view and test_overlay.py 100 simulated nodes",
    "python -m tools.bench.attacks": "a benchmark: floods of several seconds against fresh daemon pairs, measured "
    "for BENCHMARKS.md; each attack is a test in tests/adversarial/",
    "p2pnode testnet --algorithm mapl --dataset digits --nodes 4 --rounds 8 --samples-per-class 10 --backbones mlp "
    "--set warmup_rounds=3 --poisoners 3 --attack rescale --attack-factor 1e4 --barrage --check --out DIR": "the "
    "run tests/adversarial/test_hostile_learning.py makes through run_learning_testnet (the same spec, --check and "
    "barrage), with more asserted of its report; test_cli.py checks the CLI's flags reach it",
    "p2pnode doctor --config node.toml": "needs a running node: tests/test_diagnostics.py runs doctor's diagnosis "
    "on three daemons, tests/test_nat.py the command on a daemon behind a NAT",
    "python -m tools.bench.nat_fleet": "a benchmark (root, iptables, conntrack): tests/test_bench_commands.py runs "
    "its quick variant where P2PNODE_BENCH_COMMANDS=all, tests/test_nat.py the testbed and a daemon behind a NAT, "
    "tests/test_relays.py the relay and tools/sybil.py against it",
    "python -m tools.bench.hostile --seconds 60": "a benchmark: ten minute-long raw-ZMTP attacks on fresh 4-daemon "
    "testnets for BENCHMARKS.md; tests/adversarial/test_ingress.py runs each for 1.5 to 4 s",
    "p2pnode predict --config node.toml photo.png": "needs a node that has learned; tests/test_predict.py trains "
    "one and runs predict on every held-out image, through the running node and from its checkpoint",
    "p2pnode predict --config node.toml --ask-peers zebra.png": "needs two nodes that have learned; "
    "tests/test_ask_peers.py trains two with other classes and runs it on one with the other's images",
    "p2pnode export --config node.toml --out model.pt2": "needs a node that has learned; tests/test_predict.py "
    "exports one and loads the file with docs/usage.md's example in a Python that never imports p2pnode",
}


def test_every_readme_command_is_accounted_for():
    shown = set(shell_commands()) | set(table_commands())
    listed = set(RUN) | set(NOT_RUN) | set(running_a_node())
    assert not set(RUN) & set(NOT_RUN)
    assert shown - listed == set(), "a README command nobody runs: add it to RUN or NOT_RUN"
    assert listed - shown == set(), "listed here but gone from the README"


def _name(command: str) -> str:
    words = command.split()
    algorithm = words[words.index("--algorithm") + 1]
    return (
        f"{words[1]}-{algorithm}"
        + ("-poisoned" if "--poisoners" in words else "")
        + ("-async" if "async" in words else "")
    )


@dataclass(frozen=True)
class Ran:
    code: int
    printed: str  # stdout, then stderr
    out: Path  # its DIR

    def report(self) -> dict:
        return json.loads((self.out / "report.json").read_text())


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> Callable[[str], Ran]:
    """`command` run once in this module, whichever test asks first."""
    done: dict[str, Ran] = {}

    def run(command: str) -> Ran:
        if command not in done:
            out = tmp_path_factory.mktemp(_name(command)) / "out"
            argv = shlex.split(command.replace("DIR", str(out)))
            assert argv[0] == "p2pnode"
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = main(argv[1:])
            done[command] = Ran(code, stdout.getvalue() + stderr.getvalue(), out)
        return done[command]

    return run


@pytest.mark.parametrize("command", list(RUN), ids=_name)
def test_readme_command(command, ran):
    outcome, result = RUN[command], ran(command)
    assert result.code == outcome.code, result.printed[-3000:]
    assert re.search(outcome.prints, result.printed, flags=re.M), result.printed[-3000:]
    if outcome.report is not None:
        report = result.report()
        assert outcome.report(report), json.dumps(report)[:3000]


def _spec(command: str):
    from p2pnode_cli.scenario import learning_spec

    return learning_spec(build_parser().parse_args(shlex.split(command.replace("DIR", "out"))[1:]))


def test_the_mapl_testnet_matches_the_simulator_on_the_same_options(ran):
    """The README's 4 MAPL daemons beside its simulation of them: the report has the simulator's
    schema and numbers, and one round engine made both sides' records."""
    from testnet.reporting.summary import summary_page

    from .helpers import same_keys, same_records

    testnet, simulated = ran(MAPL_TESTNET), ran(MAPL_SIMULATE)
    assert testnet.code == simulated.code == 0, testnet.printed[-3000:]
    report, simulation = testnet.report(), simulated.report()
    assert abs(report["accuracy"]["mean"] - simulation["accuracy"]["mean"]) <= 0.02
    assert len(report["accuracy"]["per_round"]) == 8
    w = np.array(report["graph"]["W"])
    np.testing.assert_allclose(w.sum(axis=1), 1)
    assert w.min() >= 0 and report["graph"]["within_cluster_mass"] >= 0.9
    sent = [run["comm"]["by_type"]["PROTOTYPES"]["messages"] for run in (report, simulation)]
    assert sent[0] == sent[1] > 0
    assert 1.0 < report["comm"]["envelope_overhead"] < 1.1
    assert report["processes"]["exit_codes"] == [0] * 4 and report["processes"]["catch_ups"] == [0] * 4
    # One report builder: the same keys at every level; what only processes have is null in a simulation.
    assert simulation["processes"]["exit_codes"] is None
    assert same_keys(report, simulation) == []
    # Each daemon's resident memory after the run, and its peak: a learning process holds torch.
    rss, peak = report["processes"]["rss_mb"], report["processes"]["peak_rss_mb"]
    assert all(100 < now <= top + 1 for now, top in zip(rss, peak, strict=True)) and len(rss) == 4, (rss, peak)
    page = summary_page(report)
    assert (
        f"| daemon memory, MiB (after the run · peak) | median {statistics.median(rss):.0f}, max {max(rss):.0f} · "
        in page
    )
    assert "| node | backbone | classes | neighbours (w > 0) | RSS / peak MiB | mapl [95 % Wilson] |" in page
    assert "RSS / peak MiB" not in summary_page(simulation)
    histories = [read_history(testnet.out / f"node{i:02d}" / "data" / HISTORY_NAME) for i in range(4)]
    same_records(_spec(MAPL_TESTNET), histories)


def test_the_discovery_testnet_reaches_a_full_mesh_and_reports(ran):
    """The README's 5 daemons without learning: the launcher's report counts the traffic by type,
    and every daemon stopped cleanly (its daemons as processes: tests/test_processes.py)."""
    report = ran(DISCOVERY_TESTNET).report()
    assert report["algorithm"] == "none" and report["nodes"] == 5
    assert report["discovery"]["peer_counts"] == [4] * 5
    assert 0 < report["discovery"]["full_mesh_s"] <= 30
    comm = report["comm"]
    assert comm["messages"] == sum(t["messages"] for t in comm["by_type"].values()) > 0
    assert comm["bytes"] == sum(t["bytes"] for t in comm["by_type"].values()) > 0
    assert {"HELLO", "PEERS"} <= set(comm["by_type"])
    assert report["node_exit_codes"] == [0] * 5


def test_the_scool_testnet_separates_two_groups_and_matches_the_simulator(ran):
    """The README's 4 SCooL-SBM daemons, two groups of two: the learned graph finds each node's
    partner, and the numbers are the simulator's on the same options."""
    from .helpers import same_keys

    testnet, simulated = ran(SCOOL_TESTNET), ran(SCOOL_SIMULATE)
    assert testnet.code == simulated.code == 0, testnet.printed[-3000:]
    report, simulation = testnet.report(), simulated.report()
    assert report["graph"]["l1_to_truth"] <= 0.2 and len(report["graph"]["l1_to_truth_per_round"]) == 6
    assert report["graph"]["within_cluster_mass"] >= 0.95
    assert report["accuracy_own_classes"]["mean"] >= 0.9
    assert abs(report["accuracy"]["mean"] - simulation["accuracy"]["mean"]) <= 0.02
    for kind in ("MODEL", "SCORE"):
        assert report["comm"]["by_type"][kind]["messages"] == simulation["comm"]["by_type"][kind]["messages"], kind
    assert report["rejections"] == {} and report["processes"]["exit_codes"] == [0] * 4
    assert same_keys(report, simulation) == []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_running_a_node(tmp_path, monkeypatch, capsys):
    """The "Running a node" block, line by line, in an empty directory: keygen prints the node
    id, the config is written, `start` runs in the foreground (here: in the background), `status`
    shows the node, `stop` stops it and `start` then exits 0. Only the two ports differ: the
    README's 7000 and 7001 may be taken on this machine."""
    monkeypatch.chdir(tmp_path)
    ports = {"7000": str(_free_port()), "7001": str(_free_port())}
    node, node_id = None, None
    try:
        for line in running_a_node():
            line = re.sub(r"\b700[01]\b", lambda port: ports[port[0]], line)
            words = shlex.split(line)
            if words[0] == "printf":
                subprocess.run(["bash", "-c", line], check=True)
            elif words[1] == "start":  # in the foreground until stopped: a process of its own
                env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, wherever the test runs
                node = subprocess.Popen(
                    [sys.executable, "-m", "p2pnode_cli", *words[1:]], stderr=subprocess.PIPE, text=True, env=env
                )
                deadline = time.monotonic() + 60
                while main(["status", *words[2:]]) != 0:  # until its control socket answers
                    assert node.poll() is None and time.monotonic() < deadline, "start failed"
                    time.sleep(0.1)
                capsys.readouterr()
            else:
                node_id = _judge(words, capsys.readouterr, node, node_id, ports["7000"])
    finally:
        if node is not None and node.poll() is None:
            node.kill()
        if node is not None:
            node.communicate()
    assert node is not None and node.returncode == 0


def _judge(words: list[str], readout, node: subprocess.Popen | None, node_id: str | None, port: str) -> str | None:
    """Run one p2pnode command of the block and hold it to what the README says it does;
    returns the node id once keygen has printed it."""
    code = main(words[1:])
    printed = readout()
    assert code == 0, printed.err
    command = words[1]
    if command == "keygen":  # "prints the node id", and only that, on stdout
        node_id = printed.out.strip()
        assert re.fullmatch(r"[0-9a-f]{16}", node_id) and "mode 0600" in printed.err
    elif command == "status":  # the node's id and address, its peers (none: 7001 is nobody)
        assert printed.out.startswith(f"node {node_id}  tcp://127.0.0.1:{port}")
        assert "peers 0/64" in printed.out and "traffic" in printed.out
    elif command == "stop":
        assert printed.err.strip() == "stopped"
        assert node.poll() is not None  # "stopped" once the process has ended, not before
        _, log = node.communicate(timeout=10)
        assert node.returncode == 0 and f"node {node_id} stopped" in log, log
    else:
        raise AssertionError(f"the README block runs {command!r}: say here what it should do")
    return node_id


def _synopsis() -> dict[str, set[str]]:
    """Each command of docs/cli.md's synopsis (the README's "Command line" points there) and the
    options it shows (continuation lines included)."""
    (block,) = _blocks("", (ROOT / "docs" / "cli.md").read_text())
    shown: dict[str, set[str]] = {}
    command = None
    for line in block.splitlines():
        if line.startswith("p2pnode "):
            command = line.split()[1] + (" " + line.split()[2].split("|")[0] if line.split()[1] == "bench" else "")
            shown.setdefault(command, set())
        shown[command] |= set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line))
    return shown


def test_the_command_synopsis_matches_the_parser():
    parsers = build_parser()._subparsers._group_actions[0].choices
    shown = _synopsis()
    assert {command.split()[0] for command in shown} == set(parsers)
    for command, options in shown.items():
        parser = parsers[command.split()[0]]
        if " " in command:
            parser = parser._subparsers._group_actions[0].choices[command.split()[1]]
        known = {option for action in parser._actions for option in action.option_strings}
        assert options <= known, f"{command}: {options - known} shown in docs/cli.md but not accepted"
