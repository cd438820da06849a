"""MAPL-Auto: the own backbone travels to, and is mixed with, only the peers that announced the
same model; everything else is MAPL-Dual's."""

import numpy as np
import pytest
import torch

from algorithms.data.datasets import load_dataset
from algorithms.data.partitions import PartitionSpec, make_partition
from algorithms.data.setup import node_data
from algorithms.interface import NodeSetup, PayloadRejected
from algorithms.methods.auto import ARCH_KEY, OWN_PREFIX, AutoPredictors, split_model
from algorithms.models.inference import EvaluatedModel
from algorithms.models.losses import ensemble_logits
from algorithms.registry import apply_overrides, default_config, make_algorithm
from protocol.messages import MessageType, Model


@pytest.fixture(scope="module")
def digits():
    dataset = load_dataset("digits")
    return dataset, make_partition(
        dataset, PartitionSpec(scenario="1", nodes=3, samples_per_class=10, test_per_class=5)
    )


def _nodes(digits, backbones, **settings):
    dataset, partition = digits
    nodes = []
    config = apply_overrides(default_config("mapl-auto"), settings)
    for index, backbone in enumerate(backbones):
        data = node_data(dataset, partition, index, pooled=False)
        setup = NodeSetup(node_id=f"n{index}", data=data, backbone=backbone, seed=index)
        node = make_algorithm("mapl-auto", setup, config)
        node.set_peers([f"n{i}" for i in range(len(backbones)) if i != index])
        nodes.append(node)
    return nodes


def dataset_images(digits) -> torch.Tensor:
    dataset, partition = digits
    return node_data(dataset, partition, 0, pooled=False).test_images[:2]


def _models(outbound) -> dict[str, Model]:
    """Recipient → the MODEL it gets."""
    return {peer: each.body for each in outbound if isinstance(each.body, Model) for peer in each.to}


def _exchange(nodes, round: int) -> None:
    """A local step each (untrained, their prototypes are alike: copies), then all they publish."""
    for node in nodes:
        node.local_step(round)
    outbound = {node.node_id: node.publish(round) for node in nodes}
    by_id = {node.node_id: node for node in nodes}
    for sender, messages in outbound.items():
        for message in messages:
            for peer in set(message.to) & by_id.keys():
                by_id[peer].receive(sender, round, message.body)


def test_the_own_backbone_goes_only_to_peers_that_announced_the_same_model(digits):
    same, also_same, other = _nodes(digits, ["convnet", "convnet", "mlp"])
    # Round 0: nobody is known, everybody gets the small model and the architecture; even where a
    # peer's MODEL of round 0 came before the node published (a daemon delivers what came during
    # its local step), as the simulator, where none comes first, sends.
    also_same.local_step(0)
    same.receive("n1", 0, _models(also_same.publish(0))["n0"])
    first = _models(same.publish(0))
    assert set(first) == {"n1", "n2"}
    assert all(ARCH_KEY in body.tensors and not split_model(body)[2] for body in first.values())
    _exchange([same, also_same, other], 0)
    assert same.same_model == {"n1": (0, True), "n2": (0, False)}
    later = _models(same.publish(1))
    own = split_model(later["n1"])[2]
    assert own.keys() == same.own.state().keys() and not split_model(later["n2"])[2]
    # The mlp node refuses a convnet's own modules; the other convnet takes them.
    with pytest.raises(PayloadRejected, match="another architecture"):
        other.inspect("n0", 1, later["n1"])
    also_same.inspect("n0", 1, later["n1"])


def test_the_own_backbone_travels_as_float16_by_default_as_the_small_model_does(digits):
    same, also_same = _nodes(digits, ["convnet", "convnet"])
    _exchange([same, also_same], 0)
    small, arch, own = split_model(_models(same.publish(1))["n1"])
    assert own and all(array.dtype == np.float16 for array in own.values())
    assert all(array.dtype == np.float16 for array in small.values()) and arch.dtype == np.uint8
    also_same.inspect("n0", 1, _models(same.publish(1))["n1"])  # a float16 own model is taken


