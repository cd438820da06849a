"""The simulator's clock (testnet/simulation/clock.py, testnet/simulation/exchange.py's `Timeline`), on simulated time
only: a step costs what it is said to, a slow node holds a fast neighbour back by exactly the
daemon's gather rule and never past its deadline, and runs repeat exactly."""

import dataclasses

import pytest

from algorithms.data.setup import ScenarioSpec
from testnet.reporting.report import time_to_accuracy
from testnet.reporting.summary import summary_page
from testnet.simulation.clock import (
    ARRIVAL,
    BEGIN,
    CLOSE,
    END_S_PER_TEST_SAMPLE,
    STEP,
    STEP_S_PER_SAMPLE,
    EventQueue,
    end_costs,
    step_costs,
)
from testnet.simulation.exchange import simulation_identity
from testnet.simulation.hosting import INLINE, open_hosts
from testnet.simulation.simulator import SimulationSpec, run_simulation, timeline
from testnet.simulation.spec import Slow, parse_slow

# MAPL's graph fixed all-to-all: every node expects every other in every round.
SPEC = SimulationSpec(
    algorithm="mapl-nocgl",
    data=ScenarioSpec(dataset="digits", nodes=3, samples_per_class=5, test_per_class=3),
    rounds=3,
    backbones=("mlp",),
    step_s=1.0,
    end_s=0.0,
    latency_s=0.01,
)


def ended(report: dict, node: int) -> list[float]:
    return report["time_to_accuracy"]["ended_at_per_node"][node]


def test_the_queue_orders_by_time_then_kind_then_sender_then_push():
    queue = EventQueue()
    for time, kind, sender, item in [(2.0, STEP, 0, "late"), (1.0, CLOSE, -1, "close"), (1.0, ARRIVAL, 2, "c")]:
        queue.push(time, kind, sender, item)
    queue.push(1.0, BEGIN, 0, "begin")
    queue.push(1.0, ARRIVAL, 1, "b1")
    queue.push(1.0, ARRIVAL, 1, "b2")
    assert queue.pop() == (1.0, ARRIVAL, ["b1", "b2", "c"])
    assert queue.pop() == (1.0, CLOSE, ["close"])
    assert queue.pop() == (1.0, BEGIN, ["begin"])
    assert queue.pop() == (2.0, STEP, ["late"]) and len(queue) == 0


def test_costs_follow_the_table_the_samples_and_the_speed():
    mlp_step, mlp_end = STEP_S_PER_SAMPLE["mlp"], END_S_PER_TEST_SAMPLE["mlp"]
    assert step_costs(["mlp", "mlp"], [100, 100], [1.0, 5.0]) == pytest.approx([100 * mlp_step, 500 * mlp_step])
    assert step_costs(["mlp", "convnet"], [10, 99], [1.0, 2.0], fixed_s=0.5) == [0.5, 1.0]
    assert end_costs(["mlp", "mlp"], [400, 400], [1.0, 5.0]) == pytest.approx([400 * mlp_end, 2000 * mlp_end])
    assert end_costs(["mlp", "convnet"], [10, 99], [1.0, 2.0], fixed_s=0.0) == [0.0, 0.0]
    assert all(cost > 0 for cost in [*STEP_S_PER_SAMPLE.values(), *END_S_PER_TEST_SAMPLE.values()])


def test_a_round_ends_after_its_end_of_round_and_a_slow_node_takes_its_factor_of_that_too():
    """The end of round (graph step, evaluation) comes after the gather: the round's record ends
    then and the next round begins then; `--slow` stretches it as it stretches the step."""
    equal = run_simulation(dataclasses.replace(SPEC, end_s=0.5))
    for node in range(3):  # step 1 s, 10 ms on the way, 0.5 s of end of round
        assert ended(equal, node) == pytest.approx([1.51, 3.02, 4.53])
    spec = dataclasses.replace(SPEC, end_s=0.5, slow=Slow(1 / 3, 5))
    (slow,) = spec.slow_nodes()
    by_node = records(spec)
    # The slow node steps 5 s and ends its rounds in 2.5 s; the others' payloads wait for it.
    assert [record.ended_at for record in by_node[slow]] == pytest.approx([7.5, 15.0, 22.5])
    for fast in set(range(3)) - {slow}:
        # It waits for the slow node's payload (5.01 s, then 12.51 s, then 20.01 s), then ends its round.
        assert [record.ended_at for record in by_node[fast]] == pytest.approx([5.51, 13.01, 20.51])
        first = by_node[fast][0]
        assert (first.step_s, first.gather_s, first.round_s) == pytest.approx((1.0, 4.01, 5.51))


