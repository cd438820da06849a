"""`p2pnode init`: a fleet's keys and configs, each loading as `start` would load it, and three
daemons started from them on loopback that find each other and learn from their own images, as
`p2pnode simulate --fleet` rehearsed them."""

import json
import stat
import tomllib

import pytest

from p2pnode.config import load_config
from p2pnode.operations.status import format_status
from p2pnode.wire.keystore import load_key
from p2pnode_cli import main

from .helpers import free_ports, init, run_fleet, write_digit_pngs


def test_init_writes_a_fleet_whose_configs_load_and_name_each_other(tmp_path, capsys):
    out = tmp_path / "fleet"
    code, paths, err = init(capsys, "--nodes", "3", "--out", str(out))
    assert code == 0, err
    assert paths == [str(out / f"node{i}" / "node.toml") for i in range(3)]
    configs = [load_config(path) for path in paths]  # keys and learning sections included
    keys = [load_key(out / f"node{i}" / "key.pem") for i in range(3)]
    for i, config in enumerate(configs):
        assert stat.S_IMODE((out / f"node{i}" / "key.pem").stat().st_mode) == 0o600
        assert config.identity.public_key == keys[i].public_key
        assert config.security.curve
        assert config.node.listen == f"tcp://127.0.0.1:{7000 + 2 * i}"
        assert config.node.peer_listen == f"tcp://127.0.0.1:{7001 + 2 * i}"
        assert config.node.data_dir == out / f"node{i}" / "data"
        others = {(f"tcp://127.0.0.1:{7000 + 2 * j}", keys[j].public_key) for j in range(3) if j != i}
        assert set(config.discovery.bootstrap_peers()) == others
        # The placeholder data runs as written: node i's shard of mnist5k, with the comment to replace it.
        assert (config.data.dataset, config.data.nodes, config.data.node_index) == ("mnist5k", 3, i)
        assert "YOUR DATA GOES HERE" in (out / f"node{i}" / "node.toml").read_text()
        assert (config.algorithm.name, config.algorithm.start_peers) == ("mapl-auto", 2)
    assert "edit [data] first" in err
    # An existing fleet is not overwritten, unless --force: then every key is new.
    code, _, err = init(capsys, "--nodes", "3", "--out", str(out))
    assert code == 2 and "--force" in err
    assert load_key(out / "node0" / "key.pem").public_key == keys[0].public_key
    code, _, err = init(capsys, "--nodes", "3", "--out", str(out), "--force")
    assert code == 0, err
    assert load_key(out / "node0" / "key.pem").public_key != keys[0].public_key


def test_init_deals_hosts_round_robin_with_ports_per_host(tmp_path, capsys):
    out = tmp_path / "fleet"
    argv = ("--nodes", "5", "--out", str(out), "--hosts", "10.0.0.1,node-b.lan", "--rounds", "30")
    code, paths, err = init(capsys, *argv, "--set", "warmup_rounds=10", "--set", "graph.l2_weight=2.5")
    assert code == 0, err
    documents = [tomllib.loads((out / f"node{i}" / "node.toml").read_text()) for i in range(5)]
    # 10.0.0.1 runs nodes 0, 2, 4 on 7000, 7002, 7004; node-b.lan runs 1 and 3, bound on every interface.
    assert [d["node"]["listen"] for d in documents] == [
        "tcp://10.0.0.1:7000",
        "tcp://*:7000",
        "tcp://10.0.0.1:7002",
        "tcp://*:7002",
        "tcp://10.0.0.1:7004",
    ]
    assert documents[1]["node"]["advertise"] == "tcp://node-b.lan:7000"
    assert documents[3]["node"]["peer_listen"] == "tcp://*:7003"
    assert all(len(d["discovery"]["bootstrap"]) == 4 for d in documents)
    assert "@tcp://node-b.lan:7002" in documents[0]["discovery"]["bootstrap"][2]
    assert documents[0]["algorithm"]["settings"] == {"warmup_rounds": 10, "graph.l2_weight": 2.5}
    for path in paths:  # the keys and the structure are checked; 10.0.0.1 is not this host's to bind
        load_config(path, check_learning=False)


