"""What a reader gets from a run: provenance, intervals, the plots and report.md."""

import json
import math
import subprocess

import numpy as np
import pytest

from p2pnode.learning.rounds import right_bits, right_from_bits
from testnet.reporting.intervals import SMALL_FLEET, images_bootstrap, paired_bootstrap, paired_difference, wilson
from testnet.reporting.plots import PLOTS
from testnet.reporting.provenance import PACKAGES, git_state, provenance


def test_wilson_against_hand_computed_values():
    # 60 of 75, z = 1.959964: centre (0.8 + z²/150) / (1 + z²/75) = 0.785380, half-width
    # z / (1 + z²/75) · sqrt(0.8 · 0.2 / 75 + z² / (4 · 75²)) = 0.089496.
    low, high = wilson(60, 75)
    assert low == pytest.approx(0.695887, abs=1e-6) and high == pytest.approx(0.874879, abs=1e-6)
    # At the edges the interval touches 0 or 1 exactly and is not degenerate.
    assert wilson(0, 10) == (0.0, pytest.approx(0.277533, abs=1e-6))
    assert wilson(10, 10) == (pytest.approx(0.722467, abs=1e-6), 1.0)
    # A wider confidence gives a wider interval; more images a narrower one.
    assert wilson(60, 75, 0.99)[0] < low and wilson(600, 750)[1] - wilson(600, 750)[0] < high - low
    with pytest.raises(ValueError):
        wilson(5, 0)


def test_paired_bootstrap_against_known_values():
    # A constant difference: every resample sees it.
    mean, low, high = paired_bootstrap([0.9, 0.8, 0.7], [0.85, 0.75, 0.65])
    assert (mean, low, high) == pytest.approx((0.05, 0.05, 0.05))
    # Differences 1, 0, 0: the resampled mean is k/3 with k ~ Binomial(3, 1/3); P(k = 0) = 8/27
    # and P(k = 3) = 1/27, both above 2.5 %, so the 95 % interval is exactly [0, 1].
    assert paired_bootstrap([1, 0, 0], [0, 0, 0]) == pytest.approx((1 / 3, 0.0, 1.0))
    # Nodes without an accuracy are left out of the pairs.
    difference = paired_difference([0.9, None, 0.7], [0.8, 0.5, None])
    assert difference["nodes"] == 1 and difference["mean"] == pytest.approx(0.1)
    assert paired_difference([None], [0.5]) is None
    with pytest.raises(ValueError):
        paired_bootstrap([0.5, math.nan], [0.5, 0.5])


def test_a_small_fleet_is_compared_image_by_image():
    both_right = np.ones(40, dtype=bool)
    assert images_bootstrap([both_right], [both_right]) == (0.0, 0.0, 0.0)
    # One node, 10 images: the method wins 5, ties 5. The resampled difference is k/10 with
    # k ~ Binomial(10, 1/2): its 95 % interval is [0.2, 0.8].
    ours, theirs = np.ones(10, dtype=bool), np.array([True] * 5 + [False] * 5)
    assert images_bootstrap([ours], [theirs]) == pytest.approx((0.5, 0.2, 0.8))
    # The mean is over nodes, as the headline's: 0.5 on one node, 0 on the other.
    mean, low, high = images_bootstrap([ours, both_right], [theirs, both_right])
    assert mean == pytest.approx(0.25) and low == pytest.approx(0.1) and high == pytest.approx(0.4)
    # paired_difference: images below SMALL_FLEET nodes, nodes from it on.
    small = paired_difference([1.0, 1.0], [0.5, 1.0], [ours, both_right[:10]], [theirs, both_right[:10]])
    assert small["unit"] == "images" and small["images"] == 20 and "20 test images of 2 nodes" in small["method"]
    many = paired_difference([0.9] * SMALL_FLEET, [0.8] * SMALL_FLEET)
    assert many["unit"] == "nodes" and many["low"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="same non-empty"):
        images_bootstrap([ours], [theirs[:5]])


