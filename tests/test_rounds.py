"""The round driver's decisions on simulated time: queueing, arrival, the gather's quorum, grace
and deadline, catching up, and the records every driver writes."""

import pytest

from p2pnode.rounds import INBOX_FULL, ROUND_AHEAD, Gather, RoundRecord, RoundState, arrived
from protocol import MessageType

PROTOTYPES, MODEL, SCORE = MessageType.PROTOTYPES, MessageType.MODEL, MessageType.SCORE


def state(**overrides) -> RoundState:
    settings = {"waits_for": frozenset({MODEL, SCORE}), "rounds": 10, "max_rounds_ahead": 2, "inbox_frames": 8}
    return RoundState(**{**settings, "history_rounds": 5, **overrides})


def record(node: str = "a", round: int = 0, **fields) -> RoundRecord:
    values = {
        "accuracy": 0.5,
        "own_class_accuracy": 0.6,
        "loss": 1.0,
        "test_loss": 1.2,
        "weights": {node: 1.0},
        "expected": 0,
        "arrived": 0,
        "missing": (),
        "recipients": 0,
        "sent": {},
        "step_s": 0.1,
    }
    return RoundRecord(node=node, round=round, **{**values, **fields})


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
    rounds.next_round({})
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


def test_the_first_round_waits_for_peers_still_loading_until_the_start_timeout():
    rounds = state()
    first = rounds.gather({"p"}, 10.0, quorum=1.0, deadline_s=5.0, grace_s=2.0, hold_until=130.0)
    assert not first.finished(set(), 15.0) and first.wake_at() == 130.0
    assert first.finished({"p"}, 40.0)
    later = rounds.gather({"p"}, 200.0, quorum=1.0, deadline_s=5.0, grace_s=2.0, hold_until=130.0)
    assert later.wake_at() == 205.0  # a start deadline already past changes nothing


def test_a_node_follows_its_neighbours_when_they_are_further_ahead_than_the_queue_reaches():
    rounds = state(rounds=100)
    rounds.finish(record(round=0))
    for peer, ahead in (("p", 9), ("q", 10), ("r", 1)):
        rounds.offer(peer, ahead, MODEL, None)  # refused as round_ahead, but heard
    # r is the only neighbour with weight: it is not ahead, so the others do not pull this node.
    assert rounds.next_round({"r": 0.5}) == 1 and rounds.catch_ups == 0
    rounds.finish(record(round=1))
    for peer, ahead in (("p", 9), ("q", 10), ("r", 1)):
        rounds.offer(peer, ahead, MODEL, None)
    assert rounds.next_round({"p": 0.3, "q": 0.3}) == 9 and rounds.catch_ups == 1
    rounds.finish(record(round=9))
    assert rounds.next_round({}) == 10  # heard from nobody since: one round on


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