def test_init_refuses_what_it_cannot_write(tmp_path, capsys):
    (tmp_path / "two").mkdir()
    for name in ("a", "b"):
        write_digit_pngs(tmp_path / "two" / name, (0, 1), per_class=3)
    cases = [
        (("--nodes", "3", "--data-per-node", str(tmp_path / "two")), "2 folders or .npz files for --nodes 3"),
        (("--nodes", "2", "--data-per-node", str(tmp_path / "none")), "not a directory"),
        (("--nodes", "2", "--hosts", "a,,b"), "--hosts"),
        (
            (
                "--nodes",
                "300",
            ),
            "--nodes: 1 to 257",
        ),
        (("--nodes", "2", "--port", "65535"), "max 65535"),
    ]
    for argv, message in cases:
        code, _, err = init(capsys, *argv, "--out", str(tmp_path / "out"))
        assert code == 2 and message in err, (argv, err)
        assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_failed_init_leaves_nothing_and_a_forced_one_puts_back_what_it_replaced(tmp_path, capsys):
    """Issue #45: `--rounds 10` against MAPL-Dual's warm-up of 20 failed after writing the
    configs, so the retry needed --force (the default warm-up fits the run now: issue #44)."""
    out = tmp_path / "fleet"
    code, _, err = init(capsys, "--nodes", "2", "--rounds", "10", "--set", "warmup_rounds=10", "--out", str(out))
    assert code == 2 and "warmup_rounds=10 (given) must be below [algorithm].rounds (10)" in err, err
    assert not out.exists()  # nothing left: the retry needs no --force
    code, _, err = init(capsys, "--nodes", "2", "--rounds", "10", "--out", str(out))
    assert code == 0, err
    key = load_key(out / "node0" / "key.pem").public_key
    (out / "notes.txt").write_text("mine")
    code, _, err = init(
        capsys, "--nodes", "2", "--rounds", "4", "--set", "warmup_rounds=5", "--out", str(out), "--force"
    )
    assert code == 2, err
    assert load_key(out / "node0" / "key.pem").public_key == key  # put back as it was
    assert sorted(p.name for p in out.iterdir()) == ["node0", "node1", "notes.txt"]


def test_init_writes_a_local_baseline_and_data_paths_relative_to_the_config(tmp_path, capsys):
    data = tmp_path / "s" / "images"
    for name in ("a", "b"):
        write_digit_pngs(data / name, (0, 1), per_class=3)
    code_folder = tmp_path / "s" / "code"  # the user's own backbone, and weights for it
    code_folder.mkdir()
    (code_folder / "user_net_init.py").write_text("from torch import nn\n\ndef backbone():\n    return nn.Flatten()\n")
    (code_folder / "start.pt").write_bytes(b"")
    out = tmp_path / "s" / "f"
    own = (
        "--backbone",
        "user_net_init:backbone",
        "--code",
        str(code_folder),
        "--weights",
        str(code_folder / "start.pt"),
    )
    code, _, err = init(
        capsys, "--nodes", "2", "--local-baseline", "--data-per-node", str(data), "--out", str(out), *own
    )
    assert code == 0, err
    raw = tomllib.loads((out / "node1" / "node.toml").read_text())
    assert raw["algorithm"]["local_baseline"] is True
    assert raw["data"]["path"] == "../../images/b"  # no path of the machine init ran on
    assert raw["model"] == {
        "backbone": "user_net_init:backbone",
        "threads": 1,
        "code": "../../code",
        "weights": "../../code/start.pt",
    }
    assert raw["data"]["node_index"] == 1  # seeded as node 1 of its rehearsal (simulate --data-per-node)
    # The fleet and its data moved together (copied to a device, say) still load.
    (tmp_path / "s").rename(tmp_path / "e")  # short: the control socket's path has 107 bytes
    config = load_config(tmp_path / "e" / "f" / "node1" / "node.toml")
    assert config.algorithm.local_baseline and config.data.path.resolve() == tmp_path / "e" / "images" / "b"


