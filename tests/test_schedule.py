"""How rounds wait for each other (#29 items 4-5), on simulated time only: the adaptive deadline's
median/MAD rule and its bounds, the async schedule's staleness rule (λ^age, renormalised, nothing
past max_staleness) in the one place algorithms mix, and the simulator's timeline under async: a
fast node never waits for a slow neighbour beyond its short gather, and runs repeat exactly."""

import dataclasses

import pytest

from algorithms.data.setup import ScenarioSpec
from algorithms.graphs.collaboration import InNeighbourhood, UniformGraph
from algorithms.interface import NeighbourView, Staleness
from p2pnode.learning.engine import RoundEngine, Timings
from p2pnode.learning.rounds import ASYNC, AdaptiveDeadline, Progress, RoundState, Schedule
from p2pnode.learning.settings import AlgorithmSettings
from protocol import MessageType
from protocol.messages import Prototypes
from testnet.simulation.exchange import simulation_identity
from testnet.simulation.hosting import INLINE, open_hosts
from testnet.simulation.simulator import SimulationSpec, run_simulation, timeline
from testnet.simulation.spec import Slow

PROTOTYPES = MessageType.PROTOTYPES
ASYNC_SCHEDULE = Schedule(schedule=ASYNC, async_gather_s=0.05, staleness_decay=0.5, max_staleness=4)
# Every node expects every other (MAPL's graph fixed all-to-all); node 0 is the one drawn slow.
SPEC = SimulationSpec(
    algorithm="mapl-nocgl",
    data=ScenarioSpec(dataset="digits", nodes=3, samples_per_class=5, test_per_class=3),
    rounds=8,
    backbones=("mlp",),
    step_s=1.0,
    end_s=0.0,
    latency_s=0.01,
    slow=Slow(1 / 3, 5),
    schedule=ASYNC_SCHEDULE,
)


# --- the adaptive deadline ------------------------------------------------------------------------


def test_the_adaptive_deadline_is_the_largest_median_plus_mads_times_mad_over_the_expected_peers():
    deadlines = AdaptiveDeadline(window=5, mads=2.0, floor_s=0.1)
    for delay in (1.0, 1.2, 0.8, 1.0, 5.0):  # median 1.0, MAD 0.2: one outlier moves neither
        deadlines.observe("b", delay)
    for delay in (0.2, 0.3, 0.3):  # median 0.3, MAD 0
        deadlines.observe("c", delay)
    assert deadlines.expected_delay_s("b") == pytest.approx(1.4)
    assert deadlines.expected_delay_s("c") == pytest.approx(0.3)
    assert deadlines.deadline_s({"b", "c"}, fixed_s=30) == pytest.approx(1.4)
    assert deadlines.deadline_s({"c"}, fixed_s=30) == pytest.approx(0.3)


def test_the_adaptive_deadline_keeps_its_bounds():
    deadlines = AdaptiveDeadline(window=3, mads=4.0, floor_s=0.5, max_peers=2)
    for delay in (0.01, 0.01, 0.01):
        deadlines.observe("b", delay)
    assert deadlines.deadline_s({"b"}, fixed_s=30) == 0.5  # the floor
    for delay in (50.0, 60.0, 70.0):  # the window: only these three count now
        deadlines.observe("b", delay)
    assert deadlines.expected_delay_s("b") == pytest.approx(60 + 4 * 10)
    assert deadlines.deadline_s({"b"}, fixed_s=30) == 30  # never past the fixed deadline
    deadlines.observe("c", 1.0)
    assert deadlines.deadline_s({"c"}, fixed_s=30) == 30  # too few delays of c's yet: the fixed one
    assert deadlines.deadline_s(set(), fixed_s=30) == 0.5  # nobody to wait for
    deadlines.observe("d", 1.0)  # a third peer: the least recently observed one is forgotten
    assert deadlines.expected_delay_s("b") is None and deadlines.deadline_s({"b"}, fixed_s=30) == 30


