"""Message bodies: field rules of each type, checked through signed frames."""

import numpy as np
import pytest

from protocol import (
    BODY_TYPES,
    Bye,
    Head,
    Hello,
    MessageType,
    Model,
    Peers,
    Ping,
    ProtocolError,
    Prototypes,
    Reason,
    Score,
    seal_raw,
)

from .conftest import NETWORK, NOW_US
from .helpers import VALID, wire_tensor

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it


def seal(identity, kind, body):
    return seal_raw(identity, [1, NETWORK, kind, identity.public_key, 1, NOW_US, 0, body])


def outcome(decoder, identity, kind, body):
    try:
        return decoder.decode(seal(identity, kind, body)).body
    except ProtocolError as exc:
        return exc.reason


def test_every_type_has_a_valid_example(alice, decoder):
    assert set(VALID) == {kind.value for kind in MessageType} == {kind.value for kind in BODY_TYPES}
    for kind, body in VALID.items():
        decoded = outcome(decoder, alice, kind, body)
        assert isinstance(decoded, BODY_TYPES[MessageType(kind)]), (kind, decoded)


@pytest.mark.parametrize("kind", sorted(VALID))
def test_missing_and_extra_fields_are_refused(alice, decoder, kind):
    body = VALID[kind]
    for field in body:
        assert outcome(decoder, alice, kind, {k: v for k, v in body.items() if k != field}) is Reason.MALFORMED
    assert outcome(decoder, alice, kind, {**body, "comment": "hi"}) is Reason.MALFORMED


BAD_FIELDS = [
    ("HELLO", "address", "udp://127.0.0.1:7000"),
    ("HELLO", "address", "tcp://127.0.0.1"),
    ("HELLO", "address", "tcp://127.0.0.1:0"),
    ("HELLO", "address", "tcp://127.0.0.1:70000"),
    ("HELLO", "address", "tcp://bad host:7000"),
    ("HELLO", "address", "tcp://" + "a" * 300 + ":7000"),
    ("HELLO", "peer_port", 0),
    ("HELLO", "peer_port", 65536),
    ("HELLO", "peer_port", "7001"),
    ("HELLO", "capabilities", ["mapl", "mapl"]),
    ("HELLO", "capabilities", ["Not A Token"]),
    ("HELLO", "capabilities", ["x"] * 33),
    ("HELLO", "dataset_size", -1),
    ("HELLO", "dataset_size", True),
    ("HELLO", "dataset_size", 1.0),
    ("HELLO", "protocol_versions", []),
    ("HELLO", "protocol_versions", [256]),
    ("PEERS", "hellos", ["not bin"]),
    ("PEERS", "hellos", [b"x" * 5000]),  # longer than a HELLO frame may be
    ("PEERS", "hellos", [b"x"] * 65),
    ("PING", "nonce", -5),
    ("PING", "nonce", "5"),
    ("BYE", "reason", ""),
    ("BYE", "reason", "x" * 65),
    ("SCORE", "kind", "loss"),
    ("SCORE", "subject", b"\x01" * 31),
    ("SCORE", "value", float("nan")),
    ("SCORE", "value", float("inf")),
    ("SCORE", "value", 3),  # an integer where a float belongs
    ("SCORE", "samples", 2**32),
    ("MODEL", "kind", "grads"),
    ("MODEL", "tensors", {"bad name!": wire_tensor(np.ones(2, np.float32))}),
    ("MODEL", "tensors", [wire_tensor(np.ones(2, np.float32))]),
    ("MODEL", "update", {"bad name!": wire_tensor(np.ones(2, np.float32))}),
    ("MODEL", "update", [wire_tensor(np.ones((2, 2), np.float32))]),
    ("PROTOTYPES", "classes", [0, 0]),
    ("PROTOTYPES", "classes", [0, 70000]),
    ("ASK", "images", []),
    ("ASK", "images", [b"x"] * 65),
    ("ASK", "images", ["not bin"]),
    ("ANSWER", "labels", [1, 2]),  # two labels, one probability
    ("ANSWER", "probabilities", [1.5]),
    ("ANSWER", "own_probabilities", [float("nan")]),
    ("ANSWER", "threshold", -0.1),
    ("ANSWER", "refused", "busy"),  # a refusal with labels
    ("ANSWER", "classes", [1, 1]),
    ("RESERVED", "refused", "busy"),
    ("RESERVED", "refused", "full"),  # a refusal that grants 600 s
    ("RELAY", "target", b"\x02" * 31),
    ("RELAY", "sealed", b"x" * (4 * 2**20 + 1024 - 511)),  # leaves RELAY's envelope under 512 bytes
    ("RELAYED", "sealed", "not bin"),
    ("UNRELAYED", "reason", "busy"),
    ("REVERSE", "hello", b"x" * 4200),  # longer than a HELLO frame may be
    ("REACH", "relay_keys", []),
    ("REACH", "relay_keys", [b"\x02" * 32, b"\x02" * 32]),
    ("REACH", "relay_keys", [bytes([i]) * 32 for i in range(5)]),
    ("REACH", "relay_addresses", ["tcp://198.51.100.7:7000", "tcp://198.51.100.8:7000"]),  # two for one key
    ("REACH", "relay_addresses", ["tcp://0123456789abcdef0123456789abcdef.client.invalid:1"]),
]


