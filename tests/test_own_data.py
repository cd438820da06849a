"""A device's own data ([data].path): the image-folder and .npz loaders, what a config check
refuses (exit 2, naming the field) and what only loading finds (exit 1), the class list that
networks agree on, and three daemons that learn from folders of real digit PNGs."""

import time
import zipfile

import numpy as np
import pytest
import trio
from PIL import Image

from algorithms.data.datasets import load_dataset
from algorithms.data.own_data import OwnDataError, OwnDataSpec, held_out_count, held_out_split, load_own_data
from p2pnode.config import ConfigError, load_config
from p2pnode.discovery.capabilities import announced_labels, labels_capability

from .helpers import (
    ANY_PORT,
    DIGITS,
    full_mesh,
    own_data_sections,
    start_node,
    wait_until,
    write_config,
    write_digit_pngs,
)


def spec(path, **changes) -> OwnDataSpec:
    return OwnDataSpec(path=path, class_names=DIGITS, **{"image_size": 8, **changes})


# --- the loaders --------------------------------------------------------------------------


def test_held_out_split_is_stratified_seeded_and_keeps_a_lone_image_for_training():
    labels = np.array([0] * 10 + [1] * 5 + [2])
    train, test = held_out_split(labels, 0.2, seed=3)
    assert sorted(np.concatenate([train, test])) == list(range(16))
    assert [int((labels[test] == k).sum()) for k in range(3)] == [2, 1, 0]
    assert 15 in train  # the class of one image is trained on, not tested
    again = held_out_split(labels, 0.2, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip((train, test), again, strict=True))
    assert not np.array_equal(held_out_split(labels, 0.2, seed=4)[1], test)
    assert [held_out_count(n, 0.2) for n in (1, 2, 3, 10, 11)] == [0, 1, 1, 2, 2]
    assert held_out_count(4, 0.9) == 3  # never the last training image


def test_a_damaged_image_stops_the_load_or_with_skip_damaged_is_skipped_and_named(tmp_path):
    """Issue #28: one unreadable file (not an image) and one whose pixels are cut off (its
    header reads, its data does not) among real digits."""
    written = write_digit_pngs(tmp_path, (2, 7), per_class=10)
    (tmp_path / "2" / "junk.png").write_bytes(b"not an image at all")
    whole = next((tmp_path / "7").glob("*.png")).read_bytes()
    (tmp_path / "7" / "cut.png").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(OwnDataError, match=r"junk\.png is not a readable image"):
        load_own_data(spec(tmp_path))
    damaged: list[str] = []
    train, test = load_own_data(spec(tmp_path, skip_damaged=True), damaged)
    assert len(train.labels) + len(test.labels) == written
    assert len(damaged) == 2 and "junk.png" in damaged[0] and "cut.png could not be decoded" in damaged[1], damaged


def test_an_image_folder_loads_as_the_digits_it_was_made_of(tmp_path):
    written = write_digit_pngs(tmp_path, (2, 7), per_class=20)
    train, test = load_own_data(spec(tmp_path, test_fraction=0.25))
    assert written == 40 and len(train) == 30 and len(test) == 10
    assert train.images.shape[1:] == (1, 8, 8) and train.images.dtype == np.float32
    # Folder "2" is class 2 and "7" class 7: ids are positions in class_names, not folder order.
    assert set(train.labels) == set(test.labels) == {2, 7}
    assert [int((test.labels == k).sum()) for k in (2, 7)] == [5, 5]
    # The pixels are the digits' own, up to the PNG's 8 bits.
    digits = load_dataset("digits")
    first = sorted((tmp_path / "2").iterdir())[0]
    original = digits.train.images[int(first.stem), 0]
    assert np.abs(np.asarray(Image.open(first)) / 255 - original).max() < 1 / 255 + 1e-6
    # Another class order gives other ids for the same folders.
    reordered = load_own_data(OwnDataSpec(tmp_path, ("7", "2"), image_size=8))[0]
    assert set(reordered.labels) == {0, 1}