def up_to_the_gather(engine: RoundEngine, round: int) -> None:
    """The round's commands before its gather (engine.py's ROUND)."""
    engine.begin(round)
    engine.step(round)
    engine.deliver()
    engine.respond()
    engine.publish(round)
    engine.expect(round)


def after_the_gather(engine: RoundEngine, peers: set[str]) -> None:
    """The round's commands from the gather's close on, and the choice of the next round."""
    from algorithms.interface import Evaluation

    engine.close_gather()
    engine.deliver()
    engine.respond()
    engine.end_round(engine.round)
    engine.record(Evaluation(1, 1), Timings(0.0, 0.0, 0.0, 0.0), {})
    engine.next_round(peers)


def test_an_adaptive_engine_learns_each_peers_delay_from_its_gathers():
    engine = RoundEngine(round_state(), Schedule(deadline="adaptive", deadline_mads=1.0, deadline_min_s=0.1))
    engine.attach(Listener())
    for round, delay in enumerate([2.0, 2.0, 2.0, 3.0]):
        up_to_the_gather(engine, round)
        gather = engine.gather(100.0 * round, quorum=1.0, deadline_s=30, grace_s=2)
        # three rounds of delays before it: the fixed deadline, then median 2 + 1 × MAD 0
        assert gather.deadline - 100.0 * round == (30 if round < 3 else 2.0)
        engine.offer("b", round, Envelope(PROTOTYPES))
        assert engine.gather_finished(gather, 100.0 * round + delay)
        after_the_gather(engine, {"b"})
        assert engine.round == round + 1
    assert list(engine.deadlines._delays["b"]) == [2.0, 2.0, 2.0, 3.0]


def test_an_async_engine_gathers_briefly_takes_any_round_and_never_catches_up():
    engine = RoundEngine(round_state(), ASYNC_SCHEDULE)
    engine.attach(Listener())
    up_to_the_gather(engine, 0)
    assert engine.gather(10.0, quorum=1.0, deadline_s=30, grace_s=2).deadline == pytest.approx(10.05)
    for peer in ("b", "c"):
        assert engine.offer(peer, 9, Envelope(PROTOTYPES)) is None  # far ahead: taken all the same
    assert engine.offer("b", 0, Envelope(PROTOTYPES)) is None  # late: b's newer one stays queued
    engine.deliver()
    assert engine.algorithm.received == [("b", 9), ("c", 9)] and engine.state.queued == 0
    assert engine.state.superseded == 1
    after_the_gather(engine, {"b", "c"})
    assert engine.round == 1  # both peers far ahead: sync would jump to round 9


def test_progress_reads_each_peers_pace_from_its_payloads_and_tells_a_silent_one():
    progress = Progress(silent_rounds=3, max_peers=2)
    for ours, theirs in ((0, 0), (5, 1), (10, 2)):  # five times slower than this node
        progress.observe("slow", theirs, ours)
    for ours, theirs in ((0, 0), (0, 4), (2, 10)):  # five times faster, then it stopped sending
        progress.observe("fast", theirs, ours)
    progress.observe("fast", 3, 4)  # an older round, late: neither its latest nor its pace
    assert progress.pace("slow") == pytest.approx(0.2) and progress.pace("fast") == pytest.approx(5.0)
    assert progress.running("slow", 24) and not progress.running("slow", 25)  # 3 of its rounds at 0.2
    assert progress.running("fast", 2) and not progress.running("fast", 3)  # 3 of its rounds already
    progress.observe("new", 0, 7)  # a single round shows no pace: taken as running, however long
    assert progress.pace("new") is None and progress.running("new", 1000)
    assert progress.pace("slow") is None  # a third peer: the least recently observed is forgotten
    with pytest.raises(ValueError):
        Progress(silent_rounds=0)


