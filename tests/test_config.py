import ast
import dataclasses
import inspect
import os
import re
from pathlib import Path

import pytest

from p2pnode.config import ConfigError, load_config, reference_markdown
from p2pnode.config.sections import SECTIONS
from p2pnode.discovery.settings import DiscoverySettings
from p2pnode.learning.settings import AlgorithmSettings
from p2pnode.options import CheckContext, Section
from p2pnode.wire.keystore import write_key
from p2pnode.wire.settings import TransportSettings
from protocol import Identity, MessageType

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path):
    write_key(tmp_path / "node.pem", Identity.generate())
    return tmp_path


def config(home: Path, text: str, name: str = "node.toml") -> Path:
    path = home / name
    path.write_text(text)
    return path


MINIMAL = '[node]\nkey = "node.pem"\nlisten = "tcp://127.0.0.1:7000"\n'


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return caught.value.problems


def test_minimal_config_and_defaults(home):
    loaded = load_config(config(home, MINIMAL))
    assert loaded.node.data_dir == home / "data"  # relative to the config file, not the cwd
    assert loaded.node.key == home / "node.pem" and loaded.identity is not None
    assert loaded.discovery.max_peers == 64 and loaded.discovery.bootstrap == ()
    assert loaded.security.allowlist is None
    assert loaded.control_socket == home / "data" / "control.sock"
    assert loaded.limits.limits().max_frame_bytes_for(MessageType.HELLO) == 4096


def test_every_problem_is_reported_with_its_field(home):
    found = problems(
        config(
            home,
            MINIMAL
            + """
[discovery]
max_peer = 3
max_peers = 0
ping_interval_s = "fast"
settled_after_s = -1
bootstrap = ["tcp://10.0.0.1:7001", "udp://x:1"]
[transport]
verify_threads = 2.5
[gossip]
x = 1
""",
        )
    )
    assert "[discovery].max_peer: unknown key (did you mean 'max_peers'?)" in found
    assert "[discovery].max_peers: must be between 1 and 4096, got 0" in found
    assert "[discovery].ping_interval_s: expected a number, got a string" in found
    assert "[discovery].settled_after_s: must be between 0 and 604800, got -1" in found
    assert "[discovery].bootstrap: entry 2: 'udp://x:1' is not an address of the form tcp://HOST:PORT" in found
    assert "[transport].verify_threads: expected an integer, got a number" in found
    assert any(p.startswith("[gossip]: unknown section") for p in found)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('[node]\nlisten = "tcp://127.0.0.1:7000"\n', "[node].key: required"),
        ('[node]\nkey = "node.pem"\n', "[node].listen: required"),
        (MINIMAL.replace("127.0.0.1:7000", "127.0.0.1:70000"), "[node].listen: port 70000 is not a usable port"),
        (MINIMAL.replace("127.0.0.1", "example.org"), "[node].listen: bind to an IP address"),
        (MINIMAL.replace("127.0.0.1", "*"), "[node].advertise: required when listen binds all interfaces"),
        (MINIMAL + 'advertise = "tcp://0.0.0.0:7000"\n', "[node].advertise: 'tcp://0.0.0.0:7000' cannot be dialled"),
        (MINIMAL + 'network = "Main Net"\n', "[node].network: 'Main Net' is not a network id"),
        (
            MINIMAL + "[discovery]\nping_interval_s = 3\npeer_timeout_s = 5\n",
            "[discovery].peer_timeout_s: must exceed 2 × ping_interval_s",
        ),
        (MINIMAL + "[security]\nallowlist = []\n", "[security].allowlist: an empty list would refuse every peer"),
        (MINIMAL + '[security]\nallowlist = ["abc"]\n', "[security].allowlist: entry 1: expected 64 hex digits"),
        (MINIMAL + "[limits]\nframe_bytes = { GOSSIP = 10 }\n", "[limits].frame_bytes: unknown message type 'GOSSIP'"),
        (
            MINIMAL + "[limits]\nmax_frame_bytes = 2048\nframe_bytes = { MODEL = 4096 }\n",
            "[limits].frame_bytes: MODEL bound 4096 exceeds max_frame_bytes 2048",
        ),
        (MINIMAL + '[beacon]\ngroup = "10.0.0.1"\n', "[beacon].group: 10.0.0.1 is not a multicast address"),
        (
            MINIMAL + '[log]\nlevel = "loud"\n',
            "[log].level: must be one of 'debug', 'info', 'warning', 'error', got 'loud'",
        ),
        (MINIMAL + '[node]\nkey = "x"\n', "not valid TOML"),
        (MINIMAL.replace('"node.pem"', '"missing.pem"'), "p2pnode keygen --out"),
    ],
)
def test_documented_messages(home, text, expected):
    found = problems(config(home, text))
    assert any(expected in problem for problem in found), found


def test_group_readable_key_is_refused(home):
    os.chmod(home / "node.pem", 0o640)
    (found,) = problems(config(home, MINIMAL))
    assert found.startswith("[node].key: key file") and "chmod 600" in found


