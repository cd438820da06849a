"""The one report builder, on hand-made round records: what a round and a run add up to."""

import numpy as np
import pytest

from algorithms.graphs.graph import adjusted_rand_index, communities
from p2pnode.learning.rounds import right_bits
from testnet.reporting.intervals import wilson
from testnet.reporting.report import CheckThresholds, Truth, assemble, attach_baselines, check, summary_line

from .helpers import record

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

IDS = ["a", "b", "c", "d"]
TRUTH = Truth(w=np.kron(np.eye(2), np.full((2, 2), 0.5)), clusters=np.array([0, 0, 1, 1]))


def header(rounds: int = 3) -> dict:
    return {"algorithm": "mapl", "node_ids": IDS, "rounds": rounds}


def run_of(records, **extra) -> dict:
    return assemble(header(), records, TRUTH, rejections={"bad_shape": 2}, wall_s=1.5, **extra)


def test_every_node_every_round():
    records = []
    for r in range(3):
        for i, node in enumerate(IDS):
            partner = IDS[i ^ 1]
            sent = {"PROTOTYPES": ((r + 1) * 3, (r + 1) * 3000, (r + 1) * 2700)}
            records.append(
                record(
                    node,
                    r,
                    accuracy=0.5 + 0.1 * r + 0.02 * i,
                    loss=2.0 - 0.5 * r,
                    weights={node: 0.5, partner: 0.5},
                    sent=sent,
                    recipients=3,
                    test_samples=50,
                )
            )
    report = run_of(records)
    assert report["accuracy"]["per_round"] == pytest.approx([0.53, 0.63, 0.73])
    band = report["accuracy"]["per_round_band"]
    assert band["min"] == pytest.approx([0.5, 0.6, 0.7]) and band["max"] == pytest.approx([0.56, 0.66, 0.76])
    assert band["median"] == pytest.approx([0.53, 0.63, 0.73]) and band["q1"][0] == pytest.approx(0.515)
    assert (
        report["loss"]["train_per_round"] == [2.0, 1.5, 1.0] and report["loss"]["train_per_round_band"]["max"][2] == 1
    )
    # Final accuracies 0.70, 0.72, 0.74, 0.76 of 50 images each: 35 + 36 + 37 + 38 = 146 of 200.
    assert report["accuracy"]["test_samples_per_node"] == [50] * 4
    pooled = report["accuracy"]["pooled"]
    assert (pooled["correct"], pooled["n"]) == (146, 200) and (pooled["low"], pooled["high"]) == wilson(146, 200)
    assert report["accuracy"]["per_node"] == pytest.approx([0.7, 0.72, 0.74, 0.76])
    assert report["graph"]["l1_to_truth"] == 0 and report["graph"]["within_cluster_mass"] == 1
    assert report["graph"]["communities"] == [0, 0, 1, 1] and report["graph"]["community_agreement"] == 1
    comm = report["comm"]
    assert comm["by_type"] == {
        "PROTOTYPES": {"messages": 36, "bytes": 36000, "bytes_cumulative_per_round": [12000, 24000, 36000]}
    }
    assert comm["bytes_cumulative_per_round"] == [12000, 24000, 36000]
    assert comm["envelope_overhead"] == pytest.approx(36000 / 32400)
    assert comm["recipients_last_round"] == [3] * 4
    assert comm["discovery"] == {"messages": 0, "bytes": 0, "by_type": {}, "bytes_cumulative_per_round": [0, 0, 0]}
    assert report["baselines"] == {}
    assert report["rejections"] == {"bad_shape": 2} and report["check"] is None
    processes = (
        "engine",
        "addresses",
        "exit_codes",
        "logs",
        "resumed_from",
        "catch_ups",
        "rss_mb",
        "peak_rss_mb",
        "ingress_rss_mb",
        "ingress_restarts",
        "reachability",
        "relay",
    )
    later = ("churn", "restarts", "restarted_after", "exits", "timeout_s", "timed_out")
    assert report["processes"] == dict.fromkeys((*processes, *later))
    assert report["timing"]["gather_s_mean"] is None  # nobody measured a gather