@pytest.mark.parametrize("kind, field, value", BAD_FIELDS)
def test_bad_field_values_are_refused(alice, decoder, kind, field, value):
    assert outcome(decoder, alice, kind, {**VALID[kind], field: value}) is Reason.MALFORMED


BAD_TENSORS = [
    ("PROTOTYPES", "prototypes", wire_tensor(np.ones((3, 4), np.float32))),  # 3 rows, 2 classes
    ("PROTOTYPES", "prototypes", wire_tensor(np.ones(8, np.float32))),  # rank 1
    ("PROTOTYPES", "prototypes", wire_tensor(np.ones((2, 4), np.int32))),  # not float
    ("PROTOTYPES", "counts", [3]),  # one count for two prototypes
    ("PROTOTYPES", "head", wire_tensor(np.ones((1, 4), np.float32))),  # class 1 but a one-row head
    ("PROTOTYPES", "head", wire_tensor(np.ones(4, np.float32))),  # rank 1
    ("HEAD", "bias", wire_tensor(np.zeros(4, np.float32))),  # 4 entries, 3 rows
    ("HEAD", "weight", wire_tensor(np.ones((3, 4, 1), np.float32))),
    ("HEAD", "bias", "none"),  # anything in a tensor field that is not a tensor
    ("MODEL", "tensors", {"w": {"dtype": "float32", "shape": [1], "data": np.array([np.nan], np.float32).tobytes()}}),
    ("MODEL", "update", {"fc.bias": wire_tensor(np.ones(2, np.float32))}),  # names no tensor of the model
    ("MODEL", "update", {"fc.weight": wire_tensor(np.ones((2, 3), np.float32))}),  # shape differs from tensors
    ("MODEL", "update", {"fc.weight": wire_tensor(np.ones(4, np.float32))}),  # same size, other rank
    ("MODEL", "update", {"bn.num_batches_tracked": wire_tensor(np.array(1, np.int64))}),  # not float
    (
        "MODEL",
        "update",
        {"fc.weight": {"dtype": "float32", "shape": [2, 2], "data": np.full(4, np.inf, np.float32).tobytes()}},
    ),
]


@pytest.mark.parametrize("kind, field, value", BAD_TENSORS)
def test_inconsistent_tensors_are_refused(alice, decoder, kind, field, value):
    assert outcome(decoder, alice, kind, {**VALID[kind], field: value}) is Reason.BAD_TENSOR


def test_head_without_bias(alice, decoder):
    body = outcome(decoder, alice, "HEAD", {**VALID["HEAD"], "bias": None})
    assert isinstance(body, Head) and body.bias is None


def test_ipv6_and_host_names_are_valid_addresses(alice, decoder):
    for address in ("tcp://[::1]:7000", "tcp://node-7.lab.example:65535", "tcp://10.1.2.3:1"):
        assert isinstance(outcome(decoder, alice, "HELLO", {**VALID["HELLO"], "address": address}), Hello)
    assert outcome(decoder, alice, "HELLO", {**VALID["HELLO"], "peer_port": None}).peer_port is None


