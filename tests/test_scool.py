"""SCooL: the E-step on hand-computed cases, the M-step against D-PSGD, scores that were never
asked for, and a simulation that recovers the groups."""

import math

import numpy as np
import pytest
import torch

from algorithms.data.datasets import load_dataset
from algorithms.data.partitions import PartitionSpec, make_partition
from algorithms.data.setup import ScenarioSpec, node_data
from algorithms.graphs.cooperation import (
    attention_weights,
    block_matrix,
    keep_top,
    row_normalise,
    sbm_e_step,
    sbm_edge_logits,
    sbm_membership,
    sigmoid,
    softmax,
)
from algorithms.interface import Frame, NodeSetup, PayloadRejected
from algorithms.registry import make_algorithm
from protocol.identity import Identity
from protocol.messages import Model, Score
from testnet.simulation.simulator import SimulationSpec, run_simulation


def logistic(x):
    return 1 / (1 + math.exp(-x))


def test_sigmoid_softmax_and_row_normalisation_with_temperature():
    assert sigmoid(np.array([0.0, 2.0, -800.0])) == pytest.approx([0.5, logistic(2.0), 0.0])
    y, t = np.array([-1.0, -2.0, -4.0]), 0.5
    expected = np.exp(y / t) / np.exp(y / t).sum()
    assert softmax(y / t) == pytest.approx(expected)
    assert softmax(np.array([1000.0, 999.0])) == pytest.approx([logistic(1.0), 1 - logistic(1.0)])
    assert row_normalise(np.array([1.0, 3.0])) == pytest.approx([0.25, 0.75])
    assert row_normalise(np.zeros(4)) == pytest.approx([0.25] * 4)  # nothing known: uniform


def test_sbm_prior_and_membership_on_hand_computed_cases():
    b = block_matrix(2, 0.8, 0.2)
    assert b.tolist() == [[0.8, 0.2], [0.2, 0.8]]
    logit = math.log(0.8 / 0.2)
    own = np.array([1.0, 0.0])
    others = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    # Ω_iᵀ logit(B) Ω_j: same block +log 4, other block −log 4, undecided 0.
    assert sbm_edge_logits(own, others, b) == pytest.approx([logit, -logit, 0.0])
    # Ω_ik ∝ α_k exp Σ_j Σ_l Ω_jl (q log B_kl + (1−q) log(1−B_kl)); one neighbour in block 0, q = 0.9.
    q = np.array([0.9])
    evidence = [0.9 * math.log(0.8) + 0.1 * math.log(0.2), 0.9 * math.log(0.2) + 0.1 * math.log(0.8)]
    expected = np.exp(evidence) / np.exp(evidence).sum()
    assert sbm_membership(q, others[:1], b, np.array([0.5, 0.5])) == pytest.approx(expected)
    # Uneven proportions α tilt it.
    tilted = np.array([0.25, 0.75]) * np.exp(evidence)
    assert sbm_membership(q, others[:1], b, np.array([0.25, 0.75])) == pytest.approx(tilted / tilted.sum())


def test_sbm_e_step_one_sweep_by_hand_and_damping():
    b = block_matrix(2, 0.8, 0.2)
    own, others = np.array([0.7, 0.3]), np.array([[1.0, 0.0], [0.0, 1.0]])
    y, t = np.array([-0.1, -0.2, -3.0]), 2.0
    logit = np.log(b / (1 - b))
    prior = [own @ logit @ own, own @ logit @ others[0], own @ logit @ others[1]]
    edges = [logistic((yj + pj) / t) for yj, pj in zip(y, prior, strict=True)]
    q, membership = sbm_e_step(y, own, others, b, np.array([0.5, 0.5]), temperature=t, sweeps=1)
    assert q == pytest.approx(edges)
    assert membership == pytest.approx(sbm_membership(np.array(edges[1:]), others, b, np.array([0.5, 0.5])))
    _, damped = sbm_e_step(y, own, others, b, np.array([0.5, 0.5]), temperature=t, sweeps=1, damping=0.5)
    assert damped == pytest.approx(0.5 * own + 0.5 * membership)
    with pytest.raises(ValueError):
        sbm_e_step(y[:2], own, others, b, np.array([0.5, 0.5]), temperature=t, sweeps=1)
    # No neighbours: only the self edge, the membership stays.
    q, kept = sbm_e_step(np.array([-0.5]), own, np.zeros((0, 2)), b, np.array([0.5, 0.5]), 1.0, 2)
    assert q == pytest.approx([logistic(-0.5 + own @ logit @ own)]) and kept == pytest.approx(own)


