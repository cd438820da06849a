"""Learning over real sockets: the round driver in-process, and whole testnets of processes."""

import statistics

import numpy as np
import pytest
import trio

from algorithms.catalog import ALGORITHM_NAMES, GRAPH_LEARNING
from p2pnode.config import ConfigError, load_config
from p2pnode.discovery.capabilities import learning_capability
from p2pnode.learning.checkpoint import CHECKPOINT_NAME
from p2pnode.learning.history import HISTORY_NAME, read_history
from p2pnode.learning.rounds import DUPLICATE_PAYLOAD
from protocol import Prototypes, seal_raw

from .helpers import ANY_PORT, full_mesh, learning_sections, scrape, start_node, wait_for, wait_until, write_config


def test_learning_sections_are_validated(tmp_path):
    assert set(GRAPH_LEARNING) <= set(ALGORITHM_NAMES)
    bad = {
        "data": {"dataset": "imagenet", "nodes": 2, "node_index": 5, "classes": [1, 5000]},
        "model": {"backbone": "vgg", "device": "tpu"},
        "algorithm": {"name": "mapl", "quorum": 2, "settings": {"graph": {"l2_weight": "x"}}},
    }
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path / "a", "tcp://127.0.0.1:7000", **bad))
    text = "\n".join(caught.value.problems)
    for words in ("[data].dataset", "[data].classes", "[model].backbone", "[model].device", "[algorithm].quorum"):
        assert words in text, text
    # The form of a device is checked here; whether this machine has it, when the node starts.
    cuda = {"model": {"device": "cuda"}, "algorithm": {"name": "mapl"}}
    assert load_config(write_config(tmp_path / "c", "tcp://127.0.0.1:7000", **cuda)).model.device == "cuda"
    oracle = {"data": {"nodes": 2, "node_index": 5}, "algorithm": {"name": "oracle", "settings": {"graph.nope": 1}}}
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path / "b", "tcp://127.0.0.1:7000", **oracle))
    text = "\n".join(caught.value.problems)
    for words in ("[data].node_index: must be below", "`oracle`", "[algorithm].settings"):
        assert words in text, text