def test_async_overtime_waits_for_a_slower_neighbour_not_for_a_faster_one_that_fell_silent():
    """A node at its last round weighs two neighbours whose latest payloads are behind it: the
    slower one still sends, every five rounds, and holds it; the faster one sent five rounds per
    round of this node, then stopped sending to it (it finished, or no longer weighs it), and
    holds nobody, though its latest round is behind this node's and within `max_staleness`."""

    def done_at_the_end(sent: dict[str, list[tuple[int, int]]]) -> bool:
        engine = RoundEngine(round_state(), Schedule(schedule=ASYNC, max_staleness=40, overtime_rounds=40))
        engine.attach(Weighing(set(sent)))
        for ours in range(20):
            up_to_the_gather(engine, ours)
            engine.gather(float(ours), quorum=1.0, deadline_s=1.0, grace_s=0.0)
            for peer, rounds in sent.items():
                for theirs, during in rounds:
                    if during == ours:
                        engine.offer(peer, theirs, Envelope(PROTOTYPES))
            engine.deliver()
            after_the_gather(engine, set(sent))
            assert engine.round == ours + 1  # async: never a catch-up
        return engine.done()

    slower = [(theirs, 5 * theirs) for theirs in range(4)]  # rounds 0-3, the last during our 15
    faster = [(theirs, theirs // 5) for theirs in range(15)]  # rounds 0-14 during our 0-2, then nothing
    assert not done_at_the_end({"b": slower})
    assert done_at_the_end({"c": faster})
    assert not done_at_the_end({"b": slower, "c": faster})
    assert not done_at_the_end({"c": faster[:1]})  # one round: no pace shown, it may still run


def test_the_schedule_is_bounded_and_read_from_the_algorithm_settings():
    wrongs = ({"staleness_decay": 0.0}, {"schedule": "eventually"}, {"deadline_window": 2}, {"max_staleness": -1})
    for wrong in (*wrongs, {"overtime_rounds": -1}):
        with pytest.raises(ValueError):
            Schedule(**wrong)
    settings = AlgorithmSettings(schedule=ASYNC, staleness_decay=0.8, max_staleness=3, deadline="adaptive")
    assert Schedule.of(settings) == Schedule(schedule=ASYNC, staleness_decay=0.8, max_staleness=3, deadline="adaptive")
    assert Schedule.of(AlgorithmSettings()) == Schedule()  # the daemon's defaults are the engine's: sync, fixed


# --- staleness: the one place payloads are weighed ------------------------------------------------


def test_a_neighbours_latest_payload_counts_lambda_to_its_age_renormalised_and_not_past_max_staleness():
    node = Mixer(Staleness(decay=0.5, max_staleness=4))
    node.view.put("b", 10, prototypes())  # this round: age 0
    node.view.put("c", 8, prototypes())  # age 2
    node.view.put("d", 5, prototypes())  # age 5: too old
    node.view.put("e", 12, prototypes())  # ahead: age 0
    assert node.view.ages(PROTOTYPES, 10) == {"b": 0, "c": 2, "e": 0}
    payloads, mix = node.mixing(PROTOTYPES, 10)
    assert set(payloads) == {"b", "c", "e"}
    total = 0.2 * (1 + 1 + 0.25 + 1)  # w_ij = 1/5 each (the node and 4 peers), times λ^age
    assert mix == pytest.approx({"a": 0.2 / total, "b": 0.2 / total, "c": 0.05 / total, "e": 0.2 / total})


def test_the_sync_default_keeps_the_algorithms_own_bound_and_weights():
    node = Mixer(Staleness())
    node.view.put("b", 10, prototypes())
    node.view.put("c", 9, prototypes())  # age 1: within the algorithm's own bound (1)
    node.view.put("d", 8, prototypes())
    payloads, mix = node.mixing(PROTOTYPES, 10)
    assert set(payloads) == {"b", "c"} and mix == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})


# --- the async schedule on the simulated clock ----------------------------------------------------