def test_data_dir_too_long_for_a_unix_socket(home):
    found = problems(config(home, MINIMAL + f'data_dir = "{"d" * 120}"\n'))
    assert any(p.startswith("[node].data_dir: path too long for the control socket") for p in found)


def test_missing_file():
    with pytest.raises(ConfigError, match="file not found"):
        load_config("/nonexistent/node.toml")


def test_docs_list_every_setting():
    assert reference_markdown() in (ROOT / "docs" / "config.md").read_text(), (
        "regenerate docs/config.md from reference_markdown()"
    )


def test_curve_is_on_by_default_and_needs_every_bootstrap_key(home):
    """Issue #43: a hand-written config without CURVE left a node open to being cut off from all
    its peers by one stranger's campaign; CURVE is the default, and an entry without its key
    says which it is, what to write and where the key comes from."""
    key = Identity.generate().public_key.hex()
    found = problems(
        config(home, MINIMAL + f'[discovery]\nbootstrap = ["{key}@tcp://10.0.0.1:7001", "tcp://10.0.0.2:7001"]\n')
    )
    assert found == [
        "[discovery].bootstrap: entry 2 (tcp://10.0.0.2:7001) names no key: connections are encrypted "
        '([security].curve, on by default), so it must be "KEY@tcp://10.0.0.2:7001", KEY the public_key that '
        "`p2pnode keyinfo PEER_KEY_FILE` prints on that peer's host (or `p2pnode init` writes a fleet's configs "
        "with them); [security] curve = false goes without, for a closed network only"
    ]
    plaintext = MINIMAL + '[security]\ncurve = false\n[discovery]\nbootstrap = ["tcp://10.0.0.2:7001"]\n'
    assert not load_config(config(home, plaintext)).security.curve
    found = problems(config(home, MINIMAL + '[discovery]\nbootstrap = ["abc@tcp://10.0.0.1:7001"]\n'))
    assert found[0].startswith("[discovery].bootstrap: entry 1: expected 64 hex digits")
    no_point = (1).to_bytes(32, "little").hex()  # y = 1 has no transport key
    found = problems(config(home, MINIMAL + f'[discovery]\nbootstrap = ["{no_point}@tcp://10.0.0.1:7001"]\n'))
    assert found == ["[discovery].bootstrap: entry 1: not an Ed25519 public key: the neutral point"]


def test_curve_settings_and_keyed_bootstrap(home):
    key = Identity.generate().public_key
    loaded = load_config(
        config(
            home,
            MINIMAL
            + "[security]\ncurve = true\nmax_connections = 10\nmax_connections_per_address = 2\n"
            + f'[discovery]\nbootstrap = ["{key.hex().upper()}@tcp://10.0.0.1:7001"]\n',
        )
    )
    assert loaded.security.curve and loaded.security.max_connections == 10
    assert loaded.security.max_connections_per_address == 2
    assert loaded.discovery.bootstrap_peers() == (("tcp://10.0.0.1:7001", key),)
    plain = load_config(config(home, MINIMAL, "plain.toml"))
    assert plain.security.curve and plain.security.max_connections_per_address == 32  # the defaults


def learning(rounds: int = 12, algorithm: str = "mapl", data: str = "", more: str = "") -> str:
    return (
        MINIMAL
        + f'[data]\ndataset = "digits"\nnodes = 4\n{data}'
        + f'[algorithm]\nname = "{algorithm}"\nrounds = {rounds}\n{more}'
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        (  # a setting that was removed says why, and what replaced it
            MINIMAL + "[transport]\nheartbeat_ivl_ms = 2000\n",
            "[transport].heartbeat_ivl_ms: removed: ZMTP heartbeats made libzmq abort the daemon",
        ),
        (MINIMAL.replace("[node]\n", "[node]\nstep_slowdown = 5\n"), "[node].step_slowdown: renamed [node].slowdown"),
        (
            MINIMAL + "[transport]\nreconnect_ivl_ms = 1000\nreconnect_ivl_max_ms = 500\n",
            "[transport].reconnect_ivl_max_ms: must be 0 (no backoff) or at least reconnect_ivl_ms (1000), got 500",
        ),
        (
            learning(more="settings = { warmup_rounds = 12 }\n"),
            "[algorithm].settings: warmup_rounds=12 (given) must be below [algorithm].rounds (12), "
            "or the graph is never learned",
        ),
        (
            learning(12, "mapl-dual", more="settings = { warmup_rounds = 4, distill_after = 12 }\n"),
            "[algorithm].settings: distill_after=12 (given) must be below [algorithm].rounds (12), "
            "or nothing is ever distilled",
        ),
        (
            learning(8, "scool-sbm", more="settings = { prune_round = 8 }\n"),
            "[algorithm].settings: prune_round=8 (given) "
            "must be below [algorithm].rounds (8), or the neighbours are never pruned (prune_round=0: never prune)",
        ),
        (
            learning(more="start_peers = 9\nsettings = { warmup_rounds = 4 }\n").replace(
                "[data]", "[discovery]\nmax_peers = 8\n[data]"
            ),
            "[algorithm].start_peers: must not exceed [discovery].max_peers (8), got 9",
        ),
        (
            learning(more="inbox_frames = 100\npeer_inbox_frames = 101\nsettings = { warmup_rounds = 4 }\n"),
            "[algorithm].peer_inbox_frames: must not exceed [algorithm].inbox_frames (100), got 101",
        ),
        (
            learning(more='schedule = "async"\nasync_gather_s = 5.0\nround_deadline_s = 1.0\n'),
            "[algorithm].async_gather_s: must not exceed [algorithm].round_deadline_s (1.0), got 5.0",
        ),
        (learning(data="node_index = 4\n"), "[data].node_index: must be below [data].nodes (4), got 4"),
        (learning(data="clusters = 5\n"), "[data].clusters: cannot exceed [data].nodes (4), got 5"),
        (
            learning(data='root = "nowhere"\n').replace('"digits"', '"mnist"'),
            "[data].root: dataset 'mnist': root '",  # ... '<config dir>/nowhere' is not a directory
        ),
        (learning().replace('"digits"', '"cifar10"'), "[data].root: dataset 'cifar10' is read from local files"),
    ],
)
def test_contradicting_settings_are_refused(home, text, expected):
    found = problems(config(home, text))
    assert any(problem.startswith(expected) for problem in found), found


