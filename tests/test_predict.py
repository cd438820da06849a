"""Using a node's model (issue #28): `p2pnode predict` through the running node and from its
checkpoint, and the program `p2pnode export` writes, loaded by plain torch in a Python that
never imports p2pnode, agree with the node's own last evaluation on every held-out image."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import trio

from p2pnode.config import load_config
from p2pnode.learning.checkpoint import CHECKPOINT_NAME, Checkpoint
from p2pnode.serving.predict import PREDICT
from p2pnode_cli import main

from .helpers import DIGITS, held_out_files, own_data_sections, start_node, wait_until, write_digit_pngs

ROOT = Path(__file__).resolve().parent.parent
# docs/usage.md's example, as it stands, then a check that nothing of this project came in.
(PLAIN_TORCH,) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "usage.md").read_text(), flags=re.S)
PLAIN_TORCH += """
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("p2pnode", "algorithms", "protocol", "testnet", "tools"))
assert not ours, ours
"""


def predict(capsys, *argv: str) -> tuple[int, dict | str, str]:
    code = main(["predict", *argv])
    printed = capsys.readouterr()
    return code, json.loads(printed.out) if "--json" in argv else printed.out, printed.err


async def test_predict_and_export_agree_with_the_nodes_own_evaluation(tmp_path, capsys):
    write_digit_pngs(tmp_path / "images", range(10), per_class=20)
    sections = own_data_sections(tmp_path / "images", rounds=3, start_peers=0)
    sections["algorithm"].update(name="mapl-dual", checkpoint=True)  # three predictors; the ensemble is reported
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes((tmp_path / "images" / "0" / "0000.png").read_bytes()[:60])
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, tmp_path / "node", **sections)
        config_path = str(node.config.source)
        files, labels = held_out_files(node.config)
        await wait_until(lambda: node.driver is not None and node.driver.phase == "done", timeout=60)
        held_out = node.driver.held_out
        assert list(held_out.labels) == labels  # the files are the node's test split, in its order
        evaluated = [DIGITS[k] for k in held_out.predicted]
        assert node.status()["learning"]["accuracy"] == np.mean(np.array(held_out.predicted) == labels)

        code, report, _ = await trio.to_thread.run_sync(predict, capsys, "--config", config_path, "--json", *files)
        assert code == 0 and report["source"] == "node" and report["predictor"] == "ensemble"
        assert [entry["class_name"] for entry in report["predictions"]] == evaluated  # 100 %
        assert all(entry["round"] == 2 for entry in report["predictions"])
        served = [entry["probability"] for entry in report["predictions"]]  # the softmax's, checked below
        known = ["known" if entry["known"] else "unknown" for entry in report["predictions"]]  # as is this

        # A damaged file is named and skipped, the others answered, and the exit status says so.
        code, out, err = await trio.to_thread.run_sync(predict, capsys, "--config", config_path, files[0], str(damaged))
        assert code == 1 and f"skipped {damaged}: image could not be decoded" in err
        assert "1 of 2 files could not be classified" in err
        (line,) = out.splitlines()
        name, class_name, probability = line.split("\t")[:3]  # then why, for an image not of its classes
        assert (name, class_name) == (files[0], evaluated[0]) and abs(float(probability) - served[0]) < 1e-3
        node.request_stop()

    # No node runs now: the checkpoint answers, rebuilt as the configuration describes. It keeps
    # the last evaluation image by image too.
    config = load_config(config_path)
    assert Checkpoint.load(config.node.data_dir / CHECKPOINT_NAME, "mapl-dual").held_out == held_out
    code, report, _ = predict(capsys, "--config", config_path, "--json", *files)
    assert code == 0 and report["source"] == "checkpoint" and report["round"] == 2
    assert [entry["class_name"] for entry in report["predictions"]] == evaluated

    out = tmp_path / "model.pt2"
    assert main(["export", "--config", config_path, "--out", str(out)]) == 0
    metadata = json.loads((tmp_path / "model.pt2.json").read_text())
    assert metadata["class_names"] == list(DIGITS) and metadata["predictor"] == "ensemble"
    assert metadata["input"]["channels"] == 1 and metadata["input"]["height"] == metadata["input"]["width"] == 8
    plain = subprocess.run(
        [sys.executable, "-c", PLAIN_TORCH, *files],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the checkout: nothing of it on the path
        env={"PATH": "/usr/bin:/bin"},
    )
    assert plain.returncode == 0, plain.stderr
    lines = [line.split(" ") for line in plain.stdout.splitlines()]
    assert [path for path, _, _, _ in lines] == files
    assert [class_name for _, class_name, _, _ in lines] == evaluated
    # Each probability `predict` gave is the model's softmax for that image, as plain torch computes
    # it from the exported program (to its 4 printed digits), and the exported rule calls the same
    # images not one of the node's classes.
    assert all(abs(float(p) - q) < 1e-4 + 1e-6 for (_, _, p, _), q in zip(lines, served, strict=True)), (lines, served)
    assert [verdict for _, _, _, verdict in lines] == known


async def test_predict_refusals_are_clear(tmp_path, capsys):
    """No node and no checkpoint yet; a request past the control command's bounds."""
    from p2pnode.operations.control import request

    write_digit_pngs(tmp_path / "images", (0, 1), per_class=5)
    sections = own_data_sections(tmp_path / "images", rounds=1, start_peers=0)
    sections["node"] = {"predict_max_images": 2, "predict_max_image_mb": 0.001}
    sections["algorithm"].update(name="local", checkpoint=True, settings={})
    image = str(next((tmp_path / "images" / "0").iterdir()))
    async with trio.open_nursery() as nursery:
        node = await start_node(nursery, tmp_path / "node", **sections)
        config_path = str(node.config.source)
        ask = lambda images: request(node.config.control_socket, PREDICT, images=images)  # noqa: E731
        answer = await trio.to_thread.run_sync(ask, ["aGVsbG8="] * 3)
        assert not answer["ok"] and "at most [node].predict_max_images (2)" in answer["error"]
        answer = await trio.to_thread.run_sync(ask, ["A" * 2000])
        assert not answer["ok"] and "larger than [node].predict_max_image_mb (0.001 MB)" in answer["error"]
        answer = await trio.to_thread.run_sync(ask, ["not base64!"])
        assert not answer["ok"] and "image 0 is not base64" in answer["error"]
        node.request_stop()
    config = load_config(config_path)
    (config.node.data_dir / "checkpoint.pt").unlink(missing_ok=True)  # if its first round ended
    big = tmp_path / "big.png"
    big.write_bytes(b"\x89PNG" + bytes(2000))
    code, _, err = predict(capsys, "--config", config_path, image, str(big))
    assert code == 1 and "no checkpoint yet" in err and "p2pnode start" in err
    code, _, err = predict(capsys, "--config", config_path, str(big), str(tmp_path / "missing.png"))
    assert code == 1 and f"skipped {big}: larger than [node].predict_max_image_mb (0.001 MB)" in err
    assert f"skipped {tmp_path / 'missing.png'}: cannot be read" in err
    # Export into a folder that is not there: said at once, before any of its work.
    assert main(["export", "--config", config_path, "--out", str(tmp_path / "absent" / "model.pt2")]) == 1
    assert f"{tmp_path / 'absent'} is not a folder (create it first)" in capsys.readouterr().err