def test_attention_weights_and_top_fraction_pruning():
    y, p, t = np.array([-0.2, -0.3, -5.0]), np.array([0.5, 0.3, 0.2]), 0.5
    raw = np.exp(y / t) / np.exp(y / t).sum() * p
    assert attention_weights(y, p, t) == pytest.approx(raw / raw.sum())
    weights = {"a": 0.3, "b": 0.1, "c": 0.3, "d": 0.05}
    assert keep_top(weights, peers=9, fraction=0.2) == ("a",)  # ⌊1.8⌋ = 1; a before c on a tie
    assert keep_top(weights, peers=19, fraction=0.2) == ("a", "b", "c")  # ⌊3.8⌋ = 3
    assert keep_top(weights, peers=2, fraction=0.1) == ("a",)  # at least one


@pytest.fixture(scope="module")
def digits_groups():
    dataset = load_dataset("digits")
    partition = make_partition(
        dataset, PartitionSpec(scenario="noniid-sbm", nodes=4, clusters=2, samples_per_class=10, test_per_class=5)
    )
    identities = [Identity.generate() for _ in range(4)]
    return dataset, partition, identities


def scool_node(name, digits_groups, index, **settings):
    from algorithms.registry import apply_overrides, default_config

    dataset, partition, identities = digits_groups
    ids = [identity.node_id for identity in identities]
    setup = NodeSetup(
        node_id=ids[index],
        data=node_data(dataset, partition, index, pooled=False),
        backbone="convnet",
        seed=index,
        shared_seed=7,
    )
    node = make_algorithm(name, setup, apply_overrides(default_config(name), {k: str(v) for k, v in settings.items()}))
    node.set_peers(ids)
    return node


def exchange(a, b, identities, round=0, seq=(11, 12)):
    """a and b publish their models to each other, score each other's, and hand the scores back."""
    sent = {}
    for node, key, number in ((a, 0, seq[0]), (b, 1, seq[1])):
        (out,) = node.publish(round)
        node.published(round, out, number)
        sent[key] = out.body
    a.receive(b.node_id, round, sent[1], Frame(seq[1], identities[1].public_key))
    b.receive(a.node_id, round, sent[0], Frame(seq[0], identities[0].public_key))
    for node, other in ((a, b), (b, a)):
        for answer in node.respond():
            assert answer.to == (other.node_id,) and answer.round == round
            other.receive(node.node_id, round, answer.body)
    return sent


def test_the_m_step_is_d_psgd_when_the_start_is_common(digits_groups):
    """θ_i^start − Σ_j w_ij Δ_j = Σ_j w_ij θ_j when every θ_j^start is the same (round 0): the
    M-step with the E-step's w mixes models exactly as D-PSGD would with that w fixed."""
    identities = digits_groups[2]
    a, b = (scool_node("scool-sbm", digits_groups, i) for i in (0, 1))
    for node in (a, b):
        node.set_peers([a.node_id, b.node_id])
        node.local_step(0)
    sent = exchange(a, b, identities)
    a.end_round(0)
    w = a.weights()
    assert sum(w.values()) == pytest.approx(1.0) and set(w) == {a.node_id, b.node_id}
    for name, tensor in a.shared.state().items():
        mixed = w[a.node_id] * torch.tensor(sent[0].tensors[name]) + w[b.node_id] * torch.tensor(sent[1].tensors[name])
        torch.testing.assert_close(tensor, mixed, rtol=1e-5, atol=1e-6)


