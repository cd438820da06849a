"""The round driver's decisions on simulated time: queueing, arrival, the gather's quorum, grace
and deadline, catching up, and the records every driver writes."""

import copy
from dataclasses import dataclass

import pytest

from p2pnode.learning.engine import ROUND, Command, RoundEngine, RoundOrderError, Timings
from p2pnode.learning.rounds import (
    DUPLICATE_PAYLOAD,
    INBOX_FULL,
    PEER_INBOX_FULL,
    ROUND_AHEAD,
    Gather,
    RoundRecord,
    RoundState,
    arrived,
)
from protocol import UNEXPECTED_TYPE, MessageType

from .helpers import record

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

PROTOTYPES, MODEL, SCORE = MessageType.PROTOTYPES, MessageType.MODEL, MessageType.SCORE


def state(**overrides) -> RoundState:
    settings = {"waits_for": frozenset({MODEL, SCORE}), "rounds": 10, "max_rounds_ahead": 2, "inbox_frames": 8}
    shares = {"peer_inbox_frames": 8, "catch_up_quorum": 0.5}
    return RoundState(**{**settings, **shares, "history_rounds": 5, **overrides})


def test_a_peer_has_arrived_once_it_sent_every_type_waited_for():
    rounds = state()
    assert rounds.offer("p", 0, MODEL, "m") is None
    assert rounds.arrived(0) == set()
    assert rounds.offer("p", 0, SCORE, "s") is None
    assert rounds.arrived(0) == {"p"}
    assert rounds.arrived(1) == set()
    # An algorithm that waits for no type in particular: any one payload will do.
    assert arrived({"p": {PROTOTYPES}, "q": set()}, frozenset()) == {"p"}


def test_payloads_are_queued_until_their_round_and_bounded():
    rounds = state(inbox_frames=3)
    assert rounds.offer("p", 3, MODEL, "too far") == ROUND_AHEAD  # more than 2 rounds ahead of round 0
    assert rounds.offer("p", 1, MODEL, "next") is None
    assert rounds.offer("q", 0, MODEL, "now") is None
    assert rounds.offer("p", 2, MODEL, "later") is None
    assert rounds.offer("q", 0, SCORE, "one too many") == INBOX_FULL
    assert rounds.due() == [("q", 0, "now")]
    assert rounds.queued == 2
    rounds.finish(record(round=0))
    rounds.next_round(set())
    assert rounds.due() == [("p", 1, "next")]
    assert rounds.queued == 1


def test_the_gather_ends_when_all_arrived_or_grace_after_a_quorum_or_at_the_deadline():
    rounds = state()
    gather = rounds.gather({"p", "q", "r", "s"}, 100.0, quorum=0.5, deadline_s=30.0, grace_s=2.0)
    assert gather.needed == 2 and gather.wake_at() == 130.0
    assert not gather.finished(set(), 101.0)
    assert not gather.finished({"p"}, 102.0)
    assert not gather.finished({"p", "q"}, 103.0)  # quorum at 103: two seconds' grace for the rest
    assert gather.wake_at() == 105.0
    assert not gather.finished({"p", "q", "x"}, 104.9)  # a stranger's payload counts for nothing
    assert gather.finished({"p", "q"}, 105.0)
    everyone = rounds.gather({"p", "q"}, 0.0, quorum=1.0, deadline_s=30.0, grace_s=2.0)
    assert everyone.finished({"p", "q"}, 0.5)
    late = rounds.gather({"p", "q"}, 0.0, quorum=1.0, deadline_s=30.0, grace_s=2.0)
    assert not late.finished({"p"}, 29.9) and late.finished({"p"}, 30.0)
    assert Gather(frozenset(), 0, 10.0, 1.0).finished(set(), 0.0)  # nobody expected: nothing to wait for


def test_a_peer_heard_in_a_later_round_is_not_waited_for():
    rounds = state()
    rounds.offer("p", 0, MODEL, "m")
    rounds.offer("q", 1, MODEL, "next round's")  # q is past round 0: what it sent for it is in, or lost
    assert rounds.arrived(0) == set() and rounds.settled(0) == {"q"}
    gather = rounds.gather({"p", "q"}, 0.0, quorum=1.0, deadline_s=30.0, grace_s=2.0)
    assert not gather.finished(rounds.settled(0), 1.0)
    rounds.offer("p", 0, SCORE, "s")
    assert gather.finished(rounds.settled(0), 1.1)