def test_under_async_a_fast_node_never_waits_for_a_five_times_slower_neighbour():
    (slow,) = SPEC.slow_nodes()
    report = run_simulation(SPEC)
    ended = report["time_to_accuracy"]["ended_at_per_node"]
    # The slow node steps 5 s a round and finds the fast ones' payloads waiting: its own pace.
    assert ended[slow] == pytest.approx([5.0 * (r + 1) for r in range(7)] + [40.05])
    for fast in set(range(3)) - {slow}:
        # Round 0 waits for everyone, up to the short gather (1 s step + 0.05 s); afterwards only
        # for the other fast node, whose payload takes 10 ms: never for the slow one.
        assert ended[fast] == pytest.approx([1.05 + 1.01 * r for r in range(8)])
        assert all(b - a <= 1.0 + 0.05 + 1e-9 for a, b in zip([0.0, *ended[fast]], ended[fast], strict=False))
    assert max(max(ended[fast]) for fast in set(range(3)) - {slow}) < ended[slow][1]  # done before its 2nd round


def test_under_async_the_fast_nodes_mix_the_slow_ones_payloads_by_their_age():
    (slow,) = SPEC.slow_nodes()
    fast = min(set(range(3)) - {slow})
    ids = [simulation_identity(SPEC.seed, i).node_id for i in range(SPEC.nodes)]
    seen = {}  # a fast node's round → the slow node's weight in its prototypes' mix, and its age
    with open_hosts(SPEC, INLINE) as hosts:
        nodes = hosts.shards[0].nodes
        for together in timeline(SPEC, hosts, ids).run():
            for record in together:
                if record.node == ids[fast]:
                    node = nodes[fast]
                    ages = node.view.ages(PROTOTYPES, record.round)
                    weight = node.mixing(PROTOTYPES, record.round)[1].get(ids[slow])
                    seen[record.round] = (ages.get(ids[slow]), weight)
    # The slow node's round-0 payload comes at 5.01 s, during the fast node's round 4: age 4,
    # used at 1/3 · 0.5^4 renormalised over the node and the other fast peer (1/3 each); too old
    # afterwards (max_staleness 4), and its round-1 payload comes after the fast node is done.
    assert seen[3] == (None, None)
    age4 = (1 / 3) * 0.5**4
    assert seen[4] == (4, pytest.approx(age4 / (2 / 3 + age4)))
    assert all(seen[r] == (None, None) for r in range(5, 8))


def test_under_async_scool_takes_a_slow_neighbours_model_as_old_as_the_schedule_allows():
    """SCooL keeps its models apart from the shared mixing part: the schedule's bound reaches it
    too, so the slow node's round-0 model, 4 rounds old at a fast node, is scored, not refused."""
    asynchronous = run_simulation(dataclasses.replace(SPEC, algorithm="scool-dirac", rounds=5))
    assert "stale" not in asynchronous["rejections"]
    own_bound = dataclasses.replace(ASYNC_SCHEDULE, max_staleness=1)
    refused = run_simulation(dataclasses.replace(SPEC, algorithm="scool-dirac", rounds=5, schedule=own_bound))
    assert refused["rejections"].get("stale", 0) > 0


def test_under_async_a_fast_node_goes_on_past_its_rounds_until_its_slower_neighbours_last_payload():
    """Overtime: the fast nodes keep learning while the node twice as slow still runs, and end
    with the round in which its last payload (round 7, out at 16 s) has come."""
    overtime = dataclasses.replace(ASYNC_SCHEDULE, max_staleness=40, overtime_rounds=40)
    report = run_simulation(dataclasses.replace(SPEC, slow=Slow(1 / 3, 2), schedule=overtime))
    (slow,) = SPEC.slow_nodes()
    ended, last = report["time_to_accuracy"]["ended_at_per_node"], report["last_round_per_node"]
    assert last[slow] == 7 and ended[slow][-1] == pytest.approx(16.0)
    for fast in set(range(3)) - {slow}:
        assert last[fast] == 15
        assert ended[fast][-2] < ended[slow][-1] + SPEC.latency_s <= ended[fast][-1]
    assert report["check"]["passed"]  # rounds past `rounds` are no failure


