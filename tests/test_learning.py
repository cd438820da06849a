"""Losses, the algorithm seam, payload checks, the registry, and an end-to-end simulation."""

import itertools
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from algorithms import catalog
from algorithms.data.datasets import load_dataset
from algorithms.data.partitions import PartitionSpec, make_partition
from algorithms.data.setup import ScenarioSpec, node_data
from algorithms.interface import NeighbourView, NodeSetup, PayloadRejected
from algorithms.models import personal as models
from algorithms.models.losses import prototype_alignment, prototype_uniformity, supervised_contrastive
from algorithms.registry import (
    ALGORITHMS,
    ConfigOverrideError,
    apply_overrides,
    checked_config,
    default_config,
    make_algorithm,
    run_config,
)
from protocol.messages import Head, MessageType, Model, Ping, Prototypes
from testnet.simulation.simulator import SimulationSpec, run_simulation


def test_supervised_contrastive_on_a_hand_computed_case():
    # Two orthogonal unit vectors per class: cosines are 1 within a pair... here we pick
    # projections whose cosines we know: a=(1,0), a'=(1,0), b=(0,1), b'=(0,1).
    z = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])  # norms differ: loss normalises
    labels = torch.tensor([0, 0, 1, 1])
    t = 0.5
    # Anchor 0: positive cosine 1 (its pair), negatives cosine 0 (two of them).
    expected = -math.log(math.exp(1 / t) / (math.exp(1 / t) + 2 * math.exp(0)))
    assert supervised_contrastive(z, labels, t).item() == pytest.approx(expected, rel=1e-6)


def test_supervised_contrastive_ignores_anchors_without_positives_and_is_finite_at_tiny_temperature():
    z = torch.randn(5, 8)
    labels = torch.tensor([0, 0, 1, 2, 3])
    loss = supervised_contrastive(z, labels, 1e-3)
    assert torch.isfinite(loss)
    only_pair = supervised_contrastive(z[:2], labels[:2], 1e-3)
    assert only_pair.item() == pytest.approx(0.0, abs=1e-6)  # the positive is the only other sample


def test_prototype_losses_on_hand_computed_cases():
    prototypes = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    p = torch.tensor([[3.0, 0.0]])
    # cosines (1, 0) / τ=1 → −log(e / (e + 1))
    assert prototype_alignment(p, torch.tensor([0]), prototypes, 1.0).item() == pytest.approx(
        -math.log(math.e / (math.e + 1)), rel=1e-6
    )
    # Two orthogonal prototypes: each sees exp(0/τ) = 1 from the other.
    assert prototype_uniformity(prototypes, 0.1).item() == pytest.approx(1.0)
    opposite = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    assert prototype_uniformity(opposite, 0.5).item() == pytest.approx(math.exp(-2))


def test_catalog_matches_the_registries():
    # The catalog is the one list of algorithms; the registry loads each entry's class from it.
    assert tuple(ALGORITHMS) == catalog.ALGORITHM_NAMES
    for name, entry in catalog.ALGORITHMS.items():
        assert entry.cls.endswith(f":{ALGORITHMS[name].cls.__name__}")
        assert ALGORITHMS[name].summary == entry.summary
    assert catalog.CPU_BACKBONES == models.CPU_BACKBONES
    assert catalog.BACKBONES == models.BACKBONES


def test_overrides_parse_validate_and_name_the_key():
    config = apply_overrides(
        default_config("mapl"),
        {"graph.l2_weight": "2.5", "warmup_rounds": "3", "training.optimizer": "sgd", "shared_head_init": "yes"},
    )
    assert (config.graph.l2_weight, config.warmup_rounds, config.training.optimizer) == (2.5, 3, "sgd")
    assert apply_overrides(default_config("mapl-dual"), {"distill_after": "5"}).distill_after == 5
    assert apply_overrides(default_config("mapl-dual"), {"distill_after": "None"}).distill_after is None
    for bad, words in (
        ({"graph.nope": "1"}, "no setting 'nope'"),
        ({"graph": "1"}, "is a section"),
        ({"warmup_rounds": "x"}, "not a valid int"),
        ({"graph.steps": "0"}, "graph.steps"),
        ({"training.optimizer": "rmsprop"}, "optimizer"),
    ):
        with pytest.raises(ConfigOverrideError, match=words):
            apply_overrides(default_config("mapl"), bad)