def test_dirac_is_d_psgd_and_sends_no_scores(digits_groups):
    a, b = (scool_node("scool-dirac", digits_groups, i) for i in (0, 1))
    for node in (a, b):
        node.set_peers([a.node_id, b.node_id])
        node.local_step(0)
    (out_a,), (out_b,) = a.publish(0), b.publish(0)
    assert out_a.body.update is None  # D-PSGD needs parameters only
    a.receive(b.node_id, 0, out_b.body, Frame(5, digits_groups[2][1].public_key))
    assert a.respond() == []
    a.end_round(0)
    for name, tensor in a.shared.state().items():
        expected = (torch.tensor(out_a.body.tensors[name]) + torch.tensor(out_b.body.tensors[name])) / 2
        torch.testing.assert_close(tensor, expected)
    assert a.weights() == {a.node_id: 0.5, b.node_id: 0.5}


def test_scores_nobody_asked_for_are_rejected_and_named(digits_groups):
    identities = digits_groups[2]
    a, b, c = (scool_node("scool-sbm", digits_groups, i) for i in range(3))
    for node in (a, b, c):
        node.set_peers([a.node_id, b.node_id])  # c is a stranger to a
        node.local_step(0)
    exchange(a, b, identities, seq=(21, 22))

    def score(**fields):
        values = dict(kind="log_likelihood", subject=identities[0].public_key, subject_seq=21, value=-3.0, samples=10)
        return Score(**(values | fields))

    cases = [
        (b.node_id, 0, score(), "duplicate_score"),  # b already answered: a flood is refused
        (b.node_id, 0, score(subject_seq=99), "unsolicited_score"),  # a's model went in frame 21
        (b.node_id, 1, score(), "unsolicited_score"),  # no model of round 1 was ever sent
        (b.node_id, 0, score(subject=identities[2].public_key), "wrong_subject"),
        (b.node_id, 0, score(kind="similarity"), "bad_kind"),
        (c.node_id, 0, score(), "not_a_peer"),
    ]
    for peer, round, body, reason in cases:
        with pytest.raises(PayloadRejected) as caught:
            a.receive(peer, round, body)
        assert caught.value.reason == reason, (body, caught.value)
    a.set_peers([a.node_id, b.node_id, c.node_id])
    for body, reason in (
        (score(subject_seq=99), "unsolicited_score"),  # a's model went to b only
        (score(value=2.0), "unsolicited_score"),
    ):
        with pytest.raises(PayloadRejected) as caught:
            a.receive(c.node_id, 0, body)
        assert caught.value.reason == reason
    fresh = scool_node("scool-sbm", digits_groups, 0)
    fresh.set_peers([a.node_id, b.node_id])
    fresh.local_step(0)
    (out,) = fresh.publish(0)
    fresh.published(0, out, 21)
    with pytest.raises(PayloadRejected) as caught:
        fresh.receive(b.node_id, 0, score(value=2.0))  # a probability above 1
    assert caught.value.reason == "bad_score"
    # A model without its update, or sent twice for one round, is refused too.
    (model,) = b.publish(0)
    with pytest.raises(PayloadRejected) as caught:
        fresh.receive(
            b.node_id, 0, Model(kind="params", tensors=model.body.tensors), Frame(1, identities[1].public_key)
        )
    assert caught.value.reason == "bad_shape"
    fresh.receive(b.node_id, 0, model.body, Frame(1, identities[1].public_key))
    with pytest.raises(PayloadRejected) as caught:
        fresh.receive(b.node_id, 0, model.body, Frame(2, identities[1].public_key))
    assert caught.value.reason == "duplicate_model"
    assert len(fresh.respond()) == 1  # one answer per model, however often it is sent


