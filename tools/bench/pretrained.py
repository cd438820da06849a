"""Your own model, pretrained (issue #45; docs/own-model.md): what starting a fleet's backbone
from weights trained on other data gains on a few dozen images per class.

    python -m tools.bench.pretrained --out bench-out/pretrained [--seeds 3 4] [--rounds 30]
        [--nodes 4] [--per-class 40] [--epochs 4] [--pretrain-images N] [--workers 2] [--save pretrained]

What a user would do, step by step, in `--out`: `mynet.py` is the user's backbone (torchvision's
ShuffleNetV2 ×0.5, its stem made 3×3 stride 1 and one channel for 28 px digits, its classifier
replaced by `nn.Identity()`); `pretrained.pt` its weights after `--epochs` epochs on the mnist5k
digits 0-4 with a linear head (the stand-in for ImageNet weights, which nothing here can
download); `images/node<i>/<class>/` each device's own images of the digits 5-9, which the
pretraining never saw, `--per-class` a class (a fifth held out for testing, as a daemon holds
them out). Then per seed, MAPL-Auto and Local on those devices (`p2pnode simulate
--data-per-node images --backbones mynet:backbone [--weights pretrained.pt]`), from scratch and
from the weights. The gains are paired over the same held-out images (testnet/reporting/intervals.py).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from algorithms.data.setup import ScenarioSpec
from algorithms.models.user_backbone import BackboneFiles
from testnet.reporting.intervals import paired_difference
from testnet.simulation.own_data import OwnDataArguments, own_data_specs
from testnet.simulation.simulator import SimulationSpec

from .results import capture, publish
from .runs import simulate_all

METHODS = ("local", "mapl-auto")
PRETRAIN_CLASSES, OWN_CLASSES = range(5), range(5, 10)
BACKBONE = "mynet:backbone"
USER_FILE = textwrap.dedent(
    '''\
    """The user's backbone: torchvision's ShuffleNetV2 x0.5 for 28 px grayscale digits."""
    from torch import nn
    from torchvision.models import shufflenet_v2_x0_5


    def backbone():
        model = shufflenet_v2_x0_5()
        model.conv1[0] = nn.Conv2d(1, 24, 3, stride=1, padding=1, bias=False)  # small grayscale images
        model.maxpool = nn.Identity()
        model.fc = nn.Identity()  # features out; p2pnode adds its own head
        return model
    '''
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench-out/pretrained")
    parser.add_argument("--seeds", nargs="+", type=int, default=[3, 4])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--per-class", type=int, default=40, help="each device's images of each of its classes")
    parser.add_argument("--epochs", type=int, default=4, help="pretraining epochs on the digits 0-4")
    parser.add_argument(
        "--pretrain-images", type=int, metavar="N", help="pretrain on the first N of them only (default: all)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--save", metavar="NAME", help="write the table's runs to tools/bench/results/NAME.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "mynet.py").write_text(USER_FILE)
    words = ["python", "-m", "tools.bench.pretrained", *(sys.argv[1:] if argv is None else argv)]
    with capture(words, seeds=args.seeds, threads=1, runs=len(args.seeds) * 4) as provenance:
        pretraining = pretrain(out, args.epochs, args.pretrain_images)
        write_own_images(out / "images", args.nodes, args.per_class)
        starts = {
            "scratch": BackboneFiles(code=out),
            "pretrained": BackboneFiles(code=out, weights=out / "pretrained.pt"),
        }
        runs = [(start, method, seed) for seed in args.seeds for start in starts for method in METHODS]
        jobs = [
            (_spec(args, out, starts[start], method, seed), str(out / f"{start}-{method}-seed{seed}"))
            for start, method, seed in runs
        ]
        reports = simulate_all(jobs, args.workers)
    data = {
        "rounds": args.rounds,
        "nodes": args.nodes,
        "per_class": args.per_class,
        "pretraining": pretraining,
        "runs": [_kept(start, method, report) for (start, method, _), report in zip(runs, reports, strict=True)],
    }
    return publish(data["runs"], render({"data": data}), provenance, args.save, "tools.bench.pretrained", data)


def pretrain(out: Path, epochs: int, limit: int | None = None) -> dict:
    """The user's backbone and a linear head trained on every mnist5k image of the digits 0-4;
    the backbone's state dict saved as `out`/pretrained.pt. Returns what it did."""
    import torch
    from torch import nn

    from algorithms.data.datasets import load_dataset
    from algorithms.models.user_backbone import feature_size, user_module

    torch.manual_seed(0)
    torch.set_num_threads(2)
    data = load_dataset("mnist5k").train
    keep = np.isin(data.labels, list(PRETRAIN_CLASSES))
    keep[np.flatnonzero(keep)[limit:] if limit is not None else []] = False
    images, labels = torch.from_numpy(data.images[keep]), torch.from_numpy(data.labels[keep])
    body = user_module(BACKBONE, out)
    model = nn.Sequential(body, nn.Flatten(), nn.Linear(feature_size(body, (1, 28, 28)), len(PRETRAIN_CLASSES)))
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    started = time.monotonic()
    for _ in range(epochs):
        model.train()
        for batch in torch.randperm(len(labels)).split(64):
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    torch.save(body.state_dict(), out / "pretrained.pt")
    return {
        "images": int(keep.sum()),
        "classes": list(PRETRAIN_CLASSES),
        "epochs": epochs,
        "wall_s": time.monotonic() - started,
    }