def test_an_image_folder_is_resized_and_converted_as_configured(tmp_path):
    write_digit_pngs(tmp_path, (0, 1), per_class=6)
    rgb = Image.new("RGB", (40, 30), (255, 0, 0))
    rgb.save(tmp_path / "1" / "red.jpg")
    (tmp_path / "1" / "notes.txt").write_text("not an image: skipped")
    (tmp_path / "1" / "._0000.png").write_bytes(b"macOS metadata: hidden, skipped")
    train, test = load_own_data(spec(tmp_path, image_size=28, channels=3))
    assert train.images.shape[1:] == (3, 28, 28) and len(train) + len(test) == 13
    assert train.images.min() >= 0.0 and train.images.max() <= 1.0


def test_a_npz_loads_with_and_without_its_own_test_part(tmp_path):
    digits = load_dataset("digits")
    x = np.round(digits.train.images[:200, 0] * 255).astype(np.uint8)  # N×H×W, uint8
    y = digits.train.labels[:200]
    np.savez(tmp_path / "split.npz", x=x, y=y)
    train, test = load_own_data(spec(tmp_path / "split.npz"))
    assert len(train) + len(test) == 200 and train.images.shape[1:] == (1, 8, 8)
    assert abs(len(test) - 40) <= 10  # 0.2 of each class
    np.savez_compressed(
        tmp_path / "both.npz",
        x=digits.train.images[:150],
        y=y[:150],
        x_test=digits.train.images[150:200],
        y_test=y[150:200],
    )
    train, test = load_own_data(spec(tmp_path / "both.npz"))
    assert len(train) == 150 and len(test) == 50
    np.testing.assert_array_equal(test.images, digits.train.images[150:200])


def test_what_only_loading_finds(tmp_path):
    """Pixel values are read when the node loads its data: a config check passes them."""
    images = np.full((20, 1, 8, 8), 0.5, np.float32)
    images[3, 0, 2, 2] = np.nan
    np.savez(tmp_path / "nan.npz", x=images, y=np.arange(20) % 2)
    with pytest.raises(OwnDataError, match="NaN"):
        load_own_data(spec(tmp_path / "nan.npz"))
    np.savez(tmp_path / "range.npz", x=np.full((20, 8, 8), 255.0), y=np.arange(20) % 2)
    with pytest.raises(OwnDataError, match=r"scaled to \[0, 1\]"):
        load_own_data(spec(tmp_path / "range.npz"))
    folder = tmp_path / "folder"
    write_digit_pngs(folder, (4, 5), per_class=5)
    png = sorted((folder / "4").iterdir())[0]
    png.write_bytes(png.read_bytes()[:-30])  # the header is intact, the pixels are cut short
    with pytest.raises(OwnDataError, match="could not be decoded"):
        load_own_data(spec(folder))


# --- what a config check refuses ------------------------------------------------------------


def data_problems(tmp_path, name: str, algorithm: str = "mapl", **data) -> str:
    sections = {"data": data, "model": {"backbone": "mlp"}, "algorithm": {"name": algorithm}}
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path / name, "tcp://127.0.0.1:7000", **sections))
    return "\n".join(caught.value.problems)