@pytest.mark.parametrize("name", ["scool-sbm", "scool-attention"])
def test_checkpoint_round_trip(digits_groups, name):
    identities = digits_groups[2]
    a, b = (scool_node(name, digits_groups, i, prune_round=1) for i in (0, 1))
    for node in (a, b):
        node.set_peers([a.node_id, b.node_id])
        node.local_step(0)
    exchange(a, b, identities)
    a.end_round(0)
    state = a.state_dict()
    restored = scool_node(name, digits_groups, 0, prune_round=1)
    restored.load_state_dict(state)
    assert restored.neighbours == a.neighbours == (b.node_id,)
    assert restored.weights() == pytest.approx(a.weights())
    for (_, v), (_, w) in zip(a.shared.state().items(), restored.shared.state().items(), strict=True):
        torch.testing.assert_close(v, w)
    with pytest.raises(ValueError):
        scool_node(name, digits_groups, 0, blocks=3).load_state_dict(
            state
        ) if name == "scool-sbm" else restored.load_state_dict({**state, "encoder": {}})


@pytest.mark.parametrize("name", ["scool-sbm", "scool-attention"])
def test_simulation_recovers_the_groups_and_prunes_to_them(name):
    spec = SimulationSpec(
        algorithm=name,
        data=ScenarioSpec(
            dataset="digits", scenario="noniid-sbm", nodes=4, clusters=2, samples_per_class=10, test_per_class=5
        ),
        rounds=8,
        overrides={"prune_round": "4"},
    )
    report = run_simulation(spec)
    assert report["accuracy_own_classes"]["mean"] >= 0.9
    assert report["graph"]["within_cluster_mass"] >= 0.95
    assert report["graph"]["l1_to_truth"] <= 0.2
    assert report["rejections"] == {}
    by_round = np.diff([0, *report["comm"]["messages_cumulative_per_round"]])
    # Before pruning everyone sends a model to everyone and gets a score back (4·3 each);
    # after it, each node talks to its one partner.
    assert by_round[0] == 24 and by_round[-1] == 8


def test_a_peer_that_kept_us_gets_our_model_as_an_answer(digits_groups):
    """After pruning, a keeps b but b keeps c: b answers a's model with its score and its own
    model, so a's round is complete at once (over the network: no deadline to wait out), and
    from then on b sends to a unasked."""
    identities = digits_groups[2]
    a, b, c = (scool_node("scool-sbm", digits_groups, i, prune_round=1) for i in range(3))
    nodes = {n.node_id: (n, identities[i]) for i, n in enumerate((a, b, c))}
    a.neighbours, b.neighbours, c.neighbours = (b.node_id,), (c.node_id,), (b.node_id,)
    seq = iter(range(100, 200))

    def deliver(sender, outs):
        for out in outs:
            number = next(seq)
            sender.published(1, out, number)
            for peer in out.to:
                nodes[peer][0].receive(sender.node_id, 1, out.body, Frame(number, nodes[sender.node_id][1].public_key))

    for node in (a, b, c):
        node.set_peers([a.node_id, b.node_id, c.node_id])
        node.local_step(1)
    published = [(node, node.publish(1)) for node in (a, b, c)]  # all at once: b's model goes to c only
    for node, outs in published:
        deliver(node, outs)
    assert a.node_id in b.audience
    answers = b.respond()
    assert sorted((out.to, out.body.TYPE.value) for out in answers) == sorted(
        [((a.node_id,), "MODEL"), ((a.node_id,), "SCORE"), ((c.node_id,), "SCORE")]
    )
    deliver(b, answers)
    for node in (a, c):
        deliver(node, node.respond())
    assert b.respond() == []  # a's score of b's answer is accepted: nothing more is owed
    a.end_round(1)
    assert a.weights()[b.node_id] > 0.3
    (out,) = b.publish(2)
    assert set(out.to) == {a.node_id, c.node_id}