def test_overtime_is_bounded_by_overtime_rounds_and_max_staleness_and_sync_has_none():
    def last_rounds(schedule: Schedule) -> list[int]:
        return run_simulation(dataclasses.replace(SPEC, schedule=schedule))["last_round_per_node"]

    (slow,) = SPEC.slow_nodes()
    fast = [7 + 6 if i != slow else 7 for i in range(3)]
    # Five times slower: it is still on its round 1 when the fast nodes reach the bound.
    assert last_rounds(dataclasses.replace(ASYNC_SCHEDULE, max_staleness=40, overtime_rounds=6)) == fast
    assert last_rounds(dataclasses.replace(ASYNC_SCHEDULE, max_staleness=40, overtime_rounds=0)) == [7] * 3
    # Its latest payload (round 0) older than max_staleness (4) once the fast nodes finish: no overtime.
    assert ASYNC_SCHEDULE.overtime_rounds == 40 and last_rounds(ASYNC_SCHEDULE) == [7] * 3
    assert last_rounds(Schedule(overtime_rounds=6)) == [7] * 3  # sync: every node waits, then ends together


def test_async_runs_repeat_exactly():
    spec = dataclasses.replace(SPEC, rounds=4)
    first, second = run_simulation(spec), run_simulation(spec)
    for key in ("accuracy", "graph", "comm", "time_to_accuracy", "rejections", "timing"):
        assert first[key] == second[key], key


# --- helpers ------------------------------------------------------------------------------------


def round_state() -> RoundState:
    return RoundState(
        waits_for=frozenset({PROTOTYPES}),
        rounds=20,
        max_rounds_ahead=2,
        inbox_frames=16,
        peer_inbox_frames=8,
        catch_up_quorum=0.5,
        history_rounds=5,
    )


@dataclasses.dataclass(frozen=True)
class Envelope:
    """What the engine reads of a verified envelope."""

    type: MessageType
    body: str = "payload"
    seq: int = 1
    sender: bytes = b"key"


class Listener:
    """An algorithm as the engine sees it: it expects b and records what it is handed."""

    node_id, waits_for, sends = "a", frozenset({PROTOTYPES}), (PROTOTYPES,)

    def __init__(self) -> None:
        self.received: list[tuple[str, int]] = []

    def set_staleness(self, staleness):
        self.staleness = staleness

    def local_step(self, round):
        from algorithms.interface import LocalReport

        return LocalReport(loss=0.0)

    def publish(self, round):
        return []

    def respond(self):
        return []

    def end_round(self, round):
        pass

    def expected(self, round):
        return ("b",)

    def receive(self, peer, round, body, frame):
        self.received.append((peer, round))

    def weights(self):
        return {"a": 1.0}


class Weighing(Listener):
    """A listener that gives `peers` weight and keeps the latest round each sent."""

    def __init__(self, peers: set[str]) -> None:
        super().__init__()
        self.peers = peers

    def weights(self):
        return {"a": 0.5, **{peer: 0.5 / len(self.peers) for peer in self.peers}}

    def latest_rounds(self):
        latest: dict[str, int] = {}
        for peer, round in self.received:
            latest[peer] = max(round, latest.get(peer, -1))
        return latest


class Mixer(InNeighbourhood):
    """The shared neighbourhood part alone: a uniform row over "a" and its peers b-e."""

    node_id = "a"
    heard_by = PROTOTYPES

    def __init__(self, staleness: Staleness) -> None:
        self.view, self.graph = NeighbourView(max_staleness=1), UniformGraph("a")
        self.view.staleness = staleness
        self.peers = ("b", "c", "d", "e")
        self.view.set_peers(self.peers)
        self.graph.set_peers(self.peers)


def prototypes() -> Prototypes:
    import numpy as np

    return Prototypes(classes=(0, 1), counts=np.ones(2, np.int64), prototypes=np.zeros((2, 2), np.float32))