def test_a_fleet_rehearsal_is_what_its_configs_say_and_refuses_what_they_do_not(tmp_path, capsys):
    """`simulate --fleet DIR` reads the run from init's configs: node i the one with
    `[data].node_index = i`, each node's backbone, the settings; a flag that would say otherwise,
    or nodes that disagree on what one run shares, are usage errors naming what to change."""
    from testnet.simulation.rehearsal import FleetRehearsalError, read_fleet

    code, paths, err = init(
        capsys, "--nodes", "3", "--out", str(tmp_path / "f"), "--rounds", "9", "--set", "warmup_rounds=2"
    )
    assert code == 0, err
    # Node 1 moved to a directory that sorts first, and given another backbone: still node 1.
    (tmp_path / "f" / "node1").rename(tmp_path / "f" / "a-node")
    moved = tmp_path / "f" / "a-node" / "node.toml"
    moved.write_text(moved.read_text().replace('backbone = "convnet"', 'backbone = "mlp"'))
    rehearsal = read_fleet(tmp_path / "f")
    spec = rehearsal.spec
    assert (spec.algorithm, spec.nodes, spec.rounds, spec.data.dataset, spec.seed) == ("mapl-auto", 3, 9, "mnist5k", 0)
    assert spec.node_backbones() == ["convnet", "mlp", "convnet"] and spec.overrides == {"warmup_rounds": "2"}
    assert rehearsal.configs[1] == moved and not rehearsal.local_baseline

    assert main(["simulate", "--fleet", str(tmp_path / "f"), "--rounds", "3", "--out", str(tmp_path / "o")]) == 2
    assert "--rounds: --fleet" in capsys.readouterr().err
    paths = sorted((tmp_path / "f").glob("*/node.toml"))
    paths[2].write_text(paths[2].read_text().replace("warmup_rounds = 2", "warmup_rounds = 3"))
    with pytest.raises(FleetRehearsalError, match=r"\[algorithm\].settings differs between"):
        read_fleet(tmp_path / "f")
    paths[2].write_text(paths[2].read_text().replace("node_index = 2", "node_index = 1"))
    with pytest.raises(FleetRehearsalError, match="must number the 3 nodes 0 to 2"):
        read_fleet(tmp_path / "f")
    with pytest.raises(FleetRehearsalError, match=r"no \*/node\.toml there"):
        read_fleet(tmp_path / "empty")