def test_the_own_backbone_is_shared_equally_by_the_same_model_peers_and_then_predicts(digits):
    # Nothing held out: the predictor follows the mixing (test_selection.py: chosen on held-out images).
    nodes = _nodes(digits, ["convnet", "convnet", "mlp"], validation_fraction="0", own_uniform_share="1")
    _exchange(nodes, 0)  # they learn who runs what
    a = nodes[0]
    assert a.predictors().chosen == "ensemble_local"  # nothing of its own model mixed yet
    _exchange(nodes, 1)
    before = {name: tensor.clone() for name, tensor in a.own.state().items()}
    sent = split_model(a.view.fresh(MessageType.MODEL, 1)["n1"])[2]
    small_before = {name: tensor.clone() for name, tensor in a.share.mixed.state().items()}
    a.end_round(1)
    # Half its own, half n1's; nothing of the mlp node's (the BatchNorm statistics are then
    # recomputed for the mix: test_models.py).
    for name, tensor in a.own.parameters(a.own.state()).items():
        torch.testing.assert_close(tensor, (before[name] + torch.tensor(sent[name])) / 2, rtol=1e-5, atol=1e-6)
    # The small model is mixed over all three, as in MAPL-Dual.
    assert any(not torch.equal(small_before[n], t) for n, t in a.share.mixed.state().items())
    # The fleet mixes models: the ensemble with the local-only model, the own model mixed with its
    # same-model peer's inside.
    # (What it serves may still be another predictor, that fits 20 points more of its images.)
    assert a.mixes_own and a._collaborative() == nodes[2]._collaborative() == "ensemble_local"
    restored = _nodes(digits, ["convnet", "convnet", "mlp"], validation_fraction="0", own_uniform_share="1")[0]
    restored.load_state_dict(a.state_dict())
    assert restored.mixes_own and restored.same_model == {"n1": (0, True), "n2": (0, False)}
    # A checkpoint written before the round of the verdict was kept:
    restored.load_state_dict({**a.state_dict(), "same_model": {"n1": True, "n2": False}})
    assert restored.same_model == {"n1": (-1, True), "n2": (-1, False)}


def test_a_forged_architecture_or_own_modules_of_the_wrong_shape_are_refused(digits):
    a, b, _ = _nodes(digits, ["convnet", "convnet", "mlp"])
    _exchange([a, b], 0)
    body = _models(b.publish(1))["n0"]
    bad_arch = Model(kind="params", tensors={**body.tensors, ARCH_KEY: np.zeros(3, np.uint8)})
    with pytest.raises(PayloadRejected, match="16 bytes"):
        a.inspect("n1", 1, bad_arch)
    name = next(n for n in body.tensors if n.startswith(OWN_PREFIX))
    cut = Model(kind="params", tensors={**body.tensors, name: body.tensors[name][:1]})
    with pytest.raises(PayloadRejected, match="expected"):
        a.inspect("n1", 1, cut)


def test_a_distrusted_peer_gets_no_share_of_the_backbone(digits):
    """Equal shares are not the learned row: a peer refused for any part (here its prototypes)
    is left out of them, as the learned row leaves it out."""
    nodes = _nodes(digits, ["convnet", "convnet", "mlp"], own_uniform_share="1")
    _exchange(nodes, 0)
    a = nodes[0]
    _exchange(nodes, 1)
    before = {name: tensor.clone() for name, tensor in a.own.state().items()}
    a.guard.refuse("n1", "prototypes")
    a.end_round(1)
    for name, tensor in a.own.parameters(a.own.state()).items():
        torch.testing.assert_close(tensor, before[name])
    assert not a.mixes_own


def test_the_small_model_teaches_an_own_model_shared_with_same_model_peers_only_where_it_is_better(digits):
    """A node whose own model is mixed with same-model peers (MAPL+'s regime) is taught by the small
    model only on the samples where that is better on the label; one alone with its backbone
    (MAPL-Dual's) on every sample; a `distill_where` set explicitly holds either way."""
    nodes = _nodes(digits, ["convnet", "convnet", "mlp"], warmup_rounds="0")
    for round in (0, 1):
        _exchange(nodes, round)
        for node in nodes:
            node.end_round(round)
    convnet, _, mlp = nodes
    assert convnet.mixes_own and not mlp.mixes_own
    assert (convnet.distill_where(), mlp.distill_where()) == ("teacher_better", "all")
    everywhere = _nodes(digits, ["convnet", "convnet", "mlp"], distill_where="all")[0]
    everywhere.mixes_own = True
    assert everywhere.distill_where() == "all"


@pytest.mark.parametrize("keep_local", ["true", "false"])
def test_in_a_one_model_fleet_a_node_serves_its_own_model_even_where_it_mixes_it_with_nobody(digits, keep_local):
    """Round 0 sends no own modules, so after it no node mixes its own model; where every peer
    announced the node's model it serves that model, where one runs another the ensemble, and
    the ensemble still once it mixes its own model with its same-model peer's; each with its
    local-only model where it keeps one."""
    suffix = "_local" if keep_local == "true" else ""
    because = "; with its local-only model" if suffix else ""
    for backbones, served in ((["convnet"] * 3, "personal"), (["convnet", "convnet", "mlp"], "ensemble")):
        nodes = _nodes(digits, backbones, keep_local=keep_local)
        first = nodes[0]
        assert first.predictors().chosen == f"ensemble{suffix}"  # nobody heard from yet
        _exchange(nodes, 0)
        first.end_round(0)
        assert not first.mixes_own and first.one_model_fleet() == (served == "personal")
        assert first.predictors().chosen == served + suffix, backbones
        why = "every peer runs its model" if served == "personal" else "no same-model peer shares its model"
        assert first.evaluate().why.startswith(why) and because in first.evaluate().why
        _exchange(nodes, 1)  # now the same-model peers send their own modules
        first.end_round(1)
        assert first.predictors().chosen == served + suffix and first.mixes_own
        peers = len(backbones) - 1 if served == "personal" else 1
        mixed = f"mixed with {peers} same-model peer{'s' if peers > 1 else ''}"
        mixed = mixed if served == "personal" else f"{mixed}, with the small model: the fleet mixes models"
        votes = "" if served + suffix == "personal" else "; votes own "  # what mixes models says their votes
        assert first.evaluate().why.startswith(f"{mixed}{because}{votes}")


