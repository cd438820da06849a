"""A node chooses the predictor it serves on training images it held out (issue #44: never worse
off for joining): the cut, the choice, and MAPL-Auto serving what it chose."""

import dataclasses

import pytest
import torch

from algorithms.data.datasets import load_dataset
from algorithms.data.partitions import PartitionSpec, make_partition
from algorithms.data.setup import node_data
from algorithms.interface import LocalData, NodeSetup
from algorithms.methods.auto import AUTO_PREDICTORS
from algorithms.methods.mapl import Local
from algorithms.models.inference import EvaluatedModel
from algorithms.models.selection import Choice, Chooser, hold_out, sign_test_p
from algorithms.registry import apply_overrides, default_config, make_algorithm


@pytest.fixture(scope="module")
def digits():
    dataset = load_dataset("digits")
    partition = make_partition(dataset, PartitionSpec(scenario="1", nodes=2, samples_per_class=10, test_per_class=5))
    return [node_data(dataset, partition, index, pooled=False) for index in range(2)]


def _rows(images: torch.Tensor) -> set[bytes]:
    return {image.numpy().tobytes() for image in images}


def test_hold_out_cuts_each_class_and_keeps_every_class_training(digits):
    data = digits[0]
    held = hold_out(data, 0.2, seed=3)
    counts, fit_counts = data.class_counts, held.fit.class_counts
    for k, n in enumerate(counts):
        assert n - fit_counts[k] == (min(n - 1, max(1, round(n * 0.2))) if n >= 2 else 0)
    # Disjoint, and together the whole shard; the test split is not touched.
    assert not _rows(held.images) & _rows(held.fit.train_images)
    assert len(held) + len(held.fit.train_labels) == len(data.train_labels)
    assert held.fit.test_images is data.test_images
    # The node's seed draws it: the same seed, the same cut.
    assert torch.equal(hold_out(data, 0.2, seed=3).labels, held.labels)
    assert _rows(hold_out(data, 0.2, seed=4).images) != _rows(held.images)
    assert hold_out(data, 0.0, seed=3) is None


def test_a_class_with_one_image_is_never_held_out():
    images = torch.rand(5, 1, 8, 8)
    data = LocalData(images, torch.tensor([0, 1, 1, 1, 1]), images[:1], torch.tensor([0]), num_classes=2)
    held = hold_out(data, 0.5, seed=0)
    assert held.labels.tolist() == [1, 1] and held.fit.class_counts.tolist() == [1, 2]
    lonely = LocalData(images[:2], torch.tensor([0, 1]), images[:1], torch.tensor([0]), num_classes=2)
    assert hold_out(lonely, 0.5, seed=0) is None
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        hold_out(data, 1.0, seed=0)


def _right(count: int, images: int = 20) -> list[bool]:
    return [True] * count + [False] * (images - count)


def test_the_local_model_is_served_only_where_it_is_clearly_and_significantly_better():
    chooser = Chooser(window=3, margin=0.1)
    # Right on 6 of the 20 images the network's predictor gets wrong, wrong on none it gets
    # right: 30 points, p = 1/64. Local.
    assert chooser.update({"personal": _right(14), "local": _right(20)}, "personal", ("local",)).chosen == "local"
    # Three rounds level: the window's mean is 2 images ahead (p = 1/4), the network's again.
    for _ in range(2):
        choice = chooser.update({"personal": _right(20), "local": _right(20)}, "personal", ("local",))
    assert choice.chosen == "personal" and choice.accuracy == pytest.approx({"personal": 0.9, "local": 1.0})
    assert choice.images == 20 and choice.rounds == 3
    restored = Chooser(window=3, margin=0.1)
    restored.load_state_dict(chooser.state_dict())
    last = {"personal": _right(0), "local": _right(20)}
    assert restored.update(last, "personal", ("local",)) == chooser.update(last, "personal", ("local",))
    restored.load_state_dict([{"personal": 0.5, "local": 0.9}])  # a checkpoint of before: forgotten
    assert not restored.scores
    with pytest.raises(ValueError, match="window"):
        Chooser(window=0, margin=0.1)


def test_a_margin_the_held_out_draw_can_give_does_not_switch():
    """Ten points more of 20 images, each predictor right on some the other is wrong on: within
    what the draw of the held-out images gives (p = 0.17), so the network's predictor stays; the
    same lead on 100 images switches (p < 0.001)."""
    collaborative = [True] * 14 + [False] * 6  # 70 %
    local = [False] * 2 + [True] * 16 + [False] * 2  # 80 %: 4 images it alone gets right, 2 it alone gets wrong
    assert (
        Chooser(window=1, margin=0.1).update({"personal": collaborative, "local": local}, "personal", ("local",)).chosen
        == "personal"
    )
    assert sign_test_p(4, 2) == pytest.approx(22 / 64)
    many = Chooser(window=1, margin=0.1).update(
        {"personal": _right(70, 100), "local": _right(80, 100)}, "personal", ("local",)
    )
    assert many.chosen == "local" and sign_test_p(10, 0) < 0.001