async def test_a_hostile_neighbour_is_rejected_and_counted_while_training_goes_on(tmp_path):
    sections = [
        # Enough rounds (a few seconds) for the hostile frames to reach nodes that are still learning.
        {"metrics": {"listen": "127.0.0.1:0"}, **learning_sections(i, 3, rounds=40, start_peers=1)}
        for i in range(2)
    ]
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, tmp_path / "n0", **sections[0])
        b = await start_node(nursery, tmp_path / "n1", [a.address], **sections[1])
        mallory = await start_node(nursery, tmp_path / "mallory", [a.address])  # learns nothing: not a learning peer
        await wait_until(lambda: full_mesh([a, b, mallory]), timeout=15)
        await wait_until(lambda: a.driver and a.driver.algorithm and b.driver and b.driver.algorithm, timeout=60)
        await wait_until(lambda: a.driver.algorithm.peers == (b.identity.node_id,), timeout=15)
        assert mallory.identity.node_id not in b.driver.algorithm.peers  # a peer, but no learning peer
        k, latent, dim = 10, 128, 128
        wrong_head = Prototypes(
            classes=tuple(range(k)),
            counts=(10,) * k,
            prototypes=np.zeros((k, dim), np.float32),
            head=np.zeros((k, latent + 3), np.float32),
        )
        nan = np.full((k, dim), np.nan, np.float32)
        body = {
            "classes": list(range(k)),
            "counts": [10] * k,
            "head": None,
            "prototypes": {"dtype": "float32", "shape": [k, dim], "data": nan.tobytes()},
        }
        # NaN prototypes are refused by the decoder. Mallory signs them (on its connection only its
        # own key passes the gate), numbered far ahead of what it sends otherwise.
        for seq in range(1, 4):
            await mallory.send_payload((a.address, b.address), wrong_head, a.driver.round)
            ahead = mallory.clock_us() + 10**12 + seq
            frame = seal_raw(
                mallory.identity,
                [1, "test", "PROTOTYPES", mallory.identity.public_key, ahead, mallory.clock_us(), 0, body],
            )
            mallory.transport.send(a.address, frame)
            await trio.sleep(0.3)
        await wait_until(lambda: a.driver.phase == "done" and b.driver.phase == "done", timeout=120)
        for node in (a, b):
            assert node.metrics.rejections["bad_shape"] >= 1, node.metrics.rejections
            status = node.status()["learning"]
            assert status["completed"] == 40 and len(status["history"]) == 40
            assert status["accuracy"] > 0.3  # 5 classes per node: chance is 0.2
            assert mallory.identity.node_id not in status["neighbours"] or status["history"][-1]["round"] < 2
        assert a.metrics.rejections["bad_tensor"] >= 1
        # The checkpoint of the last round is on disk, loadable without unpickling code.
        assert (a.config.node.data_dir / CHECKPOINT_NAME).exists()
        # The same counters, scraped as Prometheus would.
        scraped = await scrape(a.metrics_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert scraped.startswith(b"HTTP/1.1 200 OK")
        for line in (
            b'p2pnode_rejections_total{reason="bad_shape"}',
            b"p2pnode_rounds_completed 40.0",
            b"p2pnode_accuracy ",
            b'p2pnode_messages_sent_total{type="PROTOTYPES"}',
            b"p2pnode_peers 2.0",
        ):
            assert line in scraped, line
        assert (await scrape(a.metrics_port, b"GET / HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
        for node in (a, b, mallory):
            node.request_stop()


def three_digits_daemons_one_slow(rounds: int, factor: float, **spec):
    """3 mapl-nocgl nodes on digits (the `mlp`, 10 images per class), one drawn `factor`× slower."""
    from algorithms.data.setup import ScenarioSpec
    from testnet.simulation.simulator import SimulationSpec
    from testnet.simulation.spec import Slow

    return SimulationSpec(
        algorithm="mapl-nocgl",
        data=ScenarioSpec(dataset="digits", nodes=3, samples_per_class=10),
        rounds=rounds,
        backbones=("mlp",),
        slow=Slow(0.3, factor),
        **spec,
    )


@pytest.fixture(scope="module")
def async_run_with_a_slow_daemon(tmp_path_factory):
    """3 daemons, one drawn 20× slower (`testnet --slow`), under the async schedule: one run,
    read by the two tests below. Its spec, the slow node, report.json and each node's history."""
    from p2pnode.learning.rounds import Schedule
    from testnet.launch.learning import run_learning_testnet

    out = tmp_path_factory.mktemp("async-slow") / "net"
    schedule = Schedule(schedule="async", async_gather_s=0.05, overtime_rounds=12)
    spec = three_digits_daemons_one_slow(rounds=5, factor=20, schedule=schedule)
    (slow,) = spec.slow_nodes()
    code, report = run_learning_testnet(spec, out, round_deadline_s=10)
    assert code == 0, report["check"]
    histories = [read_history(out / f"node{i:02d}" / "data" / HISTORY_NAME) for i in range(3)]
    return spec, slow, report, histories


def test_a_slow_daemon_stretches_its_local_step_and_end_of_round_and_the_report_names_it(async_run_with_a_slow_daemon):
    """`testnet --slow`: the daemon drawn slow (`[node].slowdown`) takes its factor times as
    long per local step and per end of round; report.json says which node it was, and when each
    node's rounds ended."""
    _, slow, report, histories = async_run_with_a_slow_daemon
    assert report["slow"] == {"fraction": 0.3, "factor": 20, "nodes": [slow]}
    fast = [history for i, history in enumerate(histories) if i != slow]

    def medians(of) -> tuple[float, float]:  # the slow node's, and the fast nodes' rounds pooled
        return statistics.median(map(of, histories[slow].records)), statistics.median(
            of(record) for history in fast for record in history.records
        )

    # Same backbone, same data size: the slow one's step is 20 × its CPU seconds (a sleep after
    # it) ... The fast ones' steps are wall time, which a busy machine stretches (2-3× with another
    # suite beside this one): 5× is what the slowdown shows whatever the load, and 1× without it.
    slow_step, fast_step = medians(lambda record: record.step_s)
    assert slow_step > 5 * fast_step, (slow_step, fast_step)
    # ... and so is its end of round (graph step, evaluation): what a round takes after its gather.
    slow_end, fast_end = medians(lambda record: record.round_s - record.step_s - record.gather_s)
    assert slow_end > 5 * fast_end, (slow_end, fast_end)
    ended = report["time_to_accuracy"]["ended_at_per_node"]
    rounds = [len(history.records) for history in histories]
    assert [len(times) for times in ended] == rounds and all(times == sorted(times) for times in ended), ended


def test_async_daemons_run_at_their_own_pace_and_the_fast_ones_go_on_while_the_slow_one_runs(
    async_run_with_a_slow_daemon,
):
    """`[algorithm].schedule = "async"` on real daemons: the run completes; the fast nodes wait
    for the slow one only in round 0 (every node's first payloads), and past their 5 rounds they
    go on (overtime, 12 rounds at most) while the slow node, 20× slower, is still at its own."""
    _, slow, report, histories = async_run_with_a_slow_daemon
    assert report["schedule"]["schedule"] == "async" and report["schedule"]["overtime_rounds"] == 12
    assert [record.round for record in histories[slow].records] == list(range(5))  # its neighbours were done
    slow_step_s = statistics.median(record.step_s for record in histories[slow].records)
    for fast in set(range(3)) - {slow}:
        rounds = [record.round for record in histories[fast].records]
        assert rounds == list(range(len(rounds))) and 5 < len(rounds) <= 5 + 12, rounds
        assert report["last_round_per_node"][fast] == rounds[-1]
        later = histories[fast].records[1:]
        # after round 0 a fast round's gather is short (0.05 s and the daemon's own latency),
        # never the slow node's step
        assert max(record.gather_s for record in later) < slow_step_s / 2, (later, slow_step_s)


def test_a_late_joiner_is_picked_up(tmp_path):
    """3 daemons on digits: two start, a third joins 12 rounds late, runs its own rounds from
    the first without waiting for the others (they are past them) and so comes level, skipping
    none (a fresh node has lost no time: what its peers say is no ground for a skip, issue #43),
    and the others learn from it. (Killed and resumed daemons: tests/test_churn.py's learning
    run.)"""
    from algorithms.data.setup import ScenarioSpec
    from testnet.launch.cluster import Cluster
    from testnet.launch.learning import DISCOVERY, node_settings
    from testnet.simulation.simulator import SimulationSpec

    # Tens of milliseconds each: far more than the test waits for (it stops them sooner). 600 ran
    # out once in a loaded suite: the two first daemons finished while the third was still loading.
    rounds = 5000
    spec = SimulationSpec(
        algorithm="mapl-nocgl",
        data=ScenarioSpec(dataset="digits", nodes=3, samples_per_class=10),
        rounds=rounds,
        backbones=("mlp",),
    )  # MAPL's graph fixed all-to-all, as in its warm-up

    def settings(index: int) -> dict:
        document = node_settings(spec, index, "mlp", 3.0)
        document["algorithm"].update(start_peers=1, history_rounds=50)  # the first two do not wait
        return document

    cluster = Cluster.prepare(tmp_path / "net", 3, discovery=DISCOVERY, extra=settings)
    with cluster:
        first, second, late = cluster.specs

        def completed(node) -> int:
            status = cluster.status(node)
            return 0 if not status or not status.get("learning") else status["learning"]["completed"]

        def learning_from_both(node) -> bool:  # its last 5 rounds expected and got both others' payloads
            status = cluster.status(node)
            history = status["learning"]["history"][-5:] if status and status.get("learning") else []
            return len(history) == 5 and all(entry["expected"] == entry["arrived"] == 2 for entry in history)

        def wait(condition) -> None:
            wait_for(
                condition,
                120,
                0.2,
                why=lambda: [cluster.status(s) and cluster.status(s)["learning"] for s in cluster.specs],
            )

        cluster.start(first)
        cluster.start(second)
        # Far past `max_rounds_ahead` (2): the late joiner's rounds hear only payloads too far
        # ahead to queue, which say the others are past them; each of its gathers ends on the
        # first of them, not at `start_timeout_s` (120 s here) nor at the deadline.
        wait(lambda: completed(first) >= 12)
        cluster.start(late)
        # Until the late joiner is in both others' rounds (not until round 600).
        wait(lambda: completed(late) >= 2 and learning_from_both(first) and learning_from_both(second))
        joined_at = completed(first)
        statuses = [s["learning"] for s in cluster.statuses()]
        # The late joiner ran every round from 0, skipping none, and came level ...
        assert statuses[2]["catch_ups"] == 0 and statuses[2]["resumed_from"] is None
        assert statuses[2]["completed"] >= joined_at - 5 and joined_at < rounds - 100, (joined_at, statuses[2])
        # ... and the others learn from it: in their last rounds they expected and got its payloads.
        for status in statuses[:2]:
            assert all(entry["expected"] == entry["arrived"] == 2 for entry in status["history"][-5:]), [
                (e["round"], e["expected"], e["arrived"]) for s in statuses for e in s["history"][-8:]
            ]


async def test_a_node_alone_says_so_logs_its_checkpoints_and_shows_its_neighbours(tmp_path, caplog):
    """A learning node without peers warns once after ALONE_ROUNDS rounds, logs every checkpoint
    (round, path, bytes), and says so when a peer comes; `status` then shows the neighbour's
    weight and the age of its last payload, and `completed` is what Prometheus reports."""
    import logging
    import re

    from p2pnode.learning.driver import ALONE_ROUNDS, CHECKPOINT_LOG_EVERY
    from p2pnode.operations.prometheus import render_for
    from p2pnode.operations.status import format_status

    caplog.set_level(logging.DEBUG, logger="p2pnode")
    steady = {"name": "mapl-nocgl", "history_rounds": 20, "round_deadline_s": 0.5}  # uniform weights
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, tmp_path / "a", **learning_sections(0, 2, 100_000, start_peers=0, **steady))
        await wait_until(lambda: a.driver and (a.driver.checkpoint_round or 0) >= ALONE_ROUNDS, timeout=120)
        b = await start_node(nursery, tmp_path / "b", [a.address], **learning_sections(1, 2, 100_000, **steady))
        peer = b.identity.node_id
        await wait_until(
            lambda: peer in a.status()["learning"]["neighbours"] and peer in a.status()["learning"]["last_payloads"],
            timeout=120,
        )
        status = a.status()  # and the scrape in the same instant: no round ends in between
        scraped = render_for(a.metrics, lambda: 1, lambda: a.driver)().decode()
        a.request_stop()
        b.request_stop()
    learning = status["learning"]
    (completed,) = re.findall(r"^p2pnode_rounds_completed (\S+)$", scraped, flags=re.M)
    assert float(completed) == learning["completed"] == learning["history"][-1]["round"] + 1
    table = format_status(status)
    assert "learning mapl-nocgl  phase " in table and f"rounds completed {learning['completed']}/100000" in table
    section = table.split("\nlearning ", 1)[1]  # after the peers' table, which names the peer too
    (row,) = [line for line in section.splitlines() if line.startswith(f"  {peer}")]
    assert " 0.500 " in row and re.search(r"\d+\.\d s ago, round \d+$", row), table
    assert "(this node)" in table
    said = [record.getMessage() for record in caplog.records if record.name == "p2pnode.learning"]
    # A checkpoint line every round, at INFO only every CHECKPOINT_LOG_EVERY-th (and the last).
    loud = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "checkpoint of round" in r.getMessage()
    ]
    assert all(int(line.split()[3]) % CHECKPOINT_LOG_EVERY == 0 for line in loud) and loud, loud
    alone = [line for line in said if line.startswith("no learning peers")]
    assert alone == [
        f"no learning peers for {ALONE_ROUNDS} rounds (since round 0): training alone; a learning peer is an admitted "
        "peer that announces algorithm:mapl-nocgl (check [discovery].bootstrap and the peers' [algorithm].name)"
    ]
    assert sum(line.startswith("learning peers again in round ") for line in said) == 1
    path = a.config.node.data_dir / CHECKPOINT_NAME
    written = [
        re.fullmatch(rf"checkpoint of round (\d+) written to {re.escape(str(path))} \((\d+) bytes\)", line)
        for line in said
    ]
    rounds = [int(match[1]) for match in written if match]
    assert rounds[: ALONE_ROUNDS + 1] == list(range(ALONE_ROUNDS + 1))
    assert int([match for match in written if match][-1][2]) == path.stat().st_size  # the last one written


async def test_a_damaged_checkpoint_stops_the_start_and_says_what_to_do(tmp_path):
    from p2pnode.node import Node, NodeStartError

    config = load_config(write_config(tmp_path / "n", ANY_PORT, **learning_sections(0, 1, rounds=3)))
    config.node.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (config.node.data_dir / CHECKPOINT_NAME).write_bytes(b"not a checkpoint")
    with trio.fail_after(60), pytest.raises(NodeStartError) as caught:  # the failure ends the node in seconds
        await Node(config).run()
    assert caught.value.problems == (str(caught.value),)
    assert "[node].data_dir" in str(caught.value) and "cannot be read" in str(caught.value)
    assert "move it away" in str(caught.value)
    assert not config.control_socket.exists()  # and nothing is left running


async def test_scores_for_models_never_sent_or_sent_twice_are_counted(tmp_path):
    """SCooL over sockets: a peer that answers for a model it never received, or floods answers,
    is refused and counted, while the two honest daemons score each other and finish. The round
    queue takes one SCORE per peer and round: the first (the unsolicited one) reaches the
    algorithm, the copies after it never do (test_scool.py refuses a second score in the
    algorithm too, as it would for a round the queue has forgotten)."""
    from protocol import Score

    # mallory claims to learn with SCooL, so a sends it its models; it never sends one, and the
    # first round waits for it only until the start timeout.
    scool = {"name": "scool-sbm", "settings": {"prune_round": 0}, "start_timeout_s": 3.0}
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, tmp_path / "n0", **learning_sections(0, 3, rounds=4, **scool))
        b = await start_node(nursery, tmp_path / "n1", [a.address], **learning_sections(1, 3, rounds=4, **scool))
        impostor = {"capabilities": [learning_capability("scool-sbm")]}
        mallory = await start_node(nursery, tmp_path / "mallory", [a.address], node=impostor)
        await wait_until(lambda: full_mesh([a, b, mallory]), timeout=15)

        def in_a_round_it_sent_a_model_in() -> bool:
            driver = a.driver
            return bool(driver and driver.algorithm and driver.state.round in driver.algorithm.exchange.sent)

        # The round a is in now (it waits up to 1 s for mallory's model, which never comes), not
        # the first one it sent in: on a loaded machine that one can be over, and the score `stale`.
        await wait_until(in_a_round_it_sent_a_model_in, timeout=60)
        round = a.driver.state.round
        seq = next(iter(a.driver.algorithm.exchange.sent[round]))  # the frame a's model of that round went out in
        never_sent = Score(
            kind="log_likelihood", subject=a.identity.public_key, subject_seq=seq + 10_000, value=-1.0, samples=10
        )
        answer = Score(kind="log_likelihood", subject=a.identity.public_key, subject_seq=seq, value=-1.0, samples=10)
        await mallory.send_payload((a.address,), never_sent, round)
        for _ in range(5):  # a's model of this round did go to mallory, but it has had its one SCORE
            await mallory.send_payload((a.address,), answer, round)
        await wait_until(lambda: a.driver.phase == "done" and b.driver.phase == "done", timeout=120)
        assert a.metrics.rejections["unsolicited_score"] == 1, a.metrics.rejections
        assert a.metrics.rejections[DUPLICATE_PAYLOAD] == 5, a.metrics.rejections
        for node in (a, b):
            status = node.status()["learning"]
            assert status["completed"] == 4
            assert status["accuracy"] > 0.3  # 5 classes per node: chance is 0.2
        # b's score of a's last model may land after a is done: wait for it rather than race it.
        await wait_until(lambda: a.metrics.messages_in["SCORE"] >= 4 + 6, timeout=10)
        assert b.metrics.messages_out["SCORE"] >= 4
        for node in (a, b, mallory):
            node.request_stop()