def test_a_peer_that_sent_part_of_a_round_and_moved_on_is_waited_for_until_the_rest_comes():
    """Its small payload of round 0 may travel on the public socket while its peers' connection
    opens, behind the round-1 frames on the peers' one: heard in round 1, it is not settled for
    round 0 while round 0 is half in (sync); the rest, when it comes, still counts."""
    rounds = state()
    rounds.offer("p", 0, MODEL, "m")
    rounds.offer("p", 1, MODEL, "next round's")
    assert rounds.settled(0) == set()
    rounds.offer("p", 0, SCORE, "s, overtaken")
    assert rounds.arrived(0) == rounds.settled(0) == {"p"}
    asynchronous = state(asynchronous=True)  # async: the later round's payload stands in
    asynchronous.offer("p", 0, MODEL, "m")
    asynchronous.offer("p", 1, MODEL, "next round's")
    assert asynchronous.settled(0) == {"p"}


def test_the_first_round_waits_for_peers_still_loading_until_the_start_timeout():
    rounds = state()
    first = rounds.gather({"p"}, 10.0, quorum=1.0, deadline_s=5.0, grace_s=2.0, hold_until=130.0)
    assert not first.finished(set(), 15.0) and first.wake_at() == 130.0
    assert first.finished({"p"}, 40.0)
    later = rounds.gather({"p"}, 200.0, quorum=1.0, deadline_s=5.0, grace_s=2.0, hold_until=130.0)
    assert later.wake_at() == 205.0  # a start deadline already past changes nothing


def resumed(last: int, lost_s: float, round_s: float = 1.0, **overrides) -> RoundState:
    """A node that ran rounds 0 to `last`, each `round_s` long, then was down `lost_s` seconds
    (its checkpoint that old at its restart): about to run round `last + 1`."""
    rounds = state(**overrides)
    rounds.resume(last, [record(round=r, round_s=round_s) for r in range(last + 1)], lost_s=lost_s)
    return rounds


def test_a_node_that_was_down_skips_the_rounds_its_peers_ran_meanwhile():
    rounds = resumed(0, lost_s=30.0, rounds=100)
    for peer, ahead in (("p", 9), ("q", 10), ("r", 1)):
        rounds.offer(peer, ahead, MODEL, None)  # p and q refused as round_ahead, but their word noted
    # r is the only peer it learns from: it is not ahead, so the others do not pull this node.
    assert rounds.next_round({"r"}) == 1 and rounds.catch_ups == 0
    rounds.finish(record(round=1))
    # Both peers it learns from are ahead: it goes as far as both have reached.
    assert rounds.next_round({"p", "q"}) == 9 and rounds.catch_ups == 1 and rounds.skipped == 7
    rounds.finish(record(round=9))
    assert rounds.next_round({"p", "q"}) == 10  # only q is further: one round on


def test_a_node_skips_no_more_rounds_than_it_lost_time_for_whatever_its_peers_say():
    # Down 5.5 s at 1 s a round: five rounds at most, over the rest of its run.
    rounds = resumed(3, lost_s=5.5, rounds=1000)
    for peer in ("p", "q", "r"):
        assert rounds.offer(peer, 900, MODEL, None) == ROUND_AHEAD
    assert rounds.next_round({"p", "q", "r"}) == 4 + 5 and rounds.allowance() == 0
    rounds.finish(record(round=9, round_s=1.0))
    for peer in ("p", "q", "r"):
        rounds.offer(peer, 950, MODEL, None)
    assert rounds.next_round({"p", "q", "r"}) == 10 and rounds.catch_ups == 1  # none left
    # Its pace is its own rounds' median: slow rounds give fewer.
    slow = resumed(3, lost_s=5.5, round_s=2.0, rounds=1000)
    for peer in ("p", "q"):
        slow.offer(peer, 900, MODEL, None)
    assert slow.next_round({"p", "q"}) == 4 + 2
    # Never past its last round: a node down longer than the whole run still runs that one.
    late = resumed(3, lost_s=1e6, rounds=8)
    for peer in ("p", "q"):
        late.offer(peer, 1000, MODEL, None)
    assert late.next_round({"p", "q"}) == 7 and not late.done


