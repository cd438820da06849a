"""Your own model (issue #45): `[model].backbone = "module:callable"` from a Python file, and
`[model].weights` to start from, in the simulator, in daemons, and through `predict` and
`export`; what does not fit is a clear error naming it."""

import json
import textwrap

import numpy as np
import pytest
import torch
import trio
from PIL import Image
from torch import nn

from algorithms.models.personal import make_backbone
from algorithms.models.user_backbone import BackboneError, BackboneFiles, UserBackbone
from p2pnode.config import ConfigError, load_config
from p2pnode_cli import main

from .helpers import (
    ANY_PORT,
    DIGITS,
    bootstrap_entry,
    own_data_sections,
    start_node,
    wait_until,
    write_config,
    write_digit_pngs,
)

# A user's file: a small conv net whose classifier is left out, as one would replace a
# torchvision model's `fc` with nn.Identity(); its feature size (8 × 2 × 2) is ours to find.
USER_FILE = textwrap.dedent(
    """
    from torch import nn

    def backbone():
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten()
        )

    def not_a_module():
        return 42
    """
)


def user_code(folder, module: str):
    """`folder`/`module`.py as a user writes it, and weights for it saved as a user saves them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(USER_FILE)
    with torch.random.fork_rng():
        torch.manual_seed(7)  # weights of their own, not those a fresh build draws
        pretrained = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten()
        )
    torch.save(pretrained.state_dict(), folder / "pretrained.pt")
    return folder / "pretrained.pt"


def test_a_user_backbone_maps_to_the_latent_size_and_starts_from_its_weights(tmp_path):
    weights = user_code(tmp_path, "user_net_unit")
    backbone = make_backbone("user_net_unit:backbone", (1, 8, 8), 16, BackboneFiles(tmp_path, weights))
    assert isinstance(backbone, UserBackbone) and backbone.adapter.in_features == 8 * 2 * 2
    saved = torch.load(weights)
    assert all(torch.equal(tensor, saved[name]) for name, tensor in backbone.body.state_dict().items())
    assert backbone(torch.rand(5, 1, 8, 8)).shape == (5, 16)
    # A built-in backbone starts from weights too: these are the mlp's own, saved and changed.
    mlp = make_backbone("mlp", (1, 8, 8), 16)
    state = {name: torch.full_like(tensor, 0.5) for name, tensor in mlp.state_dict().items()}
    torch.save(state, tmp_path / "mlp.pt")
    again = make_backbone("mlp", (1, 8, 8), 16, BackboneFiles(weights=tmp_path / "mlp.pt"))
    assert all(torch.all(tensor == 0.5) for tensor in again.state_dict().values() if tensor.is_floating_point())


def test_what_does_not_fit_is_named(tmp_path):
    weights = user_code(tmp_path, "user_net_refusals")
    with pytest.raises(BackboneError, match="cannot import 'no_such_module'"):
        make_backbone("no_such_module:backbone", (1, 8, 8), 16, BackboneFiles(tmp_path))
    with pytest.raises(BackboneError, match="has no callable 'missing'"):
        make_backbone("user_net_refusals:missing", (1, 8, 8), 16, BackboneFiles(tmp_path))
    with pytest.raises(BackboneError, match=r"returned int, not a torch\.nn\.Module"):
        make_backbone("user_net_refusals:not_a_module", (1, 8, 8), 16, BackboneFiles(tmp_path))
    with pytest.raises(BackboneError, match=r"cannot take images of 3×8×8"):
        make_backbone("user_net_refusals:backbone", (3, 8, 8), 16, BackboneFiles(tmp_path))
    not_fitting = r"14 not in the file \(layers\.1\.weight, .*; 7 not in the backbone \(0\.weight, 0\.bias, 1\.w"
    with pytest.raises(BackboneError, match=not_fitting):
        make_backbone("mlp", (1, 8, 8), 16, BackboneFiles(weights=weights))  # the user net's, not the mlp's
    torch.save({"0.weight": torch.zeros(4, 1, 3, 3)}, tmp_path / "narrow.pt")
    with pytest.raises(BackboneError, match=r"of another shape \(0\.weight \(4, 1, 3, 3\) ≠ \(8, 1, 3, 3\)\)"):
        make_backbone("user_net_refusals:backbone", (1, 8, 8), 16, BackboneFiles(tmp_path, tmp_path / "narrow.pt"))
    (tmp_path / "code.pt").write_bytes(b"not a torch file")
    with pytest.raises(BackboneError, match="not a state dict torch loads"):
        make_backbone("mlp", (1, 8, 8), 16, BackboneFiles(weights=tmp_path / "code.pt"))


def test_a_config_naming_a_backbone_it_cannot_import_is_refused_at_load(tmp_path):
    user_code(tmp_path / "node", "user_net_config")
    sections = own_data_sections(tmp_path / "images", start_peers=0)
    write_digit_pngs(tmp_path / "images", (0, 1), per_class=5)
    sections["model"].update(backbone="user_net_config:absent", weights="missing.pt")
    path = write_config(tmp_path / "node", ANY_PORT, **sections)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert "[model].backbone: backbone 'user_net_config:absent': user_net_config has no callable" in str(refused.value)
    assert "[model].weights:" in str(refused.value) and "missing.pt is not a file" in str(refused.value)


def test_simulate_runs_a_user_backbone_from_the_current_folder(tmp_path, monkeypatch, capsys):
    weights = user_code(tmp_path / "work", "user_net_simulate")
    monkeypatch.chdir(tmp_path / "work")
    argv = ["simulate", "--algorithm", "mapl-auto", "--dataset", "digits", "--nodes", "2", "--rounds", "2"]
    argv += ["--samples-per-class", "5", "--test-per-class", "5", "--out", str(tmp_path / "out")]
    assert main([*argv, "--backbones", "user_net_simulate:backbone", "--weights", str(weights)]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["backbones"] == ["user_net_simulate:backbone"] * 2
    assert main([*argv, "--backbones", "user_net_simulate:nothing"]) == 2
    assert "--backbones: backbone 'user_net_simulate:nothing'" in capsys.readouterr().err


async def test_a_node_learns_predicts_and_exports_with_its_own_backbone_and_weights(tmp_path, capsys):
    """Two nodes of MAPL-Auto, each on its own digit images, with the user's backbone from a file
    beside its config and pretrained weights: they learn, `predict` answers from the checkpoint,
    and the program `export` writes gives what `predict` gives, loaded by plain torch."""
    write_digit_pngs(tmp_path / "images", range(4), per_class=30)
    nodes = []
    async with trio.open_nursery() as nursery:
        for name in ("a", "b"):
            user_code(tmp_path / name, "user_net_daemon")  # beside its config: [model].code's default
            sections = own_data_sections(tmp_path / "images", DIGITS[:4], rounds=8, start_peers=1)
            sections["model"].update(backbone="user_net_daemon:backbone", weights="pretrained.pt")
            sections["algorithm"].update(name="mapl-auto", checkpoint=True, settings={"warmup_rounds": 2})
            bootstrap = [bootstrap_entry(nodes[0])] if nodes else []
            nodes.append(await start_node(nursery, tmp_path / name, bootstrap, **sections))
        await wait_until(lambda: all(n.driver is not None and n.driver.phase == "done" for n in nodes), timeout=90)
        for node in nodes:
            assert node.status()["learning"]["accuracy"] > 0.5  # four classes: chance is 1/4
            node.request_stop()
    config = str(nodes[0].config.source)
    images = sorted((tmp_path / "images" / "2").iterdir())[:4]
    assert main(["predict", "--config", config, "--json", *map(str, images)]) == 0
    answers = json.loads(capsys.readouterr().out)["predictions"]
    assert main(["export", "--config", config, "--out", str(tmp_path / "model.pt2")]) == 0
    meta = json.loads((tmp_path / "model.pt2.json").read_text())
    assert meta["backbone"] == "user_net_daemon:backbone"
    # The exported program, in plain torch, gives each image the class and probability predict gave.
    program, size = torch.export.load(tmp_path / "model.pt2").module(), meta["input"]
    for path, answer in zip(images, answers, strict=True):
        pixels = np.asarray(Image.open(path).convert(size["color_mode"]).resize((size["width"], size["height"])))
        x = pixels.astype(np.float32).reshape(size["height"], size["width"], -1) / size["divide_by"] - size["mean"]
        probabilities = torch.softmax(
            program(torch.from_numpy((x / size["std"]).astype(np.float32)).permute(2, 0, 1)[None]), dim=1
        )[0]
        assert meta["class_names"][int(probabilities.argmax())] == answer["class_name"]
        assert float(probabilities.max()) == pytest.approx(answer["probability"], abs=1e-4)