def test_config_refuses_bad_image_folders_naming_the_field(tmp_path):
    names = list(DIGITS)
    (tmp_path / "empty").mkdir()
    write_digit_pngs(tmp_path / "one", (3,), per_class=5)
    write_digit_pngs(tmp_path / "bad", (3, 4), per_class=5)
    (tmp_path / "bad" / "4" / "broken.png").write_bytes(b"not a png at all")
    (tmp_path / "bad" / "3" / "torn.png").write_bytes(b"\x89PNG torn")
    write_digit_pngs(tmp_path / "typo", (3,), per_class=5)
    (tmp_path / "typo" / "seven").mkdir()
    for png in (tmp_path / "typo" / "3").iterdir():
        (tmp_path / "typo" / "seven" / png.name).write_bytes(png.read_bytes())
    write_digit_pngs(tmp_path / "lonely", (3, 4), per_class=1)
    (tmp_path / "hollow" / "3").mkdir(parents=True)
    write_digit_pngs(tmp_path / "hollow", (4,), per_class=3)
    cases = {
        "missing": (str(tmp_path / "nowhere"), "[data].path: ", "does not exist"),
        "empty": (str(tmp_path / "empty"), "[data].path: ", "holds no class folders"),
        "one": (str(tmp_path / "one"), "[data].path: ", "images of 1 class ('3'); a node needs at least 2"),
        # every unreadable file named, and the setting that would leave them out
        "bad": (str(tmp_path / "bad"), "[data].path: ", "2 of its images cannot be read: "),
        "typo": (str(tmp_path / "typo"), "[data].path: ", "class folders ['seven']"),
        "lonely": (str(tmp_path / "lonely"), "[data].path: ", "none can be held out for testing"),
        "hollow": (str(tmp_path / "hollow"), "[data].path: ", "holds no images (.png"),
    }
    for name, (path, field, words) in cases.items():
        text = data_problems(tmp_path, name, path=path, class_names=names)
        assert field in text and words in text, (name, text)
    text = data_problems(tmp_path, "bad", path=str(tmp_path / "bad"), class_names=names)
    assert "torn.png is not a readable image" in text and "broken.png is not a readable image" in text
    assert "([data].skip_damaged = true leaves them out)" in text
    # A bound on memory, checked before any image is decoded: 10 images of 3×1024×1024 floats are 120 MB.
    write_digit_pngs(tmp_path / "big", (0, 1), per_class=10)
    text = data_problems(
        tmp_path, "big", path=str(tmp_path / "big"), class_names=names, image_size=1024, channels=3, max_memory_mb=64
    )
    assert "[data].max_memory_mb: " in text and "take 120 MB as float32, more than [data].max_memory_mb (64)" in text


def test_config_refuses_bad_npz_files_naming_the_field(tmp_path):
    names = list(DIGITS)
    x, y = np.zeros((20, 8, 8), np.uint8), np.arange(20) % 3
    files = {
        "keys": ({"x": x, "labels": y}, "holds labels.npy"),
        "no_y": ({"x": x}, "lacks the array(s) y"),
        "half_test": ({"x": x, "y": y, "x_test": x}, "lacks the array(s) y_test"),
        "last": ({"x": np.zeros((20, 8, 8, 3), np.uint8), "y": y}, "channels last? store x.transpose(0, 3, 1, 2)"),
        "int16": ({"x": x.astype(np.int16), "y": y}, "x is int16; store images as uint8"),
        "float_y": ({"x": x, "y": y.astype(np.float32)}, "y is float32; labels are integer class ids"),
        "count": ({"x": x, "y": y[:19]}, "expected (20,), one label per image"),
        "range": ({"x": x, "y": y + 9}, "y holds label 10; labels are positions in [data].class_names, 0 to 9"),
        "object": ({"x": np.array([None] * 20, dtype=object), "y": y}, "x is object"),
        "tiny": ({"x": np.zeros((20, 4, 4), np.uint8), "y": y}, "sides from 8 to 1024"),
    }
    for name, (arrays, words) in files.items():
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        text = data_problems(tmp_path, name, path=str(path), class_names=names)
        assert f"[data].path: {path}" in text and words in text, (name, text)
    (tmp_path / "zip.npz").write_bytes(b"PK not really")
    text = data_problems(tmp_path, "zip", path=str(tmp_path / "zip.npz"), class_names=names)
    assert "is not a readable .npz file" in text, text
    with zipfile.ZipFile(tmp_path / "txt.npz", "w") as archive:
        archive.writestr("x.npy", b"not an array")
        archive.writestr("y.npy", b"not an array")
    text = data_problems(tmp_path, "txt", path=str(tmp_path / "txt.npz"), class_names=names)
    assert "is not a readable .npz file" in text, text
    np.savez(tmp_path / "own.npz", x=x, y=y, x_test=x, y_test=y)
    text = data_problems(tmp_path, "own", path=str(tmp_path / "own.npz"), class_names=names, test_fraction=0.3)
    assert "[data].test_fraction: " in text and "has its own test part" in text, text