def test_slow_nodes_are_drawn_by_the_seed_and_checked():
    assert Slow(0.3, 5).nodes(10, 1) == Slow(0.3, 5).nodes(10, 1) and len(Slow(0.3, 5).nodes(10, 1)) == 3
    assert Slow(0.3, 5).nodes(10, 1) != Slow(0.3, 5).nodes(10, 2)
    assert parse_slow("0.3:5") == Slow(0.3, 5.0)
    for wrong, said in [("0.3", "FRACTION:FACTOR"), ("1.5:2", "fraction"), ("0.3:0.5", "factor"), ("a:b", "FRACTION")]:
        with pytest.raises(ValueError, match=said):
            parse_slow(wrong)


def test_equal_speeds_advance_the_clock_by_the_step_and_the_latency():
    report = run_simulation(SPEC)
    # Step 1 s, payloads 10 ms on the way, everyone waits for everyone: each round 1.01 s.
    for node in range(3):
        assert ended(report, node) == pytest.approx([1.01, 2.02, 3.03])
    assert report["timing"]["local_step_s_mean"] == 1.0 and report["timing"]["gather_s_mean"] == pytest.approx(0.01)
    assert report["slow"] is None


def test_under_sync_a_slow_node_holds_its_neighbours_back_by_exactly_its_lateness():
    spec = dataclasses.replace(SPEC, slow=Slow(1 / 3, 5))
    (slow,) = spec.slow_nodes()
    report = run_simulation(spec)
    assert report["slow"] == {"fraction": 1 / 3, "factor": 5, "nodes": [slow]}
    page = summary_page(report)
    assert f"| slow nodes (local step ×) | {slow} (×5) |" in page
    assert f"| every node at its final accuracy by | {report['time_to_accuracy']['max']:.1f} simulated s |" in page
    # The slow node steps 5 s; its payload reaches the others 10 ms later, and only then do they
    # end their round; theirs had reached it long before, so it ends as soon as it published and
    # is never held back itself: the fast nodes run at its pace, 10 ms behind it.
    assert ended(report, slow) == pytest.approx([5.0, 10.0, 15.0])
    for fast in set(range(3)) - {slow}:
        assert ended(report, fast) == pytest.approx([5.01, 10.01, 15.01])
    assert report["missing_payloads"] == 0


def records(spec: SimulationSpec) -> dict[int, list]:
    """Each node's records, as the simulator's timeline yields them."""
    ids = [simulation_identity(spec.seed, i).node_id for i in range(spec.nodes)]
    by_node: dict[int, list] = {i: [] for i in range(spec.nodes)}
    with open_hosts(spec, INLINE) as hosts:
        for ended_together in timeline(spec, hosts, ids).run():
            for record in ended_together:
                by_node[ids.index(record.node)].append(record)
    return by_node


def test_a_gather_never_waits_past_the_round_deadline():
    spec = dataclasses.replace(SPEC, slow=Slow(1 / 3, 5), round_deadline_s=2.0)
    (slow,) = spec.slow_nodes()
    by_node = records(spec)
    for fast in set(range(3)) - {slow}:
        first, *later = by_node[fast]
        # It publishes at 1 s and gives up on the slow node at 1 + 2 s, the deadline, not later.
        assert (first.ended_at, first.gather_s, first.arrived, len(first.missing)) == (3.0, 2.0, 1, 1)
        # MAPL expects no more a peer that missed a round, so it runs at its own pace after.
        assert [record.ended_at for record in later] == pytest.approx([4.01, 5.02])
        assert all(record.gather_s == pytest.approx(0.01) and not record.missing for record in later)
    # The slow node finds the others' payloads waiting (queued ahead of its round) each time.
    assert [(record.ended_at, record.gather_s, record.arrived) for record in by_node[slow]] == [
        (5.0, 0.0, 2),
        (10.0, 0.0, 2),
        (15.0, 0.0, 2),
    ]


def test_runs_repeat_exactly_and_time_to_accuracy_reads_the_curves():
    spec = dataclasses.replace(SPEC, slow=Slow(1 / 3, 3), rounds=4)
    first, second = run_simulation(spec), run_simulation(spec)
    for key in ("accuracy", "graph", "comm", "time_to_accuracy", "rejections", "timing"):
        assert first[key] == second[key], key
    timed = first["time_to_accuracy"]
    assert timed["target"] == "each node's own final accuracy" and None not in timed["per_node"]
    curves = [[(0.5, 0.2), (1.0, 0.6), (1.5, 0.5), (2.0, 0.6)], [(1.0, 0.1)], []]
    assert time_to_accuracy(curves) == [1.0, 1.0, None]
    assert time_to_accuracy(curves, [0.55, 0.5, 0.1]) == [1.0, None, None]


