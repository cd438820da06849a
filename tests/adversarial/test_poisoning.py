"""A Byzantine learning peer (issue #14, item 7): what the poisoning node sends, and that MAPL's
and SCooL-attention's graphs shut it out, small simulations on digits against a control twin."""

import numpy as np
import pytest

from algorithms.payloads import check_scale
from algorithms.poison import Attack, corrupt, corrupt_tensor
from algorithms.seam import PayloadRejected
from protocol.messages import Head, Model, Prototypes, Score
from testnet.simulator import SimulationSpec, run_simulation


def _rng():
    return np.random.default_rng(1)


def _model():
    rng = np.random.default_rng(0)
    return Model(
        kind="params",
        tensors={
            "w": rng.standard_normal((3, 4)).astype(np.float32),
            "half": rng.standard_normal(5).astype(np.float16),
            "steps": np.array([7], dtype=np.int64),
        },
        update={"w": rng.standard_normal((3, 4)).astype(np.float32)},
    )


@pytest.mark.parametrize("kind", ["scale", "sign-flip", "random"])
def test_each_attack_poisons_every_tensor_and_keeps_shapes_dtypes_finite(kind):
    honest = _model()
    poisoned = corrupt(honest, Attack(kind, factor=100.0), _rng())
    for field in ("tensors", "update"):
        for name, before in getattr(honest, field).items():
            after = getattr(poisoned, field)[name]
            assert after.shape == before.shape and after.dtype == before.dtype, name
            assert np.isfinite(after).all()
            if before.dtype.kind != "f":
                np.testing.assert_array_equal(after, before)  # counts are not poisoned
                continue
            wide, was = after.astype(np.float64), before.astype(np.float64)
            expected = {"scale": 100 * was, "sign-flip": -was}.get(kind)
            if expected is not None:
                np.testing.assert_allclose(wide, expected, rtol=1e-3)
            else:  # random: the honest norm, none of the honest direction left
                assert np.linalg.norm(wide) == pytest.approx(np.linalg.norm(was), rel=1e-3)
                assert not np.allclose(wide, was)


def test_prototypes_and_the_head_with_them_are_poisoned_scores_are_not():
    prototypes = Prototypes(
        classes=(0, 1), counts=(3, 4), prototypes=np.ones((2, 4), np.float32), head=np.ones((2, 4), np.float32)
    )
    flipped = corrupt(prototypes, Attack("sign-flip"), _rng())
    assert (flipped.prototypes == -1).all() and (flipped.head == -1).all() and flipped.counts == (3, 4)
    head = corrupt(Head(weight=np.ones((2, 4), np.float32), bias=np.ones(2, np.float32)), Attack("scale", 10), _rng())
    assert (head.weight == 10).all() and (head.bias == 10).all()
    score = Score(kind="log_likelihood", subject=bytes(32), subject_seq=1, value=-3.0, samples=4)
    assert corrupt(score, Attack("random"), _rng()) is score
    assert corrupt(prototypes, Attack("none"), _rng()) == prototypes


def test_a_scaled_float16_tensor_that_overflows_goes_as_float32_and_attacks_are_checked():
    scaled = corrupt_tensor(np.full(3, 1000.0, np.float16), Attack("scale", 1000.0), _rng())
    assert scaled.dtype == np.float32 and np.isfinite(scaled).all() and scaled[0] == 1e6
    with pytest.raises(ValueError, match="unknown attack"):
        Attack("label-flip")
    with pytest.raises(ValueError, match="non-zero"):
        Attack("scale", 0.0)


def test_a_tensor_off_our_scale_is_refused_either_way():
    ours = np.ones(4)
    check_scale("head", 3.9 * ours, ours, 4.0)
    check_scale("head", ours / 3.9, ours, 4.0)
    for theirs in (4.1 * ours, ours / 4.1):
        with pytest.raises(PayloadRejected) as caught:
            check_scale("head", theirs, ours, 4.0)
        assert caught.value.reason == "out_of_scale"
    check_scale("head", 1e9 * ours, ours, float("inf"))


def _spec(algorithm, **changes):
    overrides = {"warmup_rounds": "4"} if algorithm == "mapl" else {"prune_round": "6"}
    base = {
        "algorithm": algorithm,
        "dataset": "digits",
        "nodes": 6,
        "rounds": 10,
        "samples_per_class": 20 if algorithm == "mapl" else 10,
        "test_per_class": 10,
        "overrides": overrides,
        "poisoners": (1,),  # cluster 0 is nodes 0–2: two honest nodes share its classes
        "attack": "none",
    }
    extra = changes.pop("overrides", {})
    return SimulationSpec(**{**base, **changes, "overrides": {**overrides, **extra}})


def test_the_control_twin_is_the_plain_run_and_a_frame_past_the_wire_bound_is_refused():
    plain = run_simulation(_spec("mapl", rounds=5, poisoners=()))
    twin = run_simulation(_spec("mapl", rounds=5))
    assert twin["accuracy"]["per_node"] == plain["accuracy"]["per_node"]
    assert twin["graph"]["W"] == plain["graph"]["W"]
    assert plain["poisoning"] is None and twin["poisoning"]["honest"] == [0, 2, 3, 4, 5]
    # Scaled past max_tensor_norm (1e6): the honest decoders refuse every frame the poisoner sends.
    huge = run_simulation(_spec("mapl", rounds=2, attack="scale", attack_factor=1e8))
    assert huge["rejections"] == {"bad_tensor": 2 * 5}


@pytest.mark.parametrize(
    "algorithm, attack, defence_off",
    [
        # Head similarity cannot see scale: only the norm bound shuts a scaled head out.
        ("mapl", "scale", {"max_norm_ratio": "inf"}),
        # The poisoner scores honestly, so SCooL's E-step alone trusts it: only the check of its
        # model on our own data shuts it out.
        ("scool-attention", "sign-flip", {"max_score_gap": "inf"}),
    ],
)
def test_the_poisoner_loses_its_weight_and_the_honest_nodes_keep_their_accuracy(algorithm, attack, defence_off):
    """6 nodes on digits, node 1 poisons. Against the control twin (node 1 honest): after MAPL's
    warm-up (SCooL: from the start) its weight in every honest row is ≤ 0.02, and the honest mean
    accuracy stays within 2 points; with the defence switched off it keeps a real weight."""
    twin = run_simulation(_spec(algorithm))["poisoning"]
    poisoned = run_simulation(_spec(algorithm, attack=attack))["poisoning"]
    learned = slice(4, None) if algorithm == "mapl" else slice(None)
    assert max(twin["poisoner_weight"]["max_per_round"][learned]) > 0.1  # an honest node 1 is a neighbour
    assert max(poisoned["poisoner_weight"]["max_per_round"][learned]) <= 0.02
    assert poisoned["honest_accuracy"]["mean"] >= twin["honest_accuracy"]["mean"] - 0.02
    undefended = run_simulation(_spec(algorithm, attack=attack, overrides=defence_off))["poisoning"]
    assert max(undefended["poisoner_weight"]["max_per_round"][learned]) > 0.1