def test_own_data_and_benchmark_options_do_not_mix(tmp_path):
    write_digit_pngs(tmp_path / "d", (0, 1), per_class=3)
    folder = str(tmp_path / "d")
    text = data_problems(tmp_path, "a", path=folder, class_names=list(DIGITS), dataset="digits", nodes=3)
    assert "[data].dataset: a benchmark option, but [data].path" in text
    assert "[data].nodes: a benchmark option" in text
    text = data_problems(tmp_path, "b", path=folder)
    assert "[data].class_names: required with [data].path" in text, text
    text = data_problems(tmp_path, "c", algorithm="none", class_names=["a", "b"], test_fraction=0.1)
    assert "[data].class_names: applies only with [data].path" in text
    assert "[data].test_fraction: applies only with [data].path" in text
    np.savez(tmp_path / "x.npz", x=np.zeros((4, 8, 8), np.uint8), y=np.arange(4) % 2)
    text = data_problems(tmp_path, "d", path=str(tmp_path / "x.npz"), class_names=["a", "b"], image_size=28)
    assert "[data].image_size: applies to an image folder only" in text
    text = data_problems(tmp_path, "e", path=folder, class_names=list(DIGITS), channels=2)
    assert "[data].channels: must be 1 or 3, got 2" in text
    text = data_problems(tmp_path, "f", path=folder, class_names=["0", "1", "../x"])
    assert "[data].class_names: entry 3" in text, text
    # A node that learns nothing does not list its data; a valid one loads.
    sections = {"data": {"path": folder, "class_names": list(DIGITS)}, "algorithm": {"name": "mapl"}}
    config = load_config(write_config(tmp_path / "ok", "tcp://127.0.0.1:7000", **sections))
    assert config.data.own_data().image_size == 28 and config.data.own_data().channels == 1


def test_the_class_list_is_announced_so_only_nodes_that_agree_learn_together():
    first = labels_capability(DIGITS)
    assert first == labels_capability(tuple(DIGITS)) and len(first) == 1
    assert labels_capability(tuple(reversed(DIGITS))) != first  # ids are positions: order matters
    assert labels_capability(()) == ()  # a benchmark dataset announces none
    assert announced_labels(("algorithm:mapl", *first, "gpu")) == first


# --- daemons --------------------------------------------------------------------------------


async def test_nodes_whose_class_lists_differ_are_not_learning_peers(tmp_path, caplog):
    write_digit_pngs(tmp_path / "data", (0, 1, 2), per_class=10)
    data = tmp_path / "data"
    reordered = ("1", "0", *DIGITS[2:])  # the same names, other ids
    async with trio.open_nursery() as nursery:
        # c joins first, so a and b have seen it before their first round.
        c = await start_node(nursery, tmp_path / "c", **own_data_sections(data, reordered, start_peers=0))
        a = await start_node(nursery, tmp_path / "a", [c.address], **own_data_sections(data, start_peers=1))
        b = await start_node(nursery, tmp_path / "b", [c.address], **own_data_sections(data, start_peers=1))
        await wait_until(lambda: full_mesh([a, b, c]), timeout=30)
        await wait_until(lambda: all(n.driver.phase == "done" for n in (a, b, c)), timeout=60)
        for node, learning_peers in ((a, 1), (b, 1), (c, 0)):
            history = node.status()["learning"]["history"]
            assert [entry["expected"] for entry in history] == [learning_peers] * 2, history
            assert len(node.status()["peers"]) == 2  # every node is a peer all the same
        assert c.identity.node_id not in a.status()["learning"]["neighbours"]
        assert f"peer {c.identity.node_id} is not a learning peer: it learns over other classes" in caplog.text
        assert "this node's [data].class_names: ['0', '1', '2'," in caplog.text  # names the list that differs
        assert a.status()["learning"]["excluded"] == {
            c.identity.node_id: a.learning_peers.excluded()[c.identity.node_id]
        }
        for node in (a, b, c):
            node.request_stop()