def test_a_schedule_left_at_its_default_fits_the_run_and_a_given_one_is_kept():
    """Issue #44: `init --rounds 10` needed `--set warmup_rounds=N`; a default now takes at most
    a third of the run, and runs of 60 rounds or more keep MAPL's 20."""
    assert run_config("mapl-dual", {}, 10).warmup_rounds == 3
    assert run_config("mapl-dual", {}, 10).distill_after is None  # at the end of warm-up
    assert run_config("mapl", {}, 60).warmup_rounds == run_config("mapl", {}, 400).warmup_rounds == 20
    assert run_config("scool-sbm", {}, 12).prune_round == 4 and run_config("scool-sbm", {}, 30).prune_round == 10
    assert run_config("mapl", {"warmup_rounds": "9"}, 12).warmup_rounds == 9
    assert run_config("scool-sbm", {"prune_round": "0"}, 12).prune_round == 0
    assert checked_config("mapl-dual", {}, 2).warmup_rounds == 1


@pytest.fixture(scope="module")
def digits_nodes():
    dataset = load_dataset("digits")
    partition = make_partition(dataset, PartitionSpec(scenario="1", nodes=4, samples_per_class=10, test_per_class=5))
    return dataset, partition


def make_node(name, digits_nodes, index=0, backbone="convnet"):
    dataset, partition = digits_nodes
    setup = NodeSetup(
        node_id=f"n{index}", data=node_data(dataset, partition, index, pooled=False), backbone=backbone, seed=index
    )
    node = make_algorithm(name, setup)
    node.set_peers(["n0", "n1", "n2", "n3"])
    return node


def test_mapl_rejects_payloads_of_the_wrong_shape_type_or_sender(digits_nodes):
    node = make_node("mapl", digits_nodes)
    k, dim, latent = node.spec.num_classes, node.spec.projection_dim, node.spec.latent_dim
    good = Prototypes(classes=tuple(range(k)), counts=(1,) * k, prototypes=_own_scale(node))
    node.receive("n1", 0, good)
    cases = [
        (
            "n1",
            Prototypes(classes=tuple(range(k)), counts=(1,) * k, prototypes=np.zeros((k, dim + 1), np.float32)),
            "bad_shape",
        ),
        ("n1", Prototypes(classes=(0, 1), counts=(1, 1), prototypes=np.zeros((2, dim), np.float32)), "bad_shape"),
        ("n1", Prototypes(classes=(k,), counts=(1,), prototypes=np.zeros((1, dim), np.float32)), "bad_class"),
        (
            "n1",
            Prototypes(
                classes=tuple(range(k)),
                counts=(1,) * k,
                prototypes=np.zeros((k, dim), np.float32),
                head=np.zeros((k, latent + 1), np.float32),
            ),
            "bad_shape",
        ),
        ("n1", Head(weight=np.zeros((k, latent), np.float32), bias=np.zeros(k, np.float32)), "unexpected_type"),
        ("n1", Model(kind="params", tensors={}), "unexpected_type"),
        ("n1", Ping(nonce=1), "unexpected_type"),
        ("stranger", good, "not_a_peer"),
    ]
    for sender, body, reason in cases:
        with pytest.raises(PayloadRejected) as caught:
            node.receive(sender, 0, body)
        assert caught.value.reason == reason, (body, caught.value)


def test_each_algorithm_declares_what_it_sends_and_waits_for():
    from algorithms.interface import Algorithm

    for name, info in ALGORITHMS.items():
        assert info.cls.waits_for <= info.cls.sends, name
    assert ALGORITHMS["mapl+"].cls.sends == {MessageType.PROTOTYPES, MessageType.MODEL}
    assert ALGORITHMS["scool-sbm"].cls.waits_for == {MessageType.MODEL, MessageType.SCORE}
    assert not ALGORITHMS["local"].cls.sends and not ALGORITHMS["scool-local"].cls.sends
    with pytest.raises(TypeError, match="waits for"):

        class WaitsInVain(Algorithm):  # would wait every round for a payload nobody sends
            waits_for = frozenset({MessageType.SCORE})


def test_neighbour_view_keeps_the_freshest_payload_within_staleness():
    view = NeighbourView(max_staleness=1)
    view.set_peers(["a", "b"])
    old = Prototypes(classes=(0,), counts=(1,), prototypes=np.zeros((1, 2), np.float32))
    new = Prototypes(classes=(0,), counts=(2,), prototypes=np.ones((1, 2), np.float32))
    view.put("a", 5, new)
    view.put("a", 3, old)  # late and older: ignored
    assert view.fresh(Prototypes.TYPE, 6)["a"] is new
    assert view.fresh(Prototypes.TYPE, 7) == {}  # two rounds old
    view.set_peers(["b"])  # a left: its payloads go with it
    assert view.latest(Prototypes.TYPE) == {}
    with pytest.raises(ValueError):
        NeighbourView(-1)


