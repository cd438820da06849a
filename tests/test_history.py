"""A deployed node's result (issue #28, item 2): the history file each daemon appends a record to
per round (p2pnode/learning/history.py), the local baseline beside the collaborative model, and
`p2pnode report` over the histories of a fleet (testnet/reporting/deployment.py)."""

import csv
import json
import logging
import os
from pathlib import Path

import pytest
import trio

from p2pnode.learning.checkpoint import CHECKPOINT_NAME, Checkpoint
from p2pnode.learning.history import HISTORY_NAME, HistoryFile, history_paths, read_history
from p2pnode_cli import main

from .helpers import free_ports, init, learning_sections, record, run_fleet, start_node, wait_until, write_digit_pngs

START = {"node": "a", "algorithm": "mapl", "resumed_from": None}


def rounds_of(path) -> list[int]:
    return [entry.round for entry in read_history(path).records]


def test_records_are_appended_one_line_each_and_read_back(tmp_path):
    path = tmp_path / HISTORY_NAME
    history = HistoryFile(path, 1 << 20)
    history.start(START)
    written = [record("a", r, accuracy=0.5 + r / 10, local_baseline={"accuracy": 0.4}) for r in range(3)]
    for entry in written:
        history.append(entry)
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0]) == {"start": START}
    read = read_history(path)
    assert read.records == written and read.starts == [START]
    assert (read.unreadable, read.replaced, history.failures) == (0, 0, 0)
    with pytest.raises(FileNotFoundError, match="no history file"):
        read_history(tmp_path / "elsewhere" / HISTORY_NAME)


def test_after_a_restart_the_rounds_carried_on_from_are_kept_once_each(tmp_path):
    """A node ran rounds 0-4 and died while writing round 5 (a torn line); its checkpoint was
    of round 2. Restarted, it re-runs round 3, then catches up to round 6: the report has
    rounds 0-2 of the first run, the new round 3, no round 4 (its state was lost) and round 6."""
    path = tmp_path / HISTORY_NAME
    first = HistoryFile(path, 1 << 20)
    first.start(START)
    for r in range(5):
        first.append(record("a", r, accuracy=0.1))
    with path.open("ab") as handle:
        handle.write(b'{"round": 5, "accur')  # the crash
    again = HistoryFile(path, 1 << 20)
    again.start({**START, "resumed_from": 2})
    again.append(record("a", 3, accuracy=0.9))
    again.append(record("a", 6, accuracy=0.95))
    read = read_history(path)
    assert [(entry.round, entry.accuracy) for entry in read.records] == [
        (0, 0.1),
        (1, 0.1),
        (2, 0.1),
        (3, 0.9),
        (6, 0.95),
    ]
    assert (read.unreadable, read.replaced) == (1, 2)  # the torn line; rounds 3 and 4 of the first run
    assert [start["resumed_from"] for start in read.starts] == [None, 2]
    # A fresh start (no checkpoint: deleted, or [algorithm].checkpoint off) begins a new result.
    fresh = HistoryFile(path, 1 << 20)
    fresh.start(START)
    fresh.append(record("a", 0, accuracy=0.3))
    assert [(entry.round, entry.accuracy) for entry in read_history(path).records] == [(0, 0.3)]


def test_the_file_is_bounded_and_keeps_the_latest_rounds(tmp_path):
    path = tmp_path / HISTORY_NAME
    bound = 4096
    history = HistoryFile(path, bound)
    history.start(START)
    line = len(json.dumps(record("a", 10).to_dict()))
    rounds = 3 * bound // line
    for r in range(rounds):
        history.append(record("a", r))
    older, current = history_paths(path)
    assert history.rotations >= 2 and history.failures == 0
    assert path.stat().st_size <= bound and older.stat().st_size <= bound
    # The new file begins with the start line again, marked as a continuation (it discards nothing).
    assert json.loads(current.read_text().splitlines()[0]) == {"start": {**START, "continued": True}}
    kept = rounds_of(path)
    assert kept == list(range(kept[0], rounds)) and 0 < kept[0] < rounds - bound // line


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_counted_and_logged_once_never_raised(tmp_path, caplog):
    """Writes to /dev/full fail as on a full disk (ENOSPC): each failure is counted, the first
    one of a streak logged at ERROR, and once there is room the next record is written whole."""
    caplog.set_level(logging.DEBUG, logger="p2pnode.history")
    path = tmp_path / HISTORY_NAME
    path.symlink_to("/dev/full")
    history = HistoryFile(path, 1 << 20)
    history.start(START)
    history.append(record("a", 0))
    assert history.failures == 2 and "round 0: no space left on device (errno 28)" in history.error
    errors = [entry.getMessage() for entry in caplog.records if entry.levelno == logging.ERROR]
    assert len(errors) == 1 and "start line: no space left on device" in errors[0], errors
    assert history.status()["history_failures"] == 2
    path.unlink()  # room again
    history.append(record("a", 1))
    assert (history.failures, history.error) == (2, None)
    assert rounds_of(path) == [1]
    assert any("written to" in entry.getMessage() and "again" in entry.getMessage() for entry in caplog.records)