async def test_a_finished_run_restarted_is_done_at_once_not_waiting_for_peers(tmp_path):
    """Restarted after its last round, a node resumes and says `done`: it neither waits for the
    peers it started with (start_peers, start_timeout_s) nor runs a round."""
    sections = learning_sections(0, 2, rounds=3, start_peers=0, name="mapl-nocgl")
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, tmp_path / "n", **sections)
        await wait_until(lambda: node.driver and node.driver.phase == "done", timeout=120)
        node.request_stop()
    sections["algorithm"].update(start_peers=1, start_timeout_s=600)  # a peer it would wait 10 min for
    async with trio.open_nursery() as nursery:
        again = await start_node(nursery, tmp_path / "n", **sections)
        await wait_until(lambda: again.driver and again.driver.phase == "done", timeout=60)
        learning = again.driver.status()
        assert (learning["resumed_from"], learning["completed"], learning["phase"]) == (2, 3, "done")
        again.request_stop()


def test_the_alone_warning_names_the_peers_left_out_of_learning_and_why():
    """A node alone among admitted peers (another class list, another algorithm) says which and
    why in the same line, not only in a warning seconds before."""
    from p2pnode.learning.driver import _left_out

    assert _left_out({}) == ""
    excluded = {"a": "learns over other classes", "b": "runs no algorithm", "c": "learns mapl", "d": "learns mapl"}
    assert _left_out(excluded) == (
        "; admitted but left out: a learns over other classes; b runs no algorithm; c learns mapl; and 1 more"
    )