def test_every_algorithm_evaluates_what_it_predicts_with_and_training_leaves_the_kept_copy_alone():
    """`evaluate` scores `predictors()` (its `predicted` is their argmax on the test split);
    the copy the node answers `predict` with is the evaluated model, whatever training does next."""
    import torch

    from algorithms.data.setup import ScenarioSpec, build_setup
    from algorithms.models.inference import EvaluatedModel
    from algorithms.registry import ALGORITHMS, make_algorithm

    scenario = ScenarioSpec("digits", "1", nodes=2, samples_per_class=10, test_per_class=5)
    for name in ALGORITHMS:
        setup = build_setup(scenario, 0, "n0", backbone="mlp")
        algorithm = make_algorithm(name, setup)
        algorithm.local_step(0)
        evaluation = algorithm.evaluate()
        kept = EvaluatedModel()
        kept.keep(algorithm.predictors(), 0)
        round, predictors = kept.latest()
        images = setup.data.test_images
        with torch.no_grad():
            before = predictors(images)
        assert tuple(before.argmax(1).tolist()) == evaluation.predicted, name
        algorithm.local_step(1)  # the live model moves on ...
        with torch.no_grad():
            assert torch.equal(predictors(images), before), name  # ... the copy handed out does not
        assert round == 0 and kept.latest()[1] is predictors  # built once per evaluation
        kept.keep(algorithm.predictors(), 1)
        assert kept.latest()[0] == 1 and kept.latest()[1] is not predictors
