"""Simplex projection, the CGL loss and gradient, head similarity and the graph metrics."""

import itertools

import numpy as np
import pytest

from algorithms.graphs.graph import (
    GraphConfig,
    GraphOptimizer,
    cgl_gradient,
    cgl_loss,
    head_similarity,
    l1_to_truth,
    normalise_similarities,
    within_cluster_mass,
)
from algorithms.graphs.simplex import project_to_simplex

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it


def brute_force_projection(v: np.ndarray) -> np.ndarray:
    """The QP min ‖w − v‖² on the simplex, by trying every support set: on a support S the
    solution is v_S − (Σ v_S − 1)/|S|; the best feasible candidate is the projection."""
    best, best_distance = None, np.inf
    for size in range(1, len(v) + 1):
        for support in itertools.combinations(range(len(v)), size):
            w = np.zeros_like(v)
            idx = list(support)
            w[idx] = v[idx] - (v[idx].sum() - 1) / size
            if w.min() < -1e-12:
                continue
            distance = np.sum((w - v) ** 2)
            if distance < best_distance - 1e-12:
                best, best_distance = w, distance
    return best


def vectors():
    rng = np.random.default_rng(7)
    for n in range(1, 8):
        for _ in range(25):
            yield rng.normal(size=n) * rng.choice([0.01, 1, 10])
    yield np.array([0.3, 0.3, 0.3, 0.3])  # ties
    yield np.array([2.0, 2.0, -1.0])
    yield np.array([-5.0, -5.0, -5.0])  # all negative
    yield np.array([1e-3, 0.0, 0.0])
    yield np.array([0.2, 0.3, 0.5])  # already on the simplex


@pytest.mark.parametrize("v", list(vectors()), ids=lambda v: f"n{len(v)}")
def test_simplex_projection_matches_brute_force_qp(v):
    w = project_to_simplex(v)
    assert w.min() >= 0 and w.sum() == pytest.approx(1, abs=1e-12)
    np.testing.assert_allclose(w, brute_force_projection(v), atol=1e-9)


def test_simplex_projection_of_huge_values_does_not_overflow():
    w = project_to_simplex(np.array([1e300, 1e300, -1e300, 5.0]))
    np.testing.assert_allclose(w, [0.5, 0.5, 0, 0])
    w = project_to_simplex(np.array([1e15 + 0.5, 1e15, 1e15]))
    assert w.sum() == pytest.approx(1) and w[0] > w[1]


def test_simplex_projection_shift_invariance_and_bad_input():
    v = np.array([0.1, 0.7, -0.2, 0.4])
    np.testing.assert_allclose(project_to_simplex(v), project_to_simplex(v + 123.0), atol=1e-12)
    for bad in (np.array([]), np.array([np.nan, 1.0]), np.array([np.inf]), np.ones((2, 2))):
        with pytest.raises(ValueError):
            project_to_simplex(bad)


def test_cgl_loss_on_a_hand_computed_case():
    cfg = GraphConfig(mu_similarity=0.5, mu_regulariser=0.1, l2_weight=2.0, epsilon=1e-6)
    w = np.array([0.5, 0.5])
    s = np.array([1.0, 0.2])
    g = np.array([0.25, 0.75])
    # 0.5·(−(0.25·1·0.5 + 0.75·0.2·0.5)) + 0.1·(2·√0.5 − log(0.5 + 1e-6))
    expected = 0.5 * -(0.125 + 0.075) + 0.1 * (2 * np.sqrt(0.5) - np.log(0.5 + 1e-6))
    assert cgl_loss(w, s, g, 0, cfg) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("self_in_degree", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_cgl_gradient_matches_finite_differences(seed, self_in_degree):
    rng = np.random.default_rng(seed)
    n = 6
    cfg = GraphConfig(l2_weight=rng.uniform(0.1, 3), mu_similarity=rng.uniform(0.1, 2))
    w = rng.dirichlet(np.ones(n))
    s = rng.uniform(-1, 1, n)
    g = rng.dirichlet(np.ones(n))
    self_index = int(rng.integers(n))
    analytic = cgl_gradient(w, s, g, self_index, cfg, self_in_degree)

    def loss(at):
        return cgl_loss(at, s, g, self_index, cfg, self_in_degree)

    h = 1e-6
    numeric = np.array([(loss(w + h * e) - loss(w - h * e)) / (2 * h) for e in np.eye(n)])
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)
    # The −log(deg) term has a gradient on every peer, and on the node itself only when it
    # counts in the degree (it stands in for a peer it refused).
    degree_term = -cfg.mu_regulariser / (w.sum() + cfg.epsilon) if self_in_degree else 0.0
    assert analytic[self_index] == pytest.approx(
        cfg.mu_similarity * g[self_index] * -s[self_index]
        + cfg.mu_regulariser * cfg.l2_weight * w[self_index] / np.linalg.norm(w)
        + degree_term
    )