def test_of_several_predictors_clearly_better_the_best_is_served():
    """An own model that learns too slowly (the small shared model far ahead of it): served
    what the held-out images show, not the local model merely because it is the alternative."""
    scores = {"personal": _right(6, 30), "ensemble": _right(18, 30), "shared": _right(27, 30), "local": _right(9, 30)}
    assert Chooser(window=2, margin=0.1).update(scores, "personal", tuple(scores)).chosen == "shared"
    level = {"personal": _right(27, 30), "ensemble": _right(28, 30), "shared": _right(28, 30), "local": _right(27, 30)}
    assert (
        Chooser(window=2, margin=0.1).update(level, "personal", tuple(level)).chosen == "personal"
    )  # none clearly better


def _auto(data: LocalData, **settings: str):
    config = apply_overrides(default_config("mapl-auto"), settings)
    return make_algorithm("mapl-auto", NodeSetup(node_id="n0", data=data, backbone="convnet", seed=5), config)


def test_mapl_auto_trains_nothing_on_what_it_holds_out_until_it_has_chosen(digits):
    node = _auto(digits[0], refit_round="2", validation_fraction="0.2")
    held = node.held_out
    fit_rows = _rows(held.fit.train_images)
    assert _rows(node.trainer.images) == fit_rows and _rows(node.local.trainer.images) == fit_rows
    assert node.setup.data is digits[0]  # preprocessing and `local_baseline` see the whole shard
    # The local model is the Local algorithm on the same cut: the same weights after two rounds.
    alone = Local(dataclasses.replace(node.setup, data=held.fit), node.config)
    for round in range(2):
        node.local_step(round)
        alone.local_step(round)
        node.end_round(round)
    alone.evaluate()  # its BatchNorm statistics recomputed, as the node's were when it chose
    for name, tensor in alone.model.state_dict().items():
        torch.testing.assert_close(node.local.model.state_dict()[name], tensor)
    chosen = node.choice
    assert chosen is not None and chosen.rounds == 2
    # From refit_round on every model trains on the whole shard, and the choice stays.
    node.local_step(2)
    whole = _rows(digits[0].train_images)
    assert _rows(node.trainer.images) == whole and _rows(node.local.trainer.images) == whole
    node.end_round(2)
    assert node.choice == chosen
    # A node resumed after the refit trains on the whole shard from its first round.
    resumed = _auto(digits[0], refit_round="2", validation_fraction="0.2")
    resumed.load_state_dict(node.state_dict())
    resumed.local_step(3)
    assert _rows(resumed.trainer.images) == whole and resumed.choice == chosen


def test_a_node_whose_collaborative_models_are_useless_serves_what_scores_best_held_out(digits):
    node = _auto(digits[0], validation_fraction="0.2")
    for round in range(8):
        node.local.local_step(round)  # only the local model learns
    with torch.no_grad():  # the collaborative models say nothing
        node.model.head.weight.zero_()
        node.model.head.bias.zero_()
        node.small.head.weight.zero_()
        node.small.head.bias.zero_()
    node.end_round(0)  # alone: nothing to mix; the choice is made
    choice = node.choice
    assert set(choice.accuracy) == set(AUTO_PREDICTORS)
    assert choice.chosen == "local" and choice.accuracy["local"] >= choice.accuracy["ensemble"] + 0.1
    evaluation = node.evaluate()
    assert evaluation.predictor == "local" and evaluation.accuracy == evaluation.by_predictor["local"]
    assert evaluation.validation == choice.accuracy and evaluation.validation_total == len(node.held_out)
    # What it chose and the local model survive a checkpoint.
    restored = _auto(digits[0], validation_fraction="0.2")
    restored.load_state_dict(node.state_dict())
    assert restored.choice == choice and restored.predictors().chosen == "local"
    # A node that holds nothing out chose on other images: its window starts afresh.
    other = _auto(digits[0])
    other.load_state_dict(node.state_dict())
    assert other.choice is None and not other.chooser.scores
    torch.testing.assert_close(restored.local.model.head.weight, node.local.model.head.weight)