def write_own_images(folder: Path, nodes: int, per_class: int) -> None:
    """Each device's own PNGs of the digits 5-9: `per_class` a class, no image on two devices."""
    from PIL import Image

    from algorithms.data.datasets import load_dataset

    data = load_dataset("mnist5k").train
    for label in OWN_CLASSES:
        pool = np.flatnonzero(data.labels == label)
        if len(pool) < nodes * per_class:
            raise SystemExit(f"--per-class {per_class}: mnist5k has {len(pool)} images of {label} for {nodes} nodes")
        for node in range(nodes):
            target = folder / f"node{node}" / str(label)
            target.mkdir(parents=True, exist_ok=True)
            for index in pool[node * per_class : (node + 1) * per_class]:
                pixels = (data.images[index, 0] * 255).round().astype(np.uint8)
                Image.fromarray(pixels).save(target / f"{index:04d}.png")


def _spec(args: argparse.Namespace, out: Path, files: BackboneFiles, method: str, seed: int) -> SimulationSpec:
    _, per_node = own_data_specs(OwnDataArguments(data_per_node=str(out / "images")), args.nodes, seed)
    return SimulationSpec(
        algorithm=method,
        data=ScenarioSpec(nodes=args.nodes, seed=seed, per_node=per_node),
        rounds=args.rounds,
        backbones=(BACKBONE,),
        backbone_files=files,
    )


def _kept(start: str, method: str, report: dict) -> dict:
    accuracy = report["accuracy"]
    return {
        "start": start,
        "method": method,
        "seed": report["seed"],
        "per_node": accuracy["per_node"],
        "right": accuracy["test_right_per_node"],
        "test_per_node": accuracy["test_samples_per_node"],
        "predictor_per_node": accuracy.get("predictor_per_node"),
        "wall_s": report["wall_s"],
    }


def render(result: dict) -> str:
    """Per seed and start (from scratch, from the weights): Local and MAPL-Auto, and the paired
    gains: pretraining's (each method, pretrained − scratch) and collaboration's (MAPL-Auto − Local)."""
    from testnet.reporting.report import rights_of

    data = result["data"]
    runs = {(run["start"], run["method"], run["seed"]): run for run in data["runs"]}

    def gain(a: dict, b: dict) -> str:
        rights = rights_of(a["right"], a["test_per_node"]), rights_of(b["right"], b["test_per_node"])
        d = paired_difference(a["per_node"], b["per_node"], *rights)
        return f"{d['mean'] * 100:+.1f} [{d['low'] * 100:+.1f}, {d['high'] * 100:+.1f}]"

    rows = [
        "| seed | Local, scratch → pretrained, % | MAPL-Auto, scratch → pretrained, % | pretraining's gain, Local "
        "| pretraining's gain, MAPL-Auto | MAPL-Auto − Local, pretrained |",
        "|---|---|---|---|---|---|",
    ]
    for seed in sorted({run["seed"] for run in data["runs"]}):
        ls, lp = runs[("scratch", "local", seed)], runs[("pretrained", "local", seed)]
        ms, mp = runs[("scratch", "mapl-auto", seed)], runs[("pretrained", "mapl-auto", seed)]
        mean = lambda run: np.mean(run["per_node"]) * 100  # noqa: E731
        rows.append(
            f"| {seed} | {mean(ls):.1f} → {mean(lp):.1f} | {mean(ms):.1f} → {mean(mp):.1f} | {gain(lp, ls)} "
            f"| {gain(mp, ms)} | {gain(mp, lp)} |"
        )
    pre = data["pretraining"]
    tests = sum(next(iter(data["runs"]))["test_per_node"])
    rows += [
        "",
        f"{data['nodes']} devices, each with its own {data['per_class']} images of each of the digits 5-9 "
        f"(mnist5k; a fifth held out for testing: {tests} test images in all), {data['rounds']} rounds; the "
        f"backbone: torchvision's ShuffleNetV2 ×0.5 from `mynet.py` (docs/own-model.md), from scratch or from "
        f"`pretrained.pt`: {pre['epochs']} epochs on the {pre['images']} mnist5k images of the digits 0-4. "
        "Gains in points, 95 % paired bootstrap over the test images.",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