@pytest.mark.parametrize("algorithm", ["mapl-nocgl", "local", "fedproto", "scool-dirac"])
def test_a_warm_up_longer_than_the_run_is_fine_where_no_graph_is_learned(home, algorithm):
    assert load_config(config(home, learning(8, algorithm))).algorithm.rounds == 8


def test_a_dataset_root_holding_the_files_passes(home):
    from algorithms.data.datasets import _LAYOUT

    for file in _LAYOUT["mnist"]:
        (home / "roots" / file).parent.mkdir(parents=True, exist_ok=True)
        (home / "roots" / file).write_bytes(b"")
    text = learning(data='root = "roots"\n', more="settings = { warmup_rounds = 4 }\n").replace('"digits"', '"mnist"')
    assert load_config(config(home, text)).data.root == home / "roots"
    (home / "roots" / _LAYOUT["mnist"][0]).unlink()
    (found,) = problems(config(home, text))
    assert found.startswith("[data].root: dataset 'mnist' not found under root") and _LAYOUT["mnist"][0] in found


# --- where the rules live (issue #47 item 3) ---------------------------------------------------


def section_names_in_messages(tree: ast.AST) -> list[set[str]]:
    """The sections each problem message in `tree` names ("[discovery].bootstrap: ... [security].curve")."""
    found = []
    parts = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value for part in node.values if isinstance(part, ast.Constant))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            text = node.value
        else:
            continue
        if re.match(r"\[(\w+)\]\.", text):
            found.append(set(re.findall(r"\[(\w+)\]", text)) & set(SECTIONS))
    return found


def test_each_section_checks_its_own_rules_and_config_only_those_across_sections():
    """A rule between settings of one section is that section's `check`, beside its declarations;
    p2pnode/config/checks.py keeps the rules that need two or more sections, and nothing else."""
    assert all(issubclass(cls, Section) for cls in SECTIONS.values())
    across = section_names_in_messages(ast.parse((ROOT / "p2pnode" / "config" / "checks.py").read_text()))
    assert len(across) >= 5 and all(len(names) >= 2 for names in across), across
    for name, cls in SECTIONS.items():
        source = Path(inspect.getsourcefile(cls))
        (declared,) = (n for n in ast.walk(ast.parse(source.read_text())) if getattr(n, "name", None) == cls.__name__)
        methods = [node for node in declared.body if isinstance(node, ast.FunctionDef)]
        for names in (names for method in methods for names in section_names_in_messages(method)):
            assert names == {name}, f"{cls.__name__} reports a problem naming {sorted(names)}: a rule across sections"


def test_a_section_checks_itself_without_a_file(tmp_path):
    context = CheckContext(given=frozenset(), base=tmp_path, learns=False)
    assert DiscoverySettings(ping_interval_s=3, peer_timeout_s=5).check(context) == [
        "[discovery].peer_timeout_s: must exceed 2 × ping_interval_s (6), got 5"
    ]
    assert TransportSettings(reconnect_ivl_ms=1000, reconnect_ivl_max_ms=0).check(context) == []  # 0: no backoff
    odd = AlgorithmSettings(name="local", inbox_frames=1, peer_inbox_frames=2)
    assert odd.check(context) == []  # the learning rules: for a node that learns, by a loader that checks them
    assert odd.check(dataclasses.replace(context, learns=True)) == [
        "[algorithm].peer_inbox_frames: must not exceed [algorithm].inbox_frames (1), got 2: "
        "it is one peer's share of that queue"
    ]