def test_without_held_out_images_or_keep_local_there_is_no_local_model_to_serve(digits):
    node = _auto(digits[0], keep_local="false")  # nothing held out (the default), no local model kept
    assert node.held_out is None and node.local is None
    assert "local" not in node.predictors().all(digits[0].test_images[:2])
    with pytest.raises(ValueError, match="needs the local model"):
        apply_overrides(default_config("mapl-auto"), {"keep_local": "false", "predict": "local"})
    assert "local" in _auto(digits[0]).predictors().all(digits[0].test_images[:2])  # kept by default


def test_a_node_holding_nothing_out_serves_another_predictor_where_its_own_cannot_fit_its_images(digits):
    """An own model that learns too slowly (here: it says nothing) in a one-model fleet, where
    the own model is the collaborative predictor (no local-only model kept beside it, which would
    outvote it): the small model fits the node's training images far better, so that is served,
    and the report says why. Where the own model fits them, it stays."""
    node = _auto(digits[0], keep_local="false")
    assert node.checked.labels.numel() == min(200, len(digits[0].train_labels))
    for round in range(8):
        node.local_step(round)
    node.same_model = {"n1": (0, True)}  # every peer runs its model
    node.end_round(0)
    assert node.choice.chosen == "personal"  # it fits its images: nothing replaces it
    with torch.no_grad():
        node.model.head.weight.zero_()
        node.model.head.bias.zero_()
    node.end_round(1)
    # The small model, or its ensemble with the silent own model (the same votes).
    chosen = node.choice.chosen
    assert chosen != "personal" and node.choice.accuracy[chosen] >= node.choice.accuracy["personal"] + 0.2
    evaluation = node.evaluate()
    assert evaluation.predictor == chosen and not evaluation.validation  # training images are no held-out score
    assert evaluation.why.startswith("fits ") and "training images, personal" in evaluation.why
    restored = _auto(digits[0], keep_local="false")
    restored.load_state_dict(node.state_dict())
    assert restored.choice == node.choice


def test_the_kept_model_serves_the_predictor_chosen_when_it_was_kept(digits):
    node = _auto(digits[0], validation_fraction="0.2")
    kept = EvaluatedModel()
    first = node.predictors()
    kept.keep(first, 0)
    node.choice = Choice(chosen="local")
    kept.keep(node.predictors(), 1)
    round, predictors = kept.latest()
    assert round == 1 and predictors.chosen == "local" and first.chosen != "local"


def test_status_and_the_report_say_what_a_node_serves_and_why():
    from p2pnode.learning.rounds import served_because
    from p2pnode.operations.status import _learning_lines

    held_out = {"personal": 0.72, "local": 0.9, "ensemble": 0.8, "shared": 0.6, "personal_local": 0.85}
    assert served_because("local", held_out, 10) == "local (held-out 90 %, ensemble 80 %; 10 images)"
    assert served_because("personal", held_out, 10) == "personal (held-out 72 %, local 90 %; 10 images)"
    assert served_because("ensemble", {}, 0) == "ensemble"  # nothing held out: no reason to give
    # what its peers run, where that decided it (MAPL-Auto's `why`), then the held-out images
    mixed = "mixed with 2 same-model peers"
    because = served_because("personal", held_out, 10, mixed)
    assert because == f"personal ({mixed}; held-out 72 %, local 90 %; 10 images)"
    assert served_because("personal", {}, 0, mixed) == f"personal ({mixed})"
    record = {"predictor": "local", "validation_by_predictor": held_out, "validation_samples": 10}
    learning = {
        "accuracy": 0.9,
        "history": [record],
        "algorithm": "mapl-auto",
        "phase": "gather",
        "completed": 3,
        "rounds": 40,
        "resumed_from": None,
        "catch_ups": 0,
        "neighbours": {},
        "missing_payloads": {},
    }
    (line,) = _learning_lines(learning, "n0")
    assert "predicting with: local (held-out 90 %, ensemble 80 %; 10 images)" in line
    learning["history"] = [{"predictor": "personal", "predictor_why": mixed}]  # nothing held out
    (line,) = _learning_lines(learning, "n0")
    assert f"predicting with: personal ({mixed})" in line


def test_a_predictor_the_node_no_longer_holds_is_never_chosen():
    """MAPL-Auto's local model leaves the predictors once it stops training; the rounds that
    scored it are still in the window, and it was clearly better there, yet it is not chosen."""
    chooser = Chooser(window=5, margin=0.1)
    for _ in range(3):
        chooser.update({"personal": [False] * 20, "local": [True] * 20}, "personal", ("local",))
    assert chooser.update({"personal": [False] * 20, "local": [True] * 20}, "personal", ("local",)).chosen == "local"
    choice = chooser.update({"personal": [False] * 20}, "personal", ("local",))
    assert choice.chosen == "personal" and "local" not in choice.accuracy