def test_three_daemons_from_init_find_each_other_and_learn_as_rehearsed(tmp_path, capsys):
    """`p2pnode init --nodes 3 --local-baseline` on folders of real digit PNGs (one per node,
    class subsets that overlap), then `p2pnode start` of each config as written: all three become
    peers over CURVE and complete every round with both others' payloads, and each ends where
    `p2pnode simulate --fleet` of the same directory put it, seed for seed, Local beside it too."""
    subsets = ((0, 1, 2), (2, 3, 4), (4, 5, 0))
    for index, classes in enumerate(subsets):
        write_digit_pngs(tmp_path / "images" / f"device{index}", classes, part=index, parts=3, per_class=20)
    rounds = 3
    code, paths, err = init(
        capsys,
        *("--nodes", "3", "--out", str(tmp_path / "fleet"), "--port", str(free_ports(6))),
        *("--data-per-node", str(tmp_path / "images"), "--image-size", "8", "--backbone", "mlp"),
        *("--rounds", str(rounds), "--set", f"warmup_rounds={rounds - 1}", "--local-baseline"),
    )
    assert code == 0, err
    assert load_config(paths[0]).data.class_names == ("0", "1", "2", "3", "4", "5")
    statuses = run_fleet([tmp_path / "fleet" / f"node{index}" for index in range(3)])
    for status in statuses:
        assert status["peer_count"] == 2 and not status["dialing"], status["peers"]
        history = status["learning"]["history"]
        assert len(history) == rounds
        # Every payload a round waited for arrived: round 0's MODELs too, sent moments after the
        # last admission, while the connection to that peer's peers' socket may still be opening
        # (they wait for it: transport.py, `connect_wait_s`).
        assert all(entry["expected"] == entry["arrived"] == 2 for entry in history[:-1]), [
            (e["round"], e["expected"], e["arrived"], e["missing"], e["gather_s"]) for e in history
        ]
        assert not {"MODEL", "PROTOTYPES"} & set(status["traffic"]["send_dropped"]), status["traffic"]
        assert status["learning"]["accuracy"] > 0.5  # three classes each: chance is 1/3
    # The rehearsal, from the same directory and nothing else, gave each node what its daemon got.
    assert main(["simulate", "--fleet", str(tmp_path / "fleet"), "--out", str(tmp_path / "rehearsal")]) == 0
    rehearsed = json.loads((tmp_path / "rehearsal" / "report.json").read_text())
    assert rehearsed["algorithm"] == "mapl-auto" and rehearsed["backbones"] == ["mlp"] * 3
    deployed = [status["learning"]["accuracy"] for status in statuses]
    # Seed for seed, exactly: a daemon sums its neighbours' payloads in the peers' order, not as
    # they arrived (CI once saw a node two test images apart when it summed as they came). A node
    # whose last round closed without a payload (a loaded machine: the gather's deadline is
    # wall-clock time) learned from other inputs than the rehearsal's: it is left out, and at
    # least one node must have had them all.
    accuracy = rehearsed["accuracy"]
    complete = [status["learning"]["history"][-1]["arrived"] == 2 for status in statuses]
    pairs = zip(accuracy["per_node"], deployed, complete, strict=True)
    assert any(complete) and all(simulated == daemon for simulated, daemon, full in pairs if full), (
        deployed,
        accuracy["per_node"],
        complete,
    )
    local = [status["learning"]["history"][-1]["local_baseline"]["accuracy"] for status in statuses]
    gain = 100 * (deployed[0] - local[0])
    assert f"local baseline {local[0]:.3f} (gain {gain:+.1f} points)" in format_status(statuses[0])  # `p2pnode status`
    assert rehearsed["baselines"]["local"]["accuracy"]["per_node"] == pytest.approx(local, abs=1e-9)


def test_a_fleet_with_nodes_behind_nats_writes_them_in_client_mode_and_they_learn_with_the_others(tmp_path, capsys):
    """`init --behind-nat 2,3`: those nodes bind nothing (client mode), nobody names them as a
    bootstrap entry, and the two reachable nodes relay for them; started as written, every node
    has the three others as peers, the two clients each other through a relay, and every node
    finishes its rounds."""
    for index in range(4):
        write_digit_pngs(tmp_path / "images" / f"device{index}", (0, 1, 2), part=index, parts=4, per_class=12)
    code, paths, err = init(
        capsys,
        *("--nodes", "4", "--out", str(tmp_path / "fleet"), "--port", str(free_ports(8)), "--behind-nat", "2,3"),
        *("--data-per-node", str(tmp_path / "images"), "--image-size", "8", "--backbone", "mlp"),
        *("--rounds", "2", "--set", "warmup_rounds=1"),
    )
    assert code == 0, err
    configs = [load_config(path) for path in paths]
    reachable = {config.identity.public_key for config in configs[:2]}
    for index, config in enumerate(configs):
        client = index >= 2
        assert config.node.client_mode is client and (config.node.listen is None) is client
        named = {key for _, key in config.discovery.bootstrap_peers()}
        assert named == reachable - {config.identity.public_key}
        assert config.algorithm.start_peers == 3 and config.relay.enabled is not client
    statuses = run_fleet([tmp_path / "fleet" / f"node{index}" for index in range(4)])
    assert [status["peer_count"] for status in statuses] == [3, 3, 3, 3]
    routes = [{peer["route"] for peer in status["peers"]} for status in statuses[2:]]
    assert all(any(route.startswith("relay:") for route in each) for each in routes), routes
    assert [status["reachability"]["state"] for status in statuses][2:] == ["client", "client"]
    assert all(len(status["learning"]["history"]) == 2 for status in statuses)
    assert main(["init", "--nodes", "2", "--out", str(tmp_path / "x"), "--behind-nat", "0,1"]) == 2