def finished_up_to(last: int, **overrides) -> RoundState:
    """A node that has run rounds 0 to `last - 1` without a break and is about to run round `last`."""
    rounds = state(**overrides)
    for r in range(last):
        rounds.finish(record(round=r, round_s=1.0))
        rounds.next_round(set())
    assert rounds.round == last
    return rounds


@pytest.mark.parametrize("colluders", [2, 3, 5, 50])
def test_no_number_of_peers_moves_the_round_of_a_node_that_ran_without_a_break(colluders):
    # As found from outside: two admitted peers of four, tagging copies of their payloads r+1000,
    # made every honest node skip to its end after a round or two (issue #43).
    rounds = finished_up_to(1, rounds=8)
    sources = {f"x{i}" for i in range(colluders)} | {"honest"}
    for r in range(1, 8):
        for peer in sources - {"honest"}:
            assert rounds.offer(peer, r + 1000, MODEL, "copy") == ROUND_AHEAD
        assert rounds.offer("honest", r, MODEL, "real") is None
        rounds.finish(record(round=r, round_s=1.0))
        assert rounds.next_round(sources) == r + 1
    assert rounds.catch_ups == 0 and rounds.skipped == 0 and rounds.done


def test_one_peer_never_moves_a_nodes_round_whatever_rounds_it_claims():
    # As found from outside: copies of a valid payload tagged r+3 and r+1000; even a node that
    # lost time for 1000 rounds is not moved by one peer.
    rounds = resumed(3, lost_s=1000.0, rounds=8)
    assert rounds.offer("x", 4, MODEL, "real") is None
    assert rounds.offer("x", 7, MODEL, "copy") == ROUND_AHEAD
    assert rounds.offer("x", 1004, MODEL, "copy") == ROUND_AHEAD
    rounds.finish(record(round=4))
    assert rounds.next_round({"x", "p", "q"}) == 5 and rounds.catch_ups == 0 and not rounds.done
    # In a 2-node network x is the one peer it learns from: still one peer, still no catch-up.
    rounds.finish(record(round=5))
    assert rounds.next_round({"x"}) == 6 and rounds.catch_ups == 0
    # What the claim does: x is not waited for in the rounds below it (it could stop sending
    # just as well). It settles x, and nobody else.
    assert rounds.settled(6) == {"x"}


def test_a_minority_ahead_moves_nothing():
    rounds = resumed(2, lost_s=1000.0, rounds=1000)
    sources = {"p", "q", "r", "s", "t"}  # a quorum is 3 of them (half, rounded up)
    for peer, ahead in (("p", 20), ("q", 30)):
        assert rounds.offer(peer, ahead, MODEL, None) == ROUND_AHEAD
    rounds.finish(record(round=3))
    assert rounds.next_round(sources) == 4 and rounds.catch_ups == 0
    # A lone peer is no quorum, at any fraction.
    lenient = resumed(2, lost_s=1000.0, rounds=1000, catch_up_quorum=0.0)
    assert lenient.offer("p", 20, MODEL, None) == ROUND_AHEAD
    lenient.finish(record(round=3))
    assert lenient.next_round(sources) == 4 and lenient.catch_ups == 0


def test_a_quorum_ahead_bounds_the_skip_as_far_as_the_quorum_has_reached():
    rounds = resumed(2, lost_s=1000.0, rounds=2000)
    sources = {"p", "q", "r", "s", "t", "u"}  # 3 of 6 is the quorum
    for peer, ahead in (("p", 1000), ("q", 900), ("r", 20)):
        assert rounds.offer(peer, ahead, MODEL, None) == ROUND_AHEAD
    rounds.finish(record(round=3))
    # Three sources have all reached round 20; only two say they are any further.
    assert rounds.next_round(sources) == 20 and rounds.catch_ups == 1
    # A stricter quorum (all six) would not have moved it.
    strict = resumed(2, lost_s=1000.0, rounds=2000, catch_up_quorum=1.0)
    for peer, ahead in (("p", 1000), ("q", 900), ("r", 20), ("s", 25), ("t", 30)):
        strict.offer(peer, ahead, MODEL, None)
    strict.finish(record(round=3))
    assert strict.next_round(sources) == 4 and strict.catch_ups == 0