async def test_the_local_baseline_is_checkpointed_and_resumes_where_it_was(tmp_path):
    """One node with `local_baseline = true`: stopped after round 1 and restarted, its baseline
    goes on from the checkpoint, exactly as in a run that was never stopped; the history holds
    every round once, each with the baseline's figures."""

    async def run(directory, rounds: int):
        sections = learning_sections(
            0, 1, rounds=rounds, start_peers=0, local_baseline=True, settings={"warmup_rounds": 1}
        )
        async with trio.open_nursery() as nursery:
            node = await start_node(nursery, directory, **sections)
            await wait_until(lambda: node.driver and node.driver.phase == "done", timeout=120)
            node.request_stop()
        return node

    await run(tmp_path / "stopped", 2)
    saved = Checkpoint.load(tmp_path / "stopped" / "data" / CHECKPOINT_NAME, "mapl")
    assert saved.round == 1 and saved.local_baseline["since"] == 0 and "trainer" in saved.local_baseline["state"]
    resumed = await run(tmp_path / "stopped", 4)
    assert resumed.driver.state.resumed_from == 1
    await run(tmp_path / "straight", 4)
    stopped = read_history(tmp_path / "stopped" / "data" / HISTORY_NAME)
    straight = read_history(tmp_path / "straight" / "data" / HISTORY_NAME)
    assert [entry.round for entry in stopped.records] == [0, 1, 2, 3]
    assert [start["resumed_from"] for start in stopped.starts] == [None, 1]
    assert stopped.starts[-1]["local_baseline"] and stopped.starts[-1]["classes"]
    for ours, theirs in zip(stopped.records, straight.records, strict=True):
        assert ours.local_baseline == pytest.approx(theirs.local_baseline)
        figures = {"accuracy", "own_class_accuracy", "loss", "test_loss", "since", "test_right"}
        assert set(ours.local_baseline) == figures