@pytest.mark.parametrize("name", ["mapl-auto", "dfedavgm"])
def test_the_order_neighbours_payloads_arrive_in_changes_no_bit_of_the_model(name, digits_nodes):
    """A daemon takes its neighbours' payloads as they come; the simulator, in node order. Both
    must end with the same model to the bit (sums over neighbours add in the peers' order), or a
    deployed fleet drifts from its rehearsal (CI once saw a node two test images apart)."""
    senders = [make_node(name, digits_nodes, index) for index in (1, 2, 3)]
    for sender in senders:
        sender.local_step(0)
    outs = [(f"n{index}", out) for index, sender in enumerate(senders, 1) for out in sender.publish(0)]
    models = []
    for order in (outs, outs[::-1]):
        node = make_node(name, digits_nodes, 0)
        node.local_step(0)
        for peer, out in order:
            if "n0" in out.to:
                node.receive(peer, 0, out.body)
        node.end_round(0)
        models.append(node.model.state_dict())
    assert models[0].keys() == models[1].keys()
    assert all(torch.equal(models[0][key], models[1][key]) for key in models[0])


def test_dfedavgm_averages_models_exactly(digits_nodes):
    a = make_node("dfedavgm", digits_nodes, 0)
    b = make_node("dfedavgm", digits_nodes, 1)
    a.local_step(0)
    b.local_step(0)
    a.publish(0)
    (out_b,) = b.publish(0)
    before = {k: v.clone() for k, v in a.shared.state().items()}
    a.receive("n1", 0, out_b.body)
    a.end_round(0)
    for name, tensor in a.shared.state().items():
        expected = (before[name] + torch.tensor(out_b.body.tensors[name])) / 2
        torch.testing.assert_close(tensor, expected)


def test_mapl_aggregates_prototypes_with_its_weights(digits_nodes):
    node = make_node("mapl", digits_nodes)
    k = node.spec.num_classes
    own = node.model.prototypes.detach().clone()
    # Rows of this node's direction at 1.2 times its scale (within `prototype_ratio`).
    peer_rows = (1.2 * own).numpy()
    node.receive("n1", 0, Prototypes(classes=tuple(range(k)), counts=(1,) * k, prototypes=peer_rows))
    node.end_round(0)
    # Only n1 arrived: weights 1/4 (self) and 1/4 (n1) renormalise to 1/2 each.
    torch.testing.assert_close(node.model.prototypes.detach(), (own + torch.tensor(peer_rows)) / 2)


def test_homogeneous_algorithms_refuse_mixed_backbones():
    with pytest.raises(ValueError, match="one backbone"):
        SimulationSpec(algorithm="dfedavgm", backbones=("convnet", "mlp")).node_backbones()