@pytest.mark.parametrize("optimizer", ["adam", "gradient"])
def test_graph_step_moves_weight_to_similar_peers_and_stays_on_the_simplex(optimizer):
    cfg = GraphConfig(
        optimizer=optimizer,
        steps=50,
        learning_rate=0.3 if optimizer == "gradient" else 0.05,
        mu_similarity=5,
        l2_weight=5,
    )
    opt = GraphOptimizer(cfg)
    candidates = ["me", "a", "b", "c", "d"]
    similarity = np.array([1.0, 0.95, 0.9, 0.1, 0.0])
    w = np.full(5, 0.2)
    for _ in range(5):
        w = opt.step(candidates, w, similarity, np.full(5, 0.2), 0)
        assert w.min() >= 0 and w.sum() == pytest.approx(1)
    assert w[1] + w[2] > w[3] + w[4]
    if optimizer == "gradient":  # converged to the minimiser: dissimilar peers cut off exactly
        assert w[3] == w[4] == 0
    else:
        assert set(opt.first_moment) == set(candidates)


def test_head_similarity_measures():
    rng = np.random.default_rng(0)
    initial = rng.normal(size=(10, 32))
    update = rng.normal(size=(10, 32))
    head = initial + update
    assert head_similarity(head, head) == pytest.approx(1)
    assert head_similarity(head, -head) == pytest.approx(-1)
    for measure in ("update-cosine", "update-gram"):
        assert head_similarity(head, head, measure, initial) == pytest.approx(1)
    # The Gram measure does not care how the latent space is rotated: a backbone of another
    # architecture learning the same class structure in other coordinates still matches.
    rotation, _ = np.linalg.qr(rng.normal(size=(32, 32)))
    rotated = initial + update @ rotation
    assert head_similarity(head, rotated, "update-gram", initial) == pytest.approx(1)
    assert abs(head_similarity(head, rotated, "update-cosine", initial)) < 0.5
    # A zero row has no direction: cosine 0, not NaN.
    zero = head.copy()
    zero[0] = 0
    assert np.isfinite(head_similarity(head, zero))
    with pytest.raises(ValueError):
        head_similarity(head, head[:5])
    with pytest.raises(ValueError):
        head_similarity(head, head, "update-gram")  # needs the initial head
    with pytest.raises(ValueError):
        head_similarity(head, head, "nonsense", initial)


def test_normalise_similarities():
    s = np.array([0.3, 0.5, 0.25, -0.5])
    np.testing.assert_allclose(normalise_similarities(s, 0, "max"), [1, 1, 0.5, -1])
    np.testing.assert_allclose(normalise_similarities(s, 0, "minmax"), [1, 1, 0.75, 0])
    np.testing.assert_allclose(normalise_similarities(s, 0, "none"), [1, 0.5, 0.25, -0.5])


def test_graph_config_rejects_bad_values():
    for bad in (
        dict(steps=0),
        dict(epsilon=0),
        dict(mu_similarity=-1),
        dict(optimizer="lbfgs"),
        dict(similarity="l2"),
        dict(normalise_similarity="z"),
        dict(betas=(1.0, 0.5)),
        dict(learning_rate=float("nan")),
    ):
        with pytest.raises(ValueError):
            GraphConfig(**bad)


def test_graph_metrics():
    clusters = np.array([0, 0, 1, 1])
    truth = np.array([[0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5], [0, 0, 0.5, 0.5]])
    assert l1_to_truth(truth, truth) == 0
    assert within_cluster_mass(truth, clusters) == 1
    uniform = np.full((4, 4), 0.25)
    assert l1_to_truth(uniform, truth) == pytest.approx(1.0)
    assert within_cluster_mass(uniform, clusters) == pytest.approx(0.5)
    assert within_cluster_mass(np.eye(4), clusters) == 1


def test_a_graph_step_never_throws_the_row_onto_peers_unlike_the_node():
    """Every peer negatively similar (normalised −0.53 and −1): the minimiser keeps almost all of
    the weight on the node; a fixed projected step overshot on the degree term's −μ2/deg and put
    0.97 on a peer, 0 on the node. Each step now lowers the loss."""
    optimizer = GraphOptimizer(GraphConfig())
    similarity, confidence = np.array([1.0, -0.016, -0.03]), np.full(3, 1 / 3)
    w = np.full(3, 1 / 3)
    losses = [cgl_loss(w, normalise_similarities(similarity, 0), confidence, 0, GraphConfig())]
    for _ in range(3):
        w = optimizer.step(["me", "a", "b"], w, similarity, confidence, 0)
        losses.append(cgl_loss(w, normalise_similarities(similarity, 0), confidence, 0, GraphConfig()))
    assert w[0] > 0.95 and w.sum() == pytest.approx(1.0)
    assert losses == sorted(losses, reverse=True)


def test_a_learned_row_whose_every_neighbour_left_puts_the_node_alone_not_a_division_by_zero():
    """A row that gives the node itself nothing (the optimizer may), and its neighbours all gone at
    once (every router forgot its connections: tools/bench/nat_fleet.py found this crash a daemon's
    learning): the node weighs itself alone and sends to nobody until its next step."""
    from algorithms.graphs.collaboration import LearnedGraph

    graph = LearnedGraph("me", GraphConfig(), warmup_rounds=0, explore_every=1, explore_peers=0, seed=0)
    graph.set_peers(["a", "b"])
    graph.w, graph.learned = {"me": 0.0, "a": 0.6, "b": 0.4}, True
    graph.set_peers([])
    assert graph.weights() == {"me": 1.0} and graph.neighbours() == () and graph.targets(5) == ((), ())