def test_report_of_three_daemons_with_a_local_baseline(tmp_path, capsys):
    """`p2pnode init --nodes 3` on digit PNG folders, `local_baseline = true` added to each
    config, a few rounds; then `p2pnode report --config ×3` writes report.md with every node's
    accuracy over the rounds, the learned neighbours and what collaboration gained over the
    local baseline, all equal to the histories'."""
    for index, classes in enumerate(((0, 1, 2), (2, 3, 4), (4, 5, 0))):
        write_digit_pngs(tmp_path / "images" / f"device{index}", classes, part=index, parts=3, per_class=20)
    rounds = 3
    code, paths, err = init(
        capsys,
        *("--nodes", "3", "--out", str(tmp_path / "fleet"), "--port", str(free_ports(6))),
        *("--data-per-node", str(tmp_path / "images"), "--image-size", "8", "--backbone", "mlp"),
        *("--rounds", str(rounds), "--set", "warmup_rounds=2"),
    )
    assert code == 0, err
    for path in map(Path, paths):
        path.write_text(path.read_text().replace("[algorithm]\n", "[algorithm]\nlocal_baseline = true\n"))
    directories = [tmp_path / "fleet" / f"node{i}" for i in range(3)]
    run_fleet(directories)
    histories = [read_history(directory / "data" / HISTORY_NAME).records for directory in directories]
    assert all([entry.round for entry in history] == list(range(rounds)) for history in histories)
    out = tmp_path / "report"
    assert main(["report", *(arg for path in paths for arg in ("--config", path)), "--out", str(out), "--files"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    page = (out / "report.md").read_text()
    assert report["kind"] == "deployment" and report["graph"]["W_true"] is None and report["clusters"] is None
    assert "The true clusters and W* are unknown here" in page
    finals = [history[-1] for history in histories]
    assert report["accuracy"]["per_node"] == [entry.accuracy for entry in finals]
    table = report["accuracy_per_node_per_round"]
    assert table["rounds"] == list(range(rounds))
    assert table["per_node"] == [[entry.accuracy for entry in history] for history in histories]
    assert "## Accuracy per round, per node" in page
    for r in range(rounds):  # every round's row: node 0's accuracy (and its baseline's) as recorded
        node0 = histories[0][r]
        cell = f"{node0.accuracy * 100:.1f} % ({node0.local_baseline['accuracy'] * 100:.1f} %)"
        assert f"| {r} | {cell} |" in page, page
    # The learned neighbours: each node's last-round weights, in report.json and on the page.
    ids = report["node_ids"]
    for i, entry in enumerate(finals):
        assert report["graph"]["W"][i] == [entry.weights.get(peer, 0.0) for peer in ids]
        neighbours = ", ".join(str(j) for j in range(3) if j != i and entry.weights.get(ids[j], 0) > 0)
        assert f"| {i} | mlp | " in page and f"| {neighbours} |" in page
    # What collaboration gained over the local baseline, per node and overall.
    gains = [entry.accuracy - entry.local_baseline["accuracy"] for entry in finals]
    gain = report["local_baseline_gain"]
    assert [entry["gain"] for entry in gain["per_node"]] == pytest.approx(gains)
    assert gain["difference"]["mean"] == pytest.approx(sum(gains) / 3) and gain["difference"]["nodes"] == 3
    assert "## What collaboration gained" in page
    for i, value in enumerate(gains):
        assert f"node {i}: collaboration gained {value * 100:+.1f} points here" in page
    overall = f"collaboration gained {sum(gains) / 3 * 100:+.1f} points ["
    assert f"Overall: {overall}" in page and overall in printed
    # Three nodes are too few for an interval over nodes: it is over their test images, pairs kept.
    images = sum(report["accuracy"]["test_samples_per_node"])
    assert gain["difference"]["unit"] == "images" and gain["difference"]["images"] == images
    assert f"paired bootstrap over the {images} test images of 3 nodes" in printed
    assert report["baselines"]["local"]["accuracy"]["per_node"] == [e.local_baseline["accuracy"] for e in finals]
    assert {"graph.png", "accuracy.png", "loss.png"} <= {path.name for path in out.iterdir()}
    # --files: each node's held-out images by name, what it predicts for each, as its accuracy says.
    for i, entry in enumerate(finals):
        with (out / "held_out" / f"node{i}.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == entry.test_samples and f"node {i}: held-out images: " in printed
        assert all(Path(row["file"]).is_file() and row["file"].startswith(str(tmp_path / "images")) for row in rows)
        assert all(Path(row["file"]).parent.name == row["class"] for row in rows)  # the class folder
        assert sum(int(row["correct"]) for row in rows) / len(rows) == pytest.approx(entry.accuracy)


def test_a_restart_is_on_the_report_and_what_was_sent_before_it_still_counts(tmp_path, capsys):
    """Issue #45: a daemon counts its frames from its own start, so after a restart the report's
    cumulative bytes fell back at that round and its totals left out what went before; the
    discovery traffic the histories carry showed as 0.00 MiB; the restart showed nowhere."""
    from p2pnode.config import load_config

    code, paths, err = init(
        capsys, "--nodes", "2", "--out", str(tmp_path / "fleet"), "--rounds", "3", "--set", "warmup_rounds=1"
    )
    assert code == 0, err
    ids = [load_config(path).identity.node_id for path in paths]
    weights = dict.fromkeys(ids, 0.5)

    def sent(n: int) -> dict:
        return {"PROTOTYPES": (n, 100 * n, 80 * n)}

    def discovery(n: int) -> dict:
        return {"PING": (n, 10 * n, 0)}

    for node, path in zip(ids, paths, strict=True):
        load_config(path).node.data_dir.mkdir()  # the daemon makes it when it starts
        history = HistoryFile(load_config(path).node.data_dir / HISTORY_NAME, 1 << 20)
        history.start({**START, "node": node})
        for r, n in ((0, 2), (1, 4), (2, 6)) if node == ids[0] else ((0, 2), (1, 4)):
            history.append(record(node, r, weights=weights, sent=sent(n), discovery_sent=discovery(3 * n)))
        if node == ids[1]:  # restarted from its checkpoint of round 1: its counters start again
            again = HistoryFile(load_config(path).node.data_dir / HISTORY_NAME, 1 << 20)
            again.start({**START, "node": node, "resumed_from": 1})
            again.append(record(node, 2, weights=weights, sent=sent(1), discovery_sent=discovery(3)))
    out = tmp_path / "report"
    assert main(["report", *(arg for path in paths for arg in ("--config", path)), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    comm = report["comm"]
    assert comm["by_type"]["PROTOTYPES"] == {
        "messages": 6 + 5,
        "bytes": 1100,
        "bytes_cumulative_per_round": [400, 800, 1100],
    }
    assert comm["bytes_cumulative_per_round"] == sorted(comm["bytes_cumulative_per_round"])  # never falls back
    assert comm["discovery"]["messages"] == 18 + 15 and comm["discovery"]["bytes"] == 330
    assert report["processes"]["restarted_after"] == [[], [1]]
    page = (out / "report.md").read_text()
    assert "## Nodes restarted during the run" in page and "| 1 | round 1 |" in page
    assert "| all discovery | | 33 | 0.00 |" in page