def test_refused_payloads_leave_no_trace():
    rounds = state(inbox_frames=3, peer_inbox_frames=2)
    assert rounds.offer("p", 0, MODEL, "m") is None
    assert rounds.offer("p", 1, MODEL, "m1") is None
    assert rounds.offer("q", 1, MODEL, "m1") is None
    before = copy.deepcopy(rounds)
    for peer, round, kind, reason in (
        ("r", 2, MODEL, INBOX_FULL),
        ("p", 0, MODEL, DUPLICATE_PAYLOAD),
        ("p", 2, SCORE, PEER_INBOX_FULL),
    ):
        assert rounds.offer(peer, round, kind, "refused") == reason
        assert rounds == before, reason  # not queued, not arrived, not settled: nothing changed
    # Once the algorithm says what it takes, any other type is refused at once, whatever its round.
    rounds.takes = before.takes = frozenset({MODEL, SCORE})
    for round in (0, 1, 1000):
        assert rounds.offer("s", round, PROTOTYPES, "a 60 MB frame it never uses") == UNEXPECTED_TYPE
        assert rounds == before
    # r is not past round 1; p is, but sent only part of round 0 (the rest may still come)
    assert rounds.settled(1) == set() and rounds.settled(0) == {"q"}


def test_copies_and_old_rounds_from_one_peer_cannot_crowd_out_the_others():
    rounds = finished_up_to(5, inbox_frames=8, peer_inbox_frames=3)
    refusals = [rounds.offer("x", 5, MODEL, f"copy {n}") for n in range(10)]
    assert refusals == [None] + [DUPLICATE_PAYLOAD] * 9  # one MODEL per round from a peer
    refusals = [rounds.offer("x", old, MODEL, "old") for old in range(4, -1, -1)]
    assert refusals == [None, None] + [PEER_INBOX_FULL] * 3  # x holds its share of 3, no more
    for peer in ("p", "q"):
        assert rounds.offer(peer, 5, MODEL, "m") is None
        assert rounds.offer(peer, 5, SCORE, "s") is None
    assert rounds.arrived(5) == {"p", "q"} and rounds.queued == 7
    rounds.due()  # delivered: x's share is free again
    assert rounds.offer("x", 6, MODEL, "next") is None


def test_finishing_a_round_counts_the_missing_and_keeps_a_bounded_history():
    rounds = state(history_rounds=2)
    for r in range(3):
        rounds.finish(record(round=r, missing=("p",) if r else ("p", "q")))
    assert rounds.missing == {"p": 3, "q": 1}
    assert [entry.round for entry in rounds.history] == [1, 2] and rounds.completed == 3  # rounds 0, 1, 2
    rounds.resume(7, [record(round=7)])
    assert (rounds.round, rounds.completed, rounds.resumed_from) == (8, 8, 7)


def test_a_record_survives_json_and_a_wrong_one_is_refused():
    import json

    original = record(
        weights={"a": 0.25, "b": 0.75},
        missing=("b",),
        sent={"MODEL": (2, 300, 200)},
        gather_s=0.5,
        test_samples=75,
        discovery_sent={"PING": (4, 480, 0)},
    )
    again = RoundRecord.from_dict(json.loads(json.dumps(original.to_dict())))
    assert again == original
    assert (again.messages_out, again.bytes_out) == (2, 300)
    # A record from before test splits and discovery were recorded (an older checkpoint) still loads.
    older = {k: v for k, v in original.to_dict().items() if k not in ("test_samples", "discovery_sent")}
    assert RoundRecord.from_dict(older) == record(
        weights=original.weights, missing=("b",), sent=original.sent, gather_s=0.5
    )
    with pytest.raises(ValueError, match="not a round record"):
        RoundRecord.from_dict({**original.to_dict(), "surprise": 1})