def test_model_keeps_parameter_order_and_dtypes(alice, encoder, decoder):
    tensors = {
        "z.weight": np.ones((2, 2), np.float32),
        "a.running_mean": np.zeros(2, np.float64),
        "a.num_batches_tracked": np.array(3, np.int64),
    }
    body = decoder.decode(
        encoder.encode(Model(kind="delta", tensors=tensors), seq=1, timestamp_us=NOW_US, round=0)
    ).body
    assert list(body.tensors) == list(tensors)
    assert [t.dtype for t in body.tensors.values()] == [np.float32, np.float64, np.int64]


def test_model_round_trips_an_update(encoder, decoder):
    tensors = {"fc.weight": np.ones((2, 2), np.float32), "bn.num_batches_tracked": np.array(3, np.int64)}
    update = {"fc.weight": np.full((2, 2), 0.25, np.float32)}  # the integer buffer has no update
    sent = Model(kind="params", tensors=tensors, update=update)
    body = decoder.decode(encoder.encode(sent, seq=1, timestamp_us=NOW_US, round=0)).body
    assert body == sent and list(body.update) == ["fc.weight"] and body.update["fc.weight"].dtype == np.float32
    assert Model(kind="params", tensors=tensors).update is None


def test_model_update_only_with_params(alice, decoder):
    update = {"fc.weight": wire_tensor(np.ones((2, 2), np.float32))}
    assert outcome(decoder, alice, "MODEL", {**VALID["MODEL"], "update": update}).update is not None
    assert outcome(decoder, alice, "MODEL", {**VALID["MODEL"], "kind": "delta", "update": update}) is Reason.BAD_TENSOR
    assert isinstance(outcome(decoder, alice, "MODEL", {**VALID["MODEL"], "kind": "delta"}), Model)


@pytest.mark.parametrize(
    "body",
    [
        Model(kind="delta", tensors={"w": np.ones(2, np.float32)}, update={"w": np.ones(2, np.float32)}),
        Model(kind="params", tensors={"w": np.ones(2, np.float32)}, update={"v": np.ones(2, np.float32)}),
        Model(kind="params", tensors={"w": np.ones(2, np.float32)}, update={"w": np.ones(3, np.float32)}),
        Model(kind="params", tensors={"w": np.ones(2, np.int32)}, update={"w": np.ones(2, np.int32)}),
    ],
)
def test_model_update_rules_hold_when_encoding(encoder, body):
    with pytest.raises(ProtocolError) as refused:
        encoder.encode(body, seq=1, timestamp_us=NOW_US, round=0)
    assert refused.value.reason is Reason.BAD_TENSOR


def test_peers_relay_signed_hellos_verbatim(alice, bob, encoder, decoder):
    from protocol import Encoder

    hello = Encoder(bob, NETWORK).encode(
        Hello(address="tcp://10.0.0.2:7000", capabilities=(), dataset_size=5, protocol_versions=(1,)),
        seq=1,
        timestamp_us=NOW_US,
        round=0,
    )
    relayed = decoder.decode(encoder.encode(Peers(hellos=(hello,)), seq=2, timestamp_us=NOW_US, round=0))
    inner = decoder.decode(relayed.body.hellos[0])
    assert relayed.sender == alice.public_key and inner.sender == bob.public_key
    assert inner.body.address == "tcp://10.0.0.2:7000"


def test_encoding_checks_the_same_rules(encoder):
    cases = [
        Hello(address="tcp://x:0", capabilities=(), dataset_size=1, protocol_versions=(1,)),
        Bye(reason="Shut Down"),
        Ping(nonce=-1),
        Prototypes(classes=(1, 2), counts=(1,), prototypes=np.ones((2, 2), np.float32)),
        Score(kind="similarity", subject=b"x" * 32, subject_seq=1, value=float("nan"), samples=0),
        Model(kind="params", tensors={"w": [1.0, 2.0]}),
    ]
    for body in cases:
        with pytest.raises(ProtocolError):
            encoder.encode(body, seq=1, timestamp_us=NOW_US, round=0)


def test_bodies_compare_by_value_and_print_compactly():
    a = Head(weight=np.ones((2, 3), np.float32), bias=None)
    assert a == Head(weight=np.ones((2, 3), np.float32), bias=None)
    assert a != Head(weight=np.ones((2, 3), np.float64), bias=None)
    assert a != Head(weight=np.zeros((2, 3), np.float32), bias=None)
    assert repr(a) == "Head(weight=<float32[2, 3]>, bias=None)"