def test_every_node_keeps_a_local_only_model_and_one_alone_in_its_cluster_says_so(digits):
    """Node n2 holds classes neither other node holds: its learned row keeps all but 1 % on
    itself. Every node trains a local-only model exactly as the `local` baseline trains and
    serves it beside its own model (one model everywhere) or beside its own and small models
    (a fleet that mixes models); the lone node's report says that nobody else helps it."""
    nodes = _nodes(digits, ["convnet"] * 3, warmup_rounds="2")
    for round in range(4):
        _exchange(nodes, round)
        for node in nodes:
            node.end_round(round)
    mixing, alone = nodes[:2], nodes[2]
    assert alone.alone and alone.predictors().chosen == "personal_local"
    assert alone.evaluate().why == (
        "collaborates with nobody: its learned row keeps 99 % on itself; with its local-only model; "
        "votes own 1.0, local-only 1.0"  # nobody else's images behind its own model: an equal say
    )
    dataset, partition = digits
    setup = NodeSetup(node_id="n2", data=node_data(dataset, partition, 2, pooled=False), backbone="convnet", seed=2)
    baseline = make_algorithm("local", setup)
    for round in range(4):
        baseline.local_step(round)
    baseline.evaluate()  # its BatchNorm statistics recomputed, as the node's were (statistics.py)
    theirs = baseline.model.state_dict()
    for name, mine in alone.local.model.state_dict().items():
        assert torch.equal(mine, theirs[name]), name  # what Local gives, to the bit
    for node in mixing:
        assert node.alone is False and node.predictors().chosen == "personal_local"
        own, small, local = node.votes()
        assert 1.5 < own <= 2 and small == pytest.approx(own) and local == 1  # two nodes' images behind it
        assert (
            node.evaluate().why
            == f"mixed with 1 same-model peer; with its local-only model; votes own {own:.1f}, local-only 1.0"
        )
        before = [p.clone() for p in node.local.model.parameters()]
        node.local_step(4)
        assert not all(torch.equal(a, b) for a, b in zip(before, node.local.model.parameters(), strict=True))
    mixed = _nodes(digits, ["convnet", "convnet", "mlp"], warmup_rounds="2")
    for round in range(4):
        _exchange(mixed, round)
        for node in mixed:
            node.end_round(round)
    *pair, lone = mixed
    assert all(node.alone is False and node.predictors().chosen == "ensemble_local" for node in pair)
    assert lone.alone and lone.predictors().chosen == "ensemble_local"
    assert set(lone.predictors().all(dataset_images(digits))) >= {"ensemble_local", "local", "ensemble"}
    assert lone.evaluate().why == (
        "collaborates with nobody: its learned row keeps 99 % on itself; with its local-only model; "
        "votes own 1.0, small 1.0, local-only 1.0"
    )


def test_a_mix_weighs_each_model_by_its_votes_and_a_copy_of_the_predictors_keeps_the_round_s_votes(digits):
    """Equal votes give the plain mean of the members' probabilities; a member with all the say
    decides alone; and what `predict` and `export` serve (a copy of the evaluated predictors'
    state, inference.EvaluatedModel; the exported program) weighs as the node did in the round
    it copies."""
    node = _nodes(digits, ["convnet", "convnet", "mlp"])[0]
    images = dataset_images(digits)
    equal = AutoPredictors(node.model, node.small, node.local.model, "ensemble_local")
    outputs = equal.all(images)
    plain = ensemble_logits(outputs["personal"], outputs["shared"], outputs["local"])
    assert torch.allclose(outputs["ensemble_local"], plain, atol=1e-6)
    leaning = AutoPredictors(node.model, node.small, node.local.model, "ensemble_local", (1.0, 1e9, 1.0))
    assert torch.equal(leaning.all(images)["ensemble_local"].argmax(1), outputs["shared"].argmax(1))
    evaluated = EvaluatedModel()
    evaluated.keep(equal, 0)
    evaluated.keep(leaning, 1)
    round, served = evaluated.latest()
    assert round == 1 and served.votes.tolist() == [1.0, 1e9, 1.0]
    with torch.no_grad():  # the copy runs in evaluation mode
        assert torch.equal(served(images).argmax(1), served.all(images)["shared"].argmax(1))
        exported = torch.export.export(served, (images[:2],), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
        assert torch.allclose(exported.module()(images), served(images))  # what `export` writes weighs alike