class Scripted:
    """A node's algorithm as the round engine sees it: the seam calls, with fixed answers."""

    node_id, waits_for, sends = "a", frozenset({PROTOTYPES}), (PROTOTYPES,)

    def __init__(self) -> None:
        self.published_seqs: list[tuple[int, int]] = []
        self.received: list[tuple[str, int, str]] = []

    def local_step(self, round):
        from algorithms.interface import LocalReport

        return LocalReport(loss=0.25)

    def publish(self, round):
        from algorithms.interface import Outbound

        return [Outbound(("b", "c"), "prototypes")]

    def published(self, round, out, seq):
        self.published_seqs.append((round, seq))

    def expected(self, round):
        return {"b", "c"}

    def receive(self, peer, round, body, frame):
        self.received.append((peer, round, body))

    def respond(self):
        return []

    def end_round(self, round):
        pass

    def weights(self):
        return {"a": 0.5, "b": 0.5}


@dataclass(frozen=True)
class Payload:
    """What the engine reads of a verified envelope."""

    type: MessageType
    body: str
    seq: int = 1
    sender: bytes = b"key"


def test_the_engine_runs_a_round_and_builds_its_record_from_what_the_driver_hands_it():
    """The sequence both drivers follow, on simulated time: a quorum of one of two expected
    peers, the grace, a payload too late for the record, and the record built from the driver's
    evaluation, timings and traffic."""
    from algorithms.interface import Evaluation

    engine, algorithm = RoundEngine(state(waits_for=frozenset())), Scripted()
    engine.attach(algorithm)
    assert engine.offer("b", 0, Payload(MODEL, "model")) == UNEXPECTED_TYPE  # it takes prototypes only
    engine.begin(0)
    engine.step(0)
    assert engine.deliver() == [] and engine.respond() == []  # nothing came during the step
    for out in engine.publish(0):
        engine.published(engine.tag(out, 0), out, ("b",), 7)  # c could not be reached
    assert engine.expect(0) == {"b", "c"}
    gather = engine.gather(100.0, quorum=0.5, deadline_s=30, grace_s=2)
    assert engine.offer("b", 0, Payload(PROTOTYPES, "from b")) is None
    assert not engine.gather_finished(gather, 100.5)  # a quorum: the grace begins
    assert engine.gather_finished(gather, 102.5)
    assert engine.deliver() == [] and algorithm.received == [("b", 0, "from b")]
    assert engine.close_gather() == {"b"}
    assert engine.offer("c", 0, Payload(PROTOTYPES, "late")) is None  # queued, but the gather is over
    assert engine.deliver() == [] and engine.respond() == []  # handed over before the round ends
    assert algorithm.received[-1] == ("c", 0, "late")
    engine.end_round(0)
    sent = {PROTOTYPES: (1, 120, 100)}
    record = engine.record(Evaluation(3, 4, 4, 0.5), Timings(0.123456, 2.5, 2.75, 42.000012), sent)
    assert (record.node, record.round, record.accuracy, record.own_class_accuracy, record.loss) == (
        "a",
        0,
        0.75,
        1.0,
        0.25,
    )
    assert (record.expected, record.arrived, record.missing, record.recipients) == (2, 1, ("c",), 1)
    assert (record.step_s, record.gather_s, record.round_s, record.ended_at) == (0.1235, 2.5, 2.75, 42.0)
    assert record.sent == {"PROTOTYPES": (1, 120, 100)} and record.discovery_sent == {} and record.local_baseline == {}
    assert algorithm.published_seqs == [(0, 7)] and record.weights == {"a": 0.5, "b": 0.5}
    assert engine.state.completed == 1 and engine.state.history[-1] is record and engine.state.missing == {"c": 1}


def test_async_a_newer_payload_replaces_the_queued_one_of_its_peer_and_type_and_never_fills_the_share():
    rounds = state(asynchronous=True, peer_inbox_frames=2)
    # a fast peer sends ten rounds while this node steps: only the newest of each type is queued
    for r in range(10):
        assert rounds.offer("fast", r, MODEL, f"model {r}") is None
        assert rounds.offer("fast", r, SCORE, f"score {r}") is None
    assert rounds.offer("slow", 0, MODEL, "its model") is None
    assert rounds.offer("fast", 3, MODEL, "late, older") is None  # arrived late: the newer one stays
    assert rounds.superseded == 2 * 9 + 1 and rounds.queued == 3
    assert rounds.due() == [("fast", 9, "model 9"), ("fast", 9, "score 9"), ("slow", 0, "its model")]
    # the sync schedule keeps every round's payload and refuses past the share, as before
    sync = state(peer_inbox_frames=2)
    assert [sync.offer("fast", r, MODEL, r) for r in range(3)] == [None, None, PEER_INBOX_FULL]
    assert sync.superseded == 0