def test_simulate_on_digits_learns_and_recovers_two_clusters(tmp_path):
    from p2pnode_cli import main

    out = tmp_path / "sim"
    code = main(
        [
            "simulate",
            "--algorithm",
            "mapl",
            "--dataset",
            "digits",
            "--nodes",
            "4",
            "--rounds",
            "12",
            "--samples-per-class",
            "20",
            "--set",
            "warmup_rounds=4",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    for key in ("algorithm", "dataset", "scenario", "nodes", "rounds", "seed", "wall_s"):
        assert key in report
    assert report["accuracy"]["mean"] > 0.6  # 5 classes per node: chance is 0.2
    assert min(report["accuracy"]["per_node"]) > 0.4, report["accuracy"]["per_node"]  # every node learned
    assert len(report["accuracy"]["per_round"]) == 12
    w = np.array(report["graph"]["W"])
    np.testing.assert_allclose(w.sum(axis=1), 1)
    assert w.min() >= 0
    assert report["graph"]["within_cluster_mass"] >= 0.9
    assert report["comm"]["by_type"]["PROTOTYPES"]["messages"] > 0 and "HEAD" not in report["comm"]["by_type"]
    assert report["comm"]["bytes"] == sum(t["bytes"] for t in report["comm"]["by_type"].values())
    assert report["rejections"] == {}
    for png in ("graph.png", "accuracy.png", "bytes.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "algorithm", ["local", "oracle", "fedproto", "mapl-nocgl", "mapl+", "dfedavgm", "mapl-dual", "fedmrl"]
)
def test_every_algorithm_runs_through_the_simulator(algorithm):
    spec = SimulationSpec(
        algorithm=algorithm,
        data=ScenarioSpec(dataset="digits", scenario="1", nodes=4, samples_per_class=5, test_per_class=3),
        rounds=2,
        overrides={"training.batch_size": "16"},
    )
    report = run_simulation(spec)
    per_node, per_round = report["accuracy"]["per_node"], report["accuracy"]["per_round"]
    # Every node was evaluated after every round, on its own 3 test images of each of its classes.
    assert len(per_node) == 4 and len(per_round) == 2 and report["accuracy"]["mean"] == pytest.approx(np.mean(per_node))
    assert all(abs(a * 15 - round(a * 15)) < 1e-9 for a in per_node), per_node
    np.testing.assert_allclose(np.array(report["graph"]["W"]).sum(axis=1), 1)
    communicates = algorithm not in ("local", "oracle")
    assert (report["comm"]["messages"] > 0) == communicates
    if algorithm == "local":
        np.testing.assert_allclose(report["graph"]["W"], np.eye(4))


def test_simulation_is_deterministic():
    spec = SimulationSpec(
        algorithm="mapl",
        data=ScenarioSpec(dataset="digits", nodes=3, samples_per_class=5, test_per_class=3),
        rounds=2,
        overrides={"warmup_rounds": "1"},
    )
    first, second = run_simulation(spec), run_simulation(spec)
    assert first["accuracy"] == second["accuracy"]
    assert first["graph"]["W"] == second["graph"]["W"]
    assert first["comm"] == second["comm"]


def test_local_loss_is_finite_and_decreases(digits_nodes):
    node = make_node("local", digits_nodes)
    first = node.local_step(0).loss
    for round in range(1, 6):
        last = node.local_step(round).loss
    assert math.isfinite(first) and last < first
    assert F.softmax(node.model.classify(node.data.test_images), 1).shape[1] == 10


def _head_message(node, weight):
    k = node.spec.num_classes
    return Prototypes(
        classes=tuple(range(k)),
        counts=(10,) * k,
        prototypes=_own_scale(node),  # a peer's prototypes of this node's scale (outliers.max_norm_ratio)
        head=weight.astype(np.float32),
    )


_SENT = itertools.count(1)


def _own_scale(node) -> np.ndarray:
    """A peer's prototypes of this node's scale and direction (`prototype_ratio`,
    `prototype_agreement`), each call's bytes its own (a peer sending another's is refused)."""
    return node.model.prototypes.detach().numpy() * np.float32(1 + 1e-4 * next(_SENT))


def test_mapl_bundles_heads_sparsely_and_re_admits_an_explored_peer(digits_nodes):
    from algorithms.methods.mapl import Mapl, MaplConfig

    dataset, partition = digits_nodes
    setup = NodeSetup(node_id="n0", data=node_data(dataset, partition, 0, pooled=False), backbone="convnet", seed=0)
    node = Mapl(setup, MaplConfig(warmup_rounds=1, head_every=3, explore_every=1, explore_peers=1))
    node.set_peers(["n1", "n2", "n3"])
    rng = np.random.default_rng(0)
    start = node.initial_head
    update = rng.standard_normal(start.shape).astype(np.float32)
    with torch.no_grad():
        node.model.head.weight.copy_(torch.tensor(start + update))

    # Warm-up: prototypes to every peer, no head, one frame per peer.
    (warmup,) = node.publish(0)
    assert warmup.to == ("n1", "n2", "n3") and warmup.body.head is None

    # First graph round: the head rides along, to everyone.
    (first,) = node.publish(1)
    assert first.to == ("n1", "n2", "n3") and first.body.head is not None
    for peer, weight in (
        ("n1", start + update),
        ("n2", start + rng.standard_normal(start.shape)),
        ("n3", start + rng.standard_normal(start.shape)),
    ):
        node.receive(peer, 1, _head_message(node, weight))
    node.end_round(1)
    assert node.neighbours() == ("n1",)  # the unrelated heads got weight 0

    # Between head rounds: prototypes only to the neighbour, head and prototypes to one explored peer.
    outs = {out.body.head is not None: out for out in node.publish(2)}
    assert outs[False].to == ("n1",)
    (explored,) = outs[True].to
    assert explored in ("n2", "n3")

    # The explored peer answers with a head like ours now: it is scored again and re-admitted,
    # while n1's head from round 1 is still within its head_every − 1 + max_staleness bound.
    node.receive(explored, 2, _head_message(node, start + 1.1 * update))
    node.end_round(2)
    assert set(node.neighbours()) == {"n1", explored}


@pytest.mark.parametrize("algorithm", ["mapl+", "dfedavgm"])
def test_model_averaging_algorithms_learn(algorithm):
    spec = SimulationSpec(
        algorithm=algorithm,
        data=ScenarioSpec(dataset="digits", scenario="1", nodes=4, seed=0, samples_per_class=20),
        rounds=8,
        overrides={"warmup_rounds": "3"} if algorithm == "mapl+" else {},
    )
    report = run_simulation(spec)
    assert report["accuracy"]["mean"] > 0.6, report["accuracy"]  # 5 classes per node: chance is 0.2
    assert report["comm"]["by_type"]["MODEL"]["messages"] > 0
    assert report["rejections"] == {}


def test_a_node_can_name_its_own_classes():
    from algorithms.data.setup import class_list_data

    dataset = load_dataset("digits")
    data = class_list_data(dataset, (3, 7), samples_per_class=12, test_per_class=5, seed=4)
    assert sorted(set(data.train_labels.tolist())) == [3, 7] and len(data.train_labels) == 24
    assert sorted(set(data.test_labels.tolist())) == [3, 7] and len(data.test_labels) == 10
    again = class_list_data(dataset, (3, 7), samples_per_class=12, test_per_class=5, seed=4)
    assert torch.equal(data.train_images, again.train_images)  # deterministic
    # digits has no test split: test images come from the same pool, never from the training draw.
    train = {tuple(row) for row in data.train_images.flatten(1).tolist()}
    assert not any(tuple(row) in train for row in data.test_images.flatten(1).tolist())
    with pytest.raises(ValueError, match="not among"):
        class_list_data(dataset, (10,), samples_per_class=1, test_per_class=1, seed=0)


@pytest.mark.parametrize("algorithm", ["mapl", "fedproto", "dfedavgm", "mapl-dual", "fedmrl"])
def test_a_checkpoint_restores_the_node_exactly(digits_nodes, tmp_path, algorithm):
    from p2pnode.learning.checkpoint import Checkpoint, CheckpointError

    node = make_node(algorithm, digits_nodes)
    node.local_step(0)
    node.publish(0)
    node.end_round(0)
    path = tmp_path / "checkpoint.pt"
    Checkpoint(algorithm, 0, node.state_dict(), ()).save(path)
    with pytest.raises(CheckpointError, match="another algorithm"):
        Checkpoint.load(path, "scool-sbm")
    restored = make_node(algorithm, digits_nodes)
    restored.load_state_dict(Checkpoint.load(path, algorithm).state)
    for (name, a), (_, b) in zip(node.model.state_dict().items(), restored.model.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    assert restored.weights() == node.weights()
    # Both continue identically: same data order, same optimiser moments.
    torch.manual_seed(0)
    first = node.local_step(1).loss
    torch.manual_seed(0)
    assert restored.local_step(1).loss == pytest.approx(first)
    with pytest.raises(ValueError):
        restored.load_state_dict({"trainer": {"model": {}, "optimizer": {}, "generator": torch.zeros(1)}})


@pytest.mark.parametrize("similarity", ["update-gram", "update-cosine"])
def test_three_nodes_on_a_chain_of_class_sets(similarity):
    """Issue #28: {0–4}, {2–6}, {5–9} on digits (scenario 2, three clusters). Every node keeps
    weight on itself (before the step fix the middle node put all of it on a peer). The default
    update-gram similarity pairs the two ends, which share no class: it compares which classes
    move together in the heads' updates, and two nodes with disjoint sets of five classes look
    alike there (docs/learning.md, "A chain of class sets"); update-cosine finds the chain."""
    spec = SimulationSpec(
        algorithm="mapl",
        data=ScenarioSpec(dataset="digits", scenario="2", nodes=3, clusters=3, samples_per_class=20),
        rounds=10,
        backbones=("mlp",),
        overrides={"warmup_rounds": "4", "graph.similarity": similarity},
    )
    report = run_simulation(spec)
    assert report["node_classes"] == [[0, 1, 2, 3, 4], [2, 3, 4, 5, 6], [5, 6, 7, 8, 9]]
    w = np.array(report["graph"]["W"])
    assert (np.diag(w) >= 0.4).all(), w
    ends = (w[0, 2], w[2, 0])
    if similarity == "update-cosine":  # each end's only neighbour is the middle node
        assert w[0, 1] > 0.5 and w[2, 1] > 0.5 and ends == (0.0, 0.0), w
    else:
        assert min(ends) > 0.5 and w[1, 1] > 0.9, w
    assert report["accuracy"]["mean"] >= 0.9