def test_a_late_node_and_a_node_that_skipped_a_round():
    records = [
        record("a", 0, accuracy=0.4),
        record("b", 0, accuracy=0.6),
        record("a", 2, accuracy=0.8),  # skipped round 1: its round-0 record stands in for it
        record("b", 1, accuracy=0.7),
        record("b", 2, accuracy=0.9),
        record("c", 2, accuracy=0.5, missing=("a", "b")),  # joined late
    ]
    report = run_of(records)
    assert report["accuracy"]["per_round"] == pytest.approx([0.5, 0.55, (0.8 + 0.9 + 0.5) / 3])
    assert report["accuracy"]["per_node"] == [0.8, 0.9, 0.5, None]
    assert report["accuracy"]["mean"] == pytest.approx(2.2 / 3)
    assert report["rounds_completed_per_node"] == [2, 3, 1, 0]
    assert report["last_round_per_node"] == [2, 2, 2, None]  # a and c skipped rounds, yet finished
    assert report["missing_payloads"] == 2
    w = np.array(report["graph"]["W"])
    assert w[3].tolist() == [0, 0, 0, 1]  # no record: the node talks to no one
    failures = check(report, CheckThresholds())["failures"]
    assert failures == ["nodes [3] recorded no round", "some nodes reported no accuracy"]


def test_the_check_judges_accuracy_and_a_learned_graph():
    across = {"a": "c", "b": "d", "c": "a", "d": "b"}  # half of each row on the other cluster
    records = [record(node, r, accuracy=0.5, weights={node: 0.5, across[node]: 0.5}) for r in range(3) for node in IDS]
    verdict = check(run_of(records), CheckThresholds(accuracy=0.6, within_cluster_mass=0.9))
    assert not verdict["passed"]
    assert verdict["failures"] == ["mean accuracy 0.5 below 0.6", "within-cluster mass 0.500 below 0.9"]
    assert verdict["thresholds"] == {"accuracy": 0.6, "within_cluster_mass": 0.9, "rounds_completed": True}
    # A node that stopped early fails the check even if the rounds it ran were good.
    stopped = [entry for entry in records if not (entry.node == "d" and entry.round == 2)]
    verdict = check(run_of(stopped), CheckThresholds(accuracy=0.0, within_cluster_mass=0.0))
    assert verdict["failures"] == ["nodes [3] stopped before the last round (2)"]