async def test_a_payload_too_far_ahead_wakes_the_gather_it_settles():
    """The daemon's driver: a `round_ahead` payload is refused (counted), but its sender is
    settled for the round, so the gather waiting for it is woken at once, not at its deadline
    (a node that joined peers three rounds ahead waited out `start_timeout_s` in round 0)."""
    from types import SimpleNamespace

    from p2pnode.learning.driver import Network, RoundDriver
    from p2pnode.learning.settings import AlgorithmSettings

    refused = []
    network = Network(
        peers=dict, send=None, rejected=lambda reason, size: refused.append(reason), sent=dict, discovery_sent=dict
    )
    driver = RoundDriver(AlgorithmSettings(), network, checkpoint_path=None)
    ahead = SimpleNamespace(sender_id="p", round=3, type=MODEL, size=100)  # max_rounds_ahead is 2
    driver.on_payload(ahead)
    assert refused == [ROUND_AHEAD] and driver._arrival.is_set()
    assert "p" in driver.state.settled(0)
    driver._arrival = type(driver._arrival)()
    driver.on_payload(SimpleNamespace(sender_id="q", round=0, type=PROTOTYPES, size=10))  # queued: wakes too
    assert driver._arrival.is_set()


async def test_an_emulated_slow_device_lasts_slowdown_times_the_cpu_time_not_the_wall_time(monkeypatch, autojump_clock):
    """`[node].slowdown` paces a computation of the round on the CPU seconds it used: a daemon
    whose step took longer in wall time because others shared its core is not stretched for it,
    and a daemon that used more CPU waits longer; 1 never waits."""
    from types import SimpleNamespace

    import trio

    from p2pnode.learning import driver

    cpu = [100.0]
    monkeypatch.setattr(driver, "time", SimpleNamespace(process_time=lambda: cpu[0]))

    async def computation(cpu_s: float, wall_s: float, slowdown: float) -> float:
        began = driver.Began.now()
        cpu[0] += cpu_s
        await trio.sleep(wall_s)
        await driver.paced(slowdown, began)
        return trio.current_time() - began.at

    assert await computation(0.5, 0.5, 4) == pytest.approx(2.0)  # alone on its core: 4 × 0.5 s
    assert await computation(0.5, 1.5, 4) == pytest.approx(2.0)  # crowded: the same 2 s, not 4 × 1.5
    assert await computation(0.5, 3.0, 4) == pytest.approx(3.0)  # it took longer already: no more
    assert await computation(0.5, 0.5, 1) == pytest.approx(0.5)  # not emulating: never waits


def drive(engine: RoundEngine, arrive: list[str]) -> list[Command]:
    """Run `engine` to its end by its commands alone, as a driver does: each round the peers in
    `arrive` send their prototypes during the gather, which lasts one simulated second."""
    from algorithms.interface import Evaluation

    carried_out, now = [], 0.0
    while (command := engine.next_command()) is not Command.DONE:
        carried_out.append(command)
        r = engine.round
        if command is Command.BEGIN:
            engine.begin(r)
        elif command is Command.STEP:
            engine.step(r)
        elif command is Command.DELIVER:
            engine.deliver()
            engine.respond()
        elif command is Command.PUBLISH:
            for out in engine.publish(r):
                engine.published(engine.tag(out, r), out, out.to, 1)
        elif command is Command.GATHER:
            engine.expect(r)
            gather = engine.gather(now, quorum=1.0, deadline_s=1.0, grace_s=0.0)
            for peer in arrive:
                engine.offer(peer, r, Payload(PROTOTYPES, f"{peer} {r}"))
            engine.deliver()
            now += 1.0
            assert engine.gather_finished(gather, now)
            engine.close_gather()
        elif command is Command.END_ROUND:
            engine.end_round(r)
        elif command is Command.RECORD:
            engine.record(Evaluation(1, 2), Timings(0.1, 1.0, 1.2, now), {})
        else:
            engine.next_round({"b", "c"})
    return carried_out