def test_a_records_right_images_survive_the_round_trip():
    right = [True, False, True, True, False, False, True, False, True, True, False]
    bits = right_bits(right)
    assert right_from_bits(bits, len(right)).tolist() == right
    assert right_bits([]) == "" and right_from_bits("", 3) is None
    assert right_from_bits(bits, 30) is None and right_from_bits("zz", 2) is None


def test_provenance_names_the_code_the_packages_and_the_machine():
    made = provenance(seed=7)
    for key in (
        "started_utc",
        "command",
        "seed",
        "device",
        "host",
        "platform",
        "cpu_count",
        "python",
        "packages",
        "git",
    ):
        assert key in made, key
    assert made["seed"] == 7 and made["device"] == "cpu" and made["started_utc"].endswith("+00:00")
    assert set(made["packages"]) == set(PACKAGES) and made["packages"]["torch"].startswith("2.")
    assert json.loads(json.dumps(made)) == made


def test_provenance_outside_a_git_checkout(tmp_path):
    assert git_state(tmp_path) is None
    assert provenance(seed=0, root=tmp_path)["git"] is None


def test_a_checkout_is_dirty_by_its_code_not_by_the_folders_it_ignores(tmp_path):
    """The first line of `git status --porcelain` begins with a space (" M path"): read whole,
    not stripped, or its path loses a letter and an ignored change counts as dirty."""

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    for name in ("code.py", "results/table.json"):
        (tmp_path / name).write_text("1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (tmp_path / "results" / "table.json").write_text("2\n")
    assert git_state(tmp_path, ignore=("results/",))["dirty"] is False
    assert git_state(tmp_path)["dirty"] is True
    (tmp_path / "code.py").write_text("2\n")
    assert git_state(tmp_path, ignore=("results/",))["dirty"] is True


def test_a_tiny_simulation_writes_the_plots_and_a_page_with_the_table(tmp_path):
    from p2pnode_cli import main

    out = tmp_path / "sim"
    arguments = ["simulate", "--algorithm", "mapl", "--dataset", "digits", "--nodes", "4", "--rounds", "3"]
    arguments += ["--samples-per-class", "10", "--set", "warmup_rounds=1", "--backbones", "mlp"]
    arguments += ["--baselines", "local", "oracle"]
    assert main([*arguments, "--out", str(out)]) == 0
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    report = json.loads((out / "report.json").read_text())
    assert report["provenance"]["seed"] == 0 and report["provenance"]["command"]
    assert set(report["baselines"]) == {"local", "oracle"}
    assert report["baselines"]["oracle"]["difference"]["nodes"] == 4
    assert (
        len(report["accuracy"]["per_round_band"]["q1"]) == 3 and len(report["loss"]["train_per_round_band"]["max"]) == 3
    )
    pooled = report["accuracy"]["pooled"]
    assert pooled["n"] == sum(report["accuracy"]["test_samples_per_node"]) == 4 * 5 * 15
    page = (out / "report.md").read_text()
    assert "| method | mean ± std over nodes | all test images | 95 % Wilson |" in page
    for name in ("mapl", "local", "oracle"):
        assert f"\n| {name} | " in page
    assert f"{pooled['correct']}/{pooled['n']}" in page
    assert "| node | backbone | classes | neighbours (w > 0) | mapl [95 % Wilson] | local [95 % Wilson] |" in page
    assert all(f"]({name})" in page for name in PLOTS)
    # Without --check, what was judged is that every node finished, and the page says no more.
    assert "| check | every node ran every round (no `--check`) |" in page
    checks = ["--check", "--check-accuracy", "0", "--check-mass", "0.5"]
    assert main([*arguments, *checks, "--out", str(tmp_path / "checked")]) == 0
    checked = (tmp_path / "checked" / "report.md").read_text()
    assert "| check | passed (`--check`: mean accuracy ≥ 0, within-cluster mass ≥ 0.5) |" in checked