async def test_damaged_pixels_stop_the_start_with_the_field_to_look_at(tmp_path):
    from p2pnode.node import Node, NodeStartError

    images = np.full((20, 8, 8), 0.5, np.float32)
    images[0, 0, 0] = np.inf
    np.savez(tmp_path / "inf.npz", x=images, y=np.arange(20) % 2)
    sections = own_data_sections(tmp_path / "inf.npz", ("a", "b"), start_peers=0)
    del sections["data"]["image_size"]
    config = load_config(write_config(tmp_path / "n", ANY_PORT, **sections))  # the check passes ...
    with trio.fail_after(60), pytest.raises(NodeStartError) as caught:  # ... loading does not
        await Node(config).run()
    assert str(caught.value).startswith("[data].path: ") and "NaN or infinite" in str(caught.value)
    assert not config.control_socket.exists()


def test_three_daemons_learn_from_their_own_folders_of_digit_pngs(tmp_path):
    """The issue's done-when: real digit images as PNG folders, three class subsets that overlap
    in one class each (its images split, never shared), three `p2pnode start` processes with
    `[data] path`: every round completes with both peers' payloads, and each node predicts its
    own test images far above chance. All rounds but the last are MAPL's warm-up (all-to-all),
    so what is checked is the exchange, not which neighbours its graph learning picks."""
    from testnet.launch.cluster import Cluster
    from testnet.launch.learning import DISCOVERY

    subsets = ((0, 1, 2, 3), (3, 4, 5, 6), (6, 7, 8, 9))
    rounds = 5
    for index, classes in enumerate(subsets):
        for k in classes:
            owners = [node for node, owned in enumerate(subsets) if k in owned]  # two owners: half each
            write_digit_pngs(tmp_path / f"images{index}", (k,), part=owners.index(index), parts=len(owners))

    def sections(index: int) -> dict:
        document = own_data_sections(tmp_path / f"images{index}", rounds=rounds)
        document["algorithm"].update(start_timeout_s=120.0, round_deadline_s=10.0)
        return document

    with Cluster.prepare(tmp_path / "net", 3, discovery=DISCOVERY, extra=sections) as cluster:
        cluster.start_all()
        deadline = time.monotonic() + 120
        while not all((s := cluster.status(spec)) and s["learning"]["phase"] == "done" for spec in cluster.specs):
            assert all(cluster.alive(spec) for spec in cluster.specs), [
                spec.log_path.read_text() for spec in cluster.specs
            ]
            assert time.monotonic() < deadline, [cluster.status(spec) for spec in cluster.specs]
            time.sleep(0.3)
        statuses = [cluster.status(spec)["learning"] for spec in cluster.specs]
    for classes, status in zip(subsets, statuses, strict=True):
        history = status["history"]
        assert len(history) == rounds and status["completed"] == rounds
        warmup, last = history[:-1], history[-1]  # the last round learns the graph
        assert all(entry["expected"] == entry["arrived"] == entry["recipients"] == 2 for entry in warmup), history
        assert last["expected"] == last["arrived"], history
        sent = sum(entry["recipients"] for entry in history)
        assert last["sent"]["PROTOTYPES"][0] == sent  # [messages, bytes, payload bytes]
        # (After the last round's graph learning each node weighs whom it learned to trust; on
        # these easy class subsets that is often itself alone, so its row is not checked.)
        chance = 1 / len(classes)
        assert status["accuracy"] > 0.8 > 3 * chance, (status["accuracy"], chance)