def test_a_run_is_driven_by_the_engines_commands_alone_and_a_call_out_of_order_raises():
    engine, algorithm = RoundEngine(state(rounds=3, waits_for=frozenset())), Scripted()
    engine.attach(algorithm)
    assert engine.next_command() is Command.BEGIN
    with pytest.raises(RoundOrderError, match="step called in round 0 while the round waits for begin"):
        engine.step(0)
    assert drive(engine, ["b", "c"]) == list(ROUND) * 3
    assert [(record.round, record.arrived) for record in engine.state.history] == [(0, 2), (1, 2), (2, 2)]
    assert algorithm.received == [(peer, r, f"{peer} {r}") for r in range(3) for peer in ("b", "c")]
    assert engine.next_command() is Command.DONE
    with pytest.raises(RoundOrderError, match="begin called in round 3 while the round waits for done"):
        engine.begin(3)
    # Mid-round, every call but the one due raises: here the round waits for its gather.
    engine = RoundEngine(state(rounds=3, waits_for=frozenset()))
    engine.attach(Scripted())
    engine.begin(0)
    engine.step(0)
    engine.deliver()
    engine.respond()
    engine.publish(0)
    for wrong in (lambda: engine.end_round(0), lambda: engine.publish(0), lambda: engine.next_round(set())):
        with pytest.raises(RoundOrderError, match="while the round waits for gather"):
            wrong()


class Cutting(Scripted):
    """Publishes to b and c in round 0, then to b alone: c was cut."""

    def publish(self, round):
        from algorithms.interface import Outbound

        return [Outbound(("b", "c") if round == 0 else ("b",), "prototypes")]


def test_a_peer_dropped_from_the_publish_is_sent_a_pass_and_its_gather_closes_without_a_wait():
    """The sender's side: the engine adds a PASS to each peer published to last round and not in
    this one, once, and the algorithm never sees it as its own. The receiver's side: a PASS
    settles its sender at once (no deadline waited out) and it is not counted missing; one for a
    round too far ahead is refused, one for a round already closed leaves nothing behind."""
    from algorithms.interface import Evaluation
    from protocol import Pass

    engine, algorithm = RoundEngine(state(rounds=3, waits_for=frozenset())), Cutting()
    engine.attach(algorithm)
    sent = []
    for r in range(3):
        engine.begin(r)
        engine.step(r)
        engine.deliver(), engine.respond()
        out = engine.publish(r)
        sent.append([(o.to, type(o.body).__name__) for o in out])
        for each in out:
            engine.published(r, each, each.to, r + 1)
        engine.expect(r)
        gather = engine.gather(0.0, quorum=1.0, deadline_s=30.0, grace_s=0.0)
        engine.offer("b", r, Payload(PROTOTYPES, "from b"))
        engine.offer("c", r, Payload(MessageType.PASS, Pass()))  # c, cut by its own graph, passes
        assert engine.gather_finished(gather, 0.1)  # both settled: no 30 s wait
        engine.deliver()
        engine.close_gather()
        engine.deliver(), engine.respond()
        engine.end_round(r)
        engine.record(Evaluation(1, 2), Timings(0.1, 0.1, 0.2, r), {})
        engine.next_round({"b", "c"})
    assert sent == [
        [(("b", "c"), "str")],
        [(("b",), "str"), (("c",), "Pass")],  # dropped in round 1: one PASS
        [(("b",), "str")],  # still dropped: nothing more to say
    ]
    assert algorithm.published_seqs == [(0, 1), (1, 2), (2, 3)]  # the PASS is the engine's, not the algorithm's
    assert [(rec.arrived, rec.missing) for rec in engine.state.history] == [(1, ())] * 3
    assert ("c", 0, Pass()) not in algorithm.received and all(peer == "b" for peer, _, _ in algorithm.received)
    rounds = state()
    assert rounds.offer("p", 3, MessageType.PASS, Pass()) == ROUND_AHEAD
    assert rounds.offer("p", 1, MessageType.PASS, Pass()) is None and rounds.settled(1) == {"p"}
    assert rounds.passed(0) == set() and rounds.arrived(1) == set()  # settled, but no payload came
    rounds.finish(record(round=1))
    assert rounds.offer("q", 0, MessageType.PASS, Pass()) is None and rounds.passed(0) == set()  # closed: ignored
