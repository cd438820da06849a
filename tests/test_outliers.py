"""The checks every algorithm's receive shares (issue #30, item 3) exist once, in the seam:
`Algorithm.receive` judges a payload (`guard.judging`, the algorithm's `inspect`, `guard.check`)
and each algorithm says only what is its own. Checked on the source, and on every algorithm
that judges: a payload of the wrong form distrusts its sender for the algorithm's part."""

import ast
from pathlib import Path

import numpy as np
import pytest

from algorithms.data.datasets import load_dataset
from algorithms.data.partitions import PartitionSpec, make_partition
from algorithms.data.setup import node_data
from algorithms.graphs.collaboration import InNeighbourhood
from algorithms.interface import NodeSetup, PayloadRejected
from algorithms.payloads import to_numpy
from algorithms.registry import ALGORITHMS, make_algorithm
from protocol.messages import Head, MessageType, Model, Prototypes

pytestmark = pytest.mark.quick  # models are built, never trained

ROOT = Path(__file__).resolve().parent.parent
PEERS = ["n0", "n1", "n2", "n3"]


def guard_calls(path: Path) -> list[str]:
    """The ScaleGuard methods `path` calls on a `guard` (`self.guard.check(...)`, `guard.judging(...)`)."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            named = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            if named == "guard" and node.func.attr in ("check", "judging"):
                calls.append(node.func.attr)
    return calls


def test_the_guard_is_called_by_the_seam_alone():
    found = {
        str(path.relative_to(ROOT)): calls
        for path in sorted((ROOT / "algorithms").rglob("*.py"))
        if (calls := guard_calls(path))
    }
    assert found == {"algorithms/interface.py": ["judging", "check"]}


def test_no_algorithm_takes_payloads_past_the_seam():
    """Algorithms say what is their own (`screen`, `inspect`, `keep`); none overrides `receive`
    but the poisoning wrapper, which hands every payload to the algorithm it wraps."""
    for path in sorted((ROOT / "algorithms" / "methods").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                assert "accept" not in methods, (path.name, node.name)
                assert "receive" not in methods or node.name == "PoisoningNode", (path.name, node.name)


@pytest.fixture(scope="module")
def digits():
    dataset = load_dataset("digits")
    return dataset, make_partition(
        dataset, PartitionSpec(scenario="1", nodes=4, samples_per_class=10, test_per_class=5)
    )


def make_node(name, digits):
    dataset, partition = digits
    setup = NodeSetup(node_id="n0", data=node_data(dataset, partition, 0, pooled=False), backbone="convnet", seed=0)
    node = make_algorithm(name, setup)
    node.set_peers(PEERS)
    return node


def record_refusals(node, monkeypatch) -> list[tuple[str, str]]:
    """Each (peer, part) the node's guard distrusts, in order."""
    refused, refuse = [], node.guard.refuse
    monkeypatch.setattr(node.guard, "refuse", lambda peer, part: (refused.append((peer, part)), refuse(peer, part)))
    return refused


MALFORMED = {
    MessageType.PROTOTYPES: Prototypes(classes=(0,), counts=(1,), prototypes=np.zeros((1, 3), np.float32)),
    MessageType.MODEL: Model(kind="params", tensors={"no such tensor": np.zeros(2, np.float32)}),
    MessageType.HEAD: Head(weight=np.zeros((2, 3), np.float32), bias=np.zeros(2, np.float32)),
}
JUDGED = [
    (name, kind, part) for name, info in ALGORITHMS.items() for kind, part in sorted(info.cls.judged_parts.items())
]


def test_every_algorithm_that_takes_payloads_judges_their_content():
    judging = {name for name, _, _ in JUDGED}
    for name, info in ALGORITHMS.items():
        assert (name in judging) == bool(info.cls.sends), name
    assert {(name, part) for name, _, part in JUDGED} >= {
        ("mapl", "prototypes"),
        ("sfmtl", "anchors"),
        ("sfmtl", "head"),
    }


@pytest.mark.parametrize("name, kind, part", JUDGED, ids=[f"{n}-{k.name.lower()}" for n, k, _ in JUDGED])
def test_a_payload_of_the_wrong_form_distrusts_its_sender_for_the_part(name, kind, part, digits, monkeypatch):
    node = make_node(name, digits)
    refused = record_refusals(node, monkeypatch)
    with pytest.raises(PayloadRejected) as caught:
        node.receive("n1", 0, MALFORMED[kind])
    assert caught.value.reason.startswith("bad_"), caught.value
    assert refused == [("n1", part)] and node.guard.distrusted() == {"n1"}
    if isinstance(node, InNeighbourhood):  # the graph follows the guard: n1's weight is the node's own
        assert node.weights().get("n1", 0.0) == 0.0


def test_a_head_riding_on_mapls_prototypes_distrusts_the_peer_for_both(digits, monkeypatch):
    node = make_node("mapl", digits)
    refused = record_refusals(node, monkeypatch)
    k = node.spec.num_classes
    body = Prototypes(
        classes=tuple(range(k)),
        counts=(1,) * k,
        prototypes=to_numpy(node.model.prototypes),
        head=to_numpy(node.model.head.weight) * 1e4,
    )
    with pytest.raises(PayloadRejected, match="head") as caught:
        node.receive("n1", 0, body)
    assert caught.value.reason == "out_of_scale"
    assert refused == [("n1", "head"), ("n1", "prototypes")]
    assert not node.view.latest(MessageType.HEAD) and not node.view.latest(MessageType.PROTOTYPES)


@pytest.mark.parametrize("name", ["scool-dirac", "scool-sbm"])
def test_scools_screen_runs_first_and_distrusts_nobody(name, digits, monkeypatch):
    node = make_node(name, digits)
    refused = record_refusals(node, monkeypatch)
    node.round = 5
    with pytest.raises(PayloadRejected) as caught:
        node.receive("n1", 0, MALFORMED[MessageType.MODEL])  # stale: refused before its form is looked at
    assert caught.value.reason == "stale" and refused == [] and not node.guard.distrusted()
    with pytest.raises(PayloadRejected) as caught:
        node.receive("stranger", 5, MALFORMED[MessageType.MODEL])
    assert caught.value.reason == "not_a_peer" and refused == []