def test_simulate_refuses_a_slow_option_it_cannot_read(tmp_path, capsys):
    from p2pnode_cli import main

    argv = ["simulate", "--algorithm", "mapl", "--dataset", "digits", "--out", str(tmp_path)]
    assert main([*argv, "--slow", "0.3"]) == 2
    assert "--slow wants FRACTION:FACTOR (e.g. 0.3:5), got '0.3'" in capsys.readouterr().err
    assert main([*argv, "--slow", "0.3:0.5"]) == 2
    assert "a slow node's factor must be ≥ 1, got 0.5" in capsys.readouterr().err


def test_while_everyone_waits_for_everyone_the_latency_moves_the_clock_only():
    """Equal speeds under sync: every payload is in before any gather ends, with or without
    latency, so every figure is the lock-step one; only the times differ."""
    instant, delayed = run_simulation(dataclasses.replace(SPEC, latency_s=0.0)), run_simulation(SPEC)
    for key in ("accuracy", "graph", "comm", "rejections", "missing_payloads"):
        assert instant[key] == delayed[key], key
    assert ended(instant, 0) == [1.0, 2.0, 3.0] and ended(delayed, 0) == pytest.approx([1.01, 2.02, 3.03])


def test_a_testnet_paces_every_daemon_and_the_slow_ones_by_their_factor_too():
    """`testnet --pace K`: every daemon's `[node].slowdown` is K, K × FACTOR on `--slow`'s nodes;
    without it only the slow ones are slowed. The simulator's clock ignores the pace."""
    from testnet.launch.learning import node_settings

    spec = dataclasses.replace(SPEC, data=dataclasses.replace(SPEC.data, nodes=10), slow=Slow(0.3, 5), pace=10)
    slow = spec.slow_nodes()
    assert [node_settings(spec, i, "mlp", 30.0)["node"]["slowdown"] for i in range(10)] == [
        50 if i in slow else 10 for i in range(10)
    ]
    unpaced = dataclasses.replace(spec, pace=1.0)
    assert [node_settings(unpaced, i, "mlp", 30.0).get("node", {}).get("slowdown") for i in range(10)] == [
        5 if i in slow else None for i in range(10)
    ]
    with pytest.raises(ValueError, match="--pace must be in"):
        dataclasses.replace(SPEC, pace=0.5)
    # more daemons than cores, slowed but unpaced: the launcher says so, and what to give
    from p2pnode_cli.testnet import unpaced_warning

    assert "give this run and those you compare it with --pace 10" in unpaced_warning(unpaced, "local", 2)
    assert unpaced_warning(spec, "local", 2) is None  # paced
    assert unpaced_warning(unpaced, "local", 16) is None  # a core each
    assert unpaced_warning(unpaced, "ray", 2) is None  # spread over Ray's nodes
    assert ended(run_simulation(dataclasses.replace(SPEC, pace=10)), 0) == ended(run_simulation(SPEC), 0)


def test_a_paced_testnet_stretches_the_async_gather_as_it_stretches_the_computations():
    """In slow motion (`--pace K`) the async gather lasts K × `async_gather_s`, at most the round
    deadline, so it catches what it catches at full speed; sync's waits are unchanged."""
    from p2pnode.learning.rounds import ASYNC, Schedule
    from testnet.launch.learning import node_settings

    asynchronous = dataclasses.replace(SPEC, schedule=Schedule(schedule=ASYNC, async_gather_s=0.1))

    def gather_s(spec, deadline_s=30.0):
        return node_settings(spec, 0, "mlp", deadline_s)["algorithm"].get("async_gather_s")

    assert gather_s(asynchronous) is None  # the default, left to the daemon
    assert gather_s(dataclasses.replace(asynchronous, pace=10)) == pytest.approx(1.0)
    assert gather_s(dataclasses.replace(asynchronous, pace=1000), deadline_s=5.0) == 5.0
    sync = dataclasses.replace(SPEC, pace=10)
    assert node_settings(sync, 0, "mlp", 30.0)["algorithm"].keys().isdisjoint({"schedule", "async_gather_s"})