def test_louvain_communities_and_their_agreement_with_the_truth():
    two_blocks = TRUTH.w
    assert communities(two_blocks) == [0, 0, 1, 1]
    assert communities(np.eye(4)) == [0, 1, 2, 3]  # no edges: every node alone
    assert adjusted_rand_index([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0  # labels do not matter
    assert adjusted_rand_index([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(-0.5)
    assert adjusted_rand_index([0, 1, 2, 3], [0, 0, 1, 1]) == 0.0


def test_discovery_traffic_per_round_beside_the_learning_traffic():
    """The daemons' records carry their discovery frames so far; the totals come from their
    counters at the end (which also count what was sent after the last round)."""
    records = [
        record(node, r, sent={"PROTOTYPES": (r + 1, 1000 * (r + 1), 900 * (r + 1))}, discovery_sent=hello_ping(r))
        for r in range(3)
        for node in IDS
    ]
    totals = {
        "messages": 40,
        "bytes": 5000,
        "by_type": {"HELLO": {"messages": 8, "bytes": 3000}, "PING": {"messages": 32, "bytes": 2000}},
    }
    comm = run_of(records, discovery=totals)["comm"]
    assert comm["bytes_cumulative_per_round"] == [4000, 8000, 12000]
    discovery = comm["discovery"]
    assert (discovery["messages"], discovery["bytes"]) == (40, 5000)
    assert discovery["by_type"]["HELLO"]["bytes_cumulative_per_round"] == [4 * 300] * 3
    assert discovery["by_type"]["PING"]["bytes_cumulative_per_round"] == [4 * 100, 4 * 200, 4 * 300]
    assert discovery["bytes_cumulative_per_round"] == [4 * 400, 4 * 500, 4 * 600]


def hello_ping(round: int) -> dict:
    return {"HELLO": (2, 300, 0), "PING": (round + 1, 100 * (round + 1), 0)}


def test_baselines_go_beside_the_run_with_a_paired_interval():
    def run(accuracies, algorithm="mapl", rights=None):
        header = {
            "algorithm": algorithm,
            "node_ids": IDS,
            "rounds": 1,
            "dataset": "digits",
            "nodes": 4,
            "seed": 0,
            "config": {},
            "backbones": ["mlp"] * 4,
        }
        rights = rights or [[] for _ in accuracies]
        records = [
            record(node, 0, accuracy=a, test_samples=20, test_right=right_bits(r))
            for node, a, r in zip(IDS, accuracies, rights, strict=True)
        ]
        return assemble(header, records, TRUTH, rejections={}, wall_s=1.0)

    # Four nodes are too few for an interval over nodes; without each image's outcome, no interval.
    report = attach_baselines(run([0.8, 0.9, 0.7, 0.8]), {"local": run([0.75, 0.85, 0.65, 0.75], "local")})
    local = report["baselines"]["local"]
    assert local["algorithm"] == "local" and local["accuracy"]["per_node"] == [0.75, 0.85, 0.65, 0.75]
    assert local["difference"]["mean"] == pytest.approx(0.05) and local["difference"]["low"] is None
    assert "no interval" in local["difference"]["method"]
    # With them, the interval is over the 80 images, pairs kept: each node's method gets one image
    # of 20 right that Local does not.
    ours = [[True] * (k + 1) + [False] * (19 - k) for k in (15, 17, 13, 15)]
    theirs = [[True] * k + [False] * (20 - k) for k in (15, 17, 13, 15)]
    paired = attach_baselines(
        run([0.8, 0.9, 0.7, 0.8], rights=ours), {"local": run([0.75, 0.85, 0.65, 0.75], "local", rights=theirs)}
    )
    difference = paired["baselines"]["local"]["difference"]
    assert difference["unit"] == "images" and difference["images"] == 80 and difference["nodes"] == 4
    assert difference["mean"] == pytest.approx(0.05) and 0 < difference["low"] < 0.05 < difference["high"] <= 0.1
    # The line the CLI ends with says it too.
    line = summary_line(paired)
    assert "; Local 75.0 %, gain +5.0 points [" in line and "over the 80 test images of 4 nodes" in line
    assert "gain +5.0 points (no interval" in summary_line(report)
    other_seed = {**run([0.5] * 4, "local"), "seed": 1}
    with pytest.raises(ValueError, match="seed differ"):
        attach_baselines(run([0.8] * 4), {"local": other_seed})


def test_without_a_truth_the_figures_measured_against_it_are_null_and_the_page_says_so(tmp_path):
    """A deployment on its own data knows no W* nor clusters: those figures are null, not made
    up, and report.md and graph.png are drawn from the learned W alone."""
    from testnet.reporting.report import summary_line, write_report

    records = [record(node, r, weights={node: 0.6, IDS[i ^ 1]: 0.4}) for r in range(2) for i, node in enumerate(IDS)]
    header = {
        "kind": "deployment",
        "algorithm": "mapl",
        "node_ids": IDS,
        "rounds": 2,
        "dataset": "own data",
        "scenario": None,
        "clusters": None,
        "nodes": 4,
        "seed": 0,
        "samples_per_class": None,
        "test_per_class": None,
        "backbones": ["mlp"] * 4,
        "node_classes": [[0, 1]] * 4,
        "config": {},
        "provenance": {},
        "partition_notes": [],
    }
    report = assemble(header, records, None, rejections={}, wall_s=1.0)
    graph = report["graph"]
    for key in ("W_true", "clusters", "l1_to_truth", "within_cluster_mass", "community_agreement"):
        assert graph[key] is None, key
    assert graph["l1_to_truth_per_round"] is None and graph["communities"] == [0, 0, 1, 1]
    assert graph["W"][0] == [0.6, 0.4, 0, 0]
    written = write_report(report, tmp_path)
    page = (tmp_path / "report.md").read_text()
    assert "The true clusters and W* are unknown here" in page and "| 0 | 0.60 | 0.40 | 0.00 | 0.00 |" in page
    assert "# mapl · own data · 4 nodes · 2 rounds" in page and "| own data · — · — |" in page
    assert tmp_path / "graph.png" in written and "within-cluster" not in summary_line(report)


def test_the_default_timeout_grows_with_daemons_per_core_and_a_run_that_hits_it_says_so():
    from testnet.launch.learning import _watch, default_timeout_s

    assert default_timeout_s(4, 8, 5.0, cores=2) == 180 + 10 + 8 * 10  # few daemons: as before, plus loading
    assert default_timeout_s(20, 30, 5.0, cores=2) == 180 + 50 + 30 * 10 * 2  # twice the daemons the cores step
    assert default_timeout_s(20, 30, 5.0, cores=4) == 180 + 25 + 30 * 10
    assert default_timeout_s(4, 8, 5.0, cores=2, slowest=10) == 180 + 10 + 8 * 55  # paced: 5 s of work × 10

    class Silent:  # daemons that never answer, under a supervisor with nothing to do
        specs = (object(), object())
        started = 0.0

        def statuses(self):
            return [None, None]

        def poll(self, statuses, eligible):
            return True

        def lost(self, spec):
            return False

        def busy(self):
            return False

        def downtimes(self):
            return []

    import io
    import time

    finals, interrupted, timed_out = _watch(Silent(), Silent(), 3, time.monotonic() + 0.2, 0.05, io.StringIO())
    assert finals == [None, None] and not interrupted and timed_out


def test_a_pooled_interval_takes_the_run_as_its_unit():
    """testnet/reporting/intervals.py `runs_bootstrap`: nodes of one run share its luck. Three runs whose
    nodes agree within each run, the runs apart: the interval spans the runs' spread, far wider
    than a bootstrap over the 12 nodes as if independent."""
    from testnet.reporting.intervals import paired_bootstrap, runs_bootstrap

    runs = [[0.01] * 4, [0.05] * 4, [-0.03] * 4]
    mean, low, high = runs_bootstrap(runs)
    assert mean == pytest.approx(0.01) and low == pytest.approx(-0.03) and high == pytest.approx(0.05)
    nodes = [d for run in runs for d in run]
    _, node_low, node_high = paired_bootstrap(nodes, [0.0] * len(nodes))
    assert high - low > 1.5 * (node_high - node_low)
    assert runs_bootstrap([[0.02, 0.04]]) == pytest.approx((0.03, 0.02, 0.04))  # one run: its nodes
    # Runs of different sizes: a run draws as many nodes as it has, never one it does not have.
    assert runs_bootstrap([[0.05], [0.05] * 3]) == pytest.approx((0.05, 0.05, 0.05))
    assert runs_bootstrap([[0.0] * 2, [1.0] * 6]) == pytest.approx((0.75, 0.0, 1.0))
    with pytest.raises(ValueError):
        runs_bootstrap([[0.1], []])


def test_a_testnet_stops_waiting_for_a_daemon_whose_learning_failed():
    """A daemon whose learning raised runs on without it (crash isolation), so its rounds never
    come: the launcher's watch counts it finished at once, says which node and why, and does not
    wait out the run's timeout."""
    import io
    import time
    from types import SimpleNamespace

    from testnet.launch.learning import _watch

    done = {"learning": {"algorithm": "mapl", "completed": 8, "accuracy": 0.9, "phase": "done"}}
    failed = {"learning": {"algorithm": "mapl", "completed": 5, "accuracy": 0.8, "phase": "failed: NameError: x"}}
    cluster = SimpleNamespace(specs=[object(), object()], statuses=lambda: [done, failed])
    supervisor = SimpleNamespace(
        started=time.monotonic(),
        poll=lambda statuses, eligible: True,
        lost=lambda node: False,
        busy=lambda: False,
        arm=lambda: None,
        downtimes=list,
    )
    progress = io.StringIO()
    began = time.monotonic()
    finals, interrupted, timed_out = _watch(cluster, supervisor, 8, time.monotonic() + 60, 0.01, progress)
    assert not interrupted and not timed_out and time.monotonic() - began < 5
    assert finals == [done, failed]
    assert "node 1: learning failed: NameError: x (its node.log has the traceback)" in progress.getvalue()
