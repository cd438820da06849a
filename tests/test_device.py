"""Where the model runs (algorithms/models/device.py, [model].device, `--device`): device names and
their resolution, every algorithm driven through an explicit device, checkpoints read onto
another device, no tensor of the training path created off the node's device, and every
algorithm on a real GPU where there is one.

On a machine without a GPU the device is the CPU throughout; what proves the placement on
another device there is the static test (every tensor-creating call names its device or is
moved) and the `cuda`-marked tests, which run wherever torch sees CUDA (BENCHMARKS.md, "On a
GPU", says where they last ran)."""

import ast
import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from algorithms.catalog import ALGORITHM_NAMES
from algorithms.data.setup import ScenarioSpec, build_setup
from algorithms.models.device import CPU, DeviceError, placement, resolve_device, set_cpu_threads
from algorithms.registry import ALGORITHMS, apply_overrides, default_config, make_algorithm
from p2pnode.config import ConfigError, load_config
from p2pnode.learning.checkpoint import Checkpoint
from testnet.simulation.exchange import Exchange, simulation_identity
from testnet.simulation.simulator import SimulationSpec, run_simulation

from .helpers import ANY_PORT, write_config

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ScenarioSpec("digits", "1", nodes=4, samples_per_class=10, test_per_class=5)
# Kept on the CPU by design, whatever the device: random generators (the same draws everywhere),
# the SBM prior's numpy state, which reaches torch only to be checkpointed, and the step counts of
# Adam, which torch keeps on the CPU.
HOST_STATE = {"generator", "membership", "blocks", "proportions", "step"}


# --- names and their resolution ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["tpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "gpu", "", "cpu:0", " cpu", "cuda:12345"]
)
def test_a_malformed_device_name_is_refused_with_the_forms_that_work(name):
    with pytest.raises(DeviceError, match='"auto", "cpu", "cuda", "cuda:N" or "mps"'):
        resolve_device(name)


def test_auto_prefers_cuda_then_mps_then_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == CPU


def test_a_named_device_must_be_on_this_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for name in ("cuda", "cuda:0"):
        with pytest.raises(DeviceError, match=f'"{name}": no CUDA device on this machine'):
            resolve_device(name)
    with pytest.raises(DeviceError, match="Metal backend is not available"):
        resolve_device("mps")
    assert resolve_device("cpu") == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)  # the current one, by its index
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(DeviceError, match="this machine has 2 CUDA device"):
        resolve_device("cuda:2")


def test_mixed_precision_is_had_on_cuda_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert placement("cpu", True) == (CPU, False)
    assert placement("auto", True) == (CPU, False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert placement("cuda", True) == (torch.device("cuda", 0), True)
    assert placement("cuda", False) == (torch.device("cuda", 0), False)
    with pytest.raises(ValueError, match="mixed precision needs a CUDA device"):
        build_setup(SCENARIO, 0, "n0", backbone="mlp", mixed_precision=True)


def test_the_config_checks_the_form_of_a_device_and_leaves_its_presence_to_the_start(tmp_path):
    learning = {"algorithm": {"name": "mapl"}}
    for name in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        path = write_config(tmp_path / name.replace(":", "-"), ANY_PORT, model={"device": name}, **learning)
        assert load_config(path).model.device == name
    cuda = write_config(tmp_path / "mixed", ANY_PORT, model={"device": "cuda", "mixed_precision": True}, **learning)
    assert load_config(cuda).model.mixed_precision
    for model, field in (
        ({"device": "tpu"}, "[model].device: 'tpu' is not \"auto\""),
        ({"device": "cuda:one"}, "[model].device: 'cuda:one' is not"),
        ({"device": 0}, "[model].device: expected"),
        ({"device": "cpu", "mixed_precision": True}, '[model].mixed_precision: needs a CUDA device, not "cpu"'),
        ({"device": "mps", "mixed_precision": True}, '[model].mixed_precision: needs a CUDA device, not "mps"'),
        ({"mixed_precision": "yes"}, "[model].mixed_precision: expected true or false"),
    ):
        with pytest.raises(ConfigError) as caught:
            load_config(write_config(tmp_path / "bad", ANY_PORT, model=model, **learning))
        assert any(problem.startswith(field) for problem in caught.value.problems), caught.value.problems


def test_the_simulator_takes_a_device_and_its_report_says_which():
    for bad, message in (("tpu", 'is not "auto"'), ("cuda:x", "is not")):
        with pytest.raises(ValueError, match=message):
            SimulationSpec(algorithm="local", device=bad)
    with pytest.raises(ValueError, match="mixed precision needs a CUDA device, not 'cpu'"):
        SimulationSpec(algorithm="local", device="cpu", mixed_precision=True)
    with pytest.raises(DeviceError, match='"cuda:9999"'):
        run_simulation(
            SimulationSpec(
                algorithm="local", data=ScenarioSpec(dataset="digits", nodes=2), rounds=1, device="cuda:9999"
            )
        )
    report = run_simulation(
        SimulationSpec(algorithm="local", data=ScenarioSpec(dataset="digits", nodes=2), rounds=1, device="cpu")
    )
    assert (report["device"], report["mixed_precision"]) == ("cpu", False)


def test_a_node_whose_device_is_missing_exits_1_naming_the_setting_without_a_traceback(tmp_path):
    learning = {
        "data": {"dataset": "digits"},
        "algorithm": {"name": "mapl", "rounds": 1, "settings": {"warmup_rounds": "0"}},
    }
    path = write_config(tmp_path / "n", ANY_PORT, model={"device": "cuda:9999"}, **learning)  # no machine has it
    done = subprocess.run(
        [sys.executable, "-m", "p2pnode_cli", "start", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith('p2pnode: error: [model].device: "cuda:9999": '), last


# --- every algorithm, through the device it is given -------------------------------------------


def network(name: str, device: torch.device, *, mixed_precision: bool = False, nodes: int = 4) -> Exchange:
    """`nodes` nodes of `name` on `device`, joined by the simulator's exchange; graph learning
    (and SCooL's pruning) from round 1, so two rounds run every step of each algorithm."""
    info = ALGORITHMS[name]
    config = default_config(name)
    known = {f.name for f in dataclasses.fields(config)}
    config = apply_overrides(config, {k: "1" for k in ("warmup_rounds", "prune_round") if k in known})
    identities = [simulation_identity(0, i) for i in range(nodes)]
    backbones = ("mlp",) if info.homogeneous else ("mlp", "convnet")
    algorithms = [
        make_algorithm(
            name,
            build_setup(
                SCENARIO,
                i,
                identities[i].node_id,
                backbone=backbones[i % len(backbones)],
                pooled=info.pooled_training_data,
                device=device,
                mixed_precision=mixed_precision,
            ),
            config,
        )
        for i in range(nodes)
    ]
    return Exchange(algorithms, identities)


def tensors(tree, path=""):
    """(path, tensor) for every tensor in a state dict, but those HOST_STATE keeps on the CPU."""
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            if key not in HOST_STATE:
                yield from tensors(value, f"{path}/{key}")
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from tensors(value, f"{path}/{index}")


def assert_on(exchange: Exchange, device: torch.device) -> None:
    for node in exchange.nodes:
        assert node.setup.device == device and node.setup.data.train_images.device.type == device.type
        placed = list(tensors(node.state_dict()))
        assert placed, "a node that trains has tensors in its state"
        off = [path for path, tensor in placed if tensor.device.type != device.type]
        assert not off, f"{node.name}: not on {device}: {off[:5]}"


def snapshot(exchange: Exchange) -> list[dict[str, torch.Tensor]]:
    """A copy of every floating-point tensor each node holds."""
    return [
        {path: tensor.detach().clone() for path, tensor in tensors(node.state_dict()) if tensor.is_floating_point()}
        for node in exchange.nodes
    ]


def assert_trained(exchange: Exchange, before: list[dict[str, torch.Tensor]]) -> None:
    """Each node's steps ran: some tensor it held before moved (finite), none became NaN."""
    for node, old in zip(exchange.nodes, before, strict=True):
        now = dict(tensors(node.state_dict()))
        moved = [path for path, tensor in old.items() if not torch.equal(tensor, now[path].to(tensor.device))]
        assert moved, f"{node.name}: no tensor changed in two rounds"
        assert all(torch.isfinite(now[path]).all() for path in moved), node.name


def two_rounds_on(name: str, device: torch.device, *, mixed_precision: bool = False) -> None:
    exchange = network(name, device, mixed_precision=mixed_precision)
    before = snapshot(exchange)
    for round in range(2):
        records = exchange.run_round(round)
    assert all(math.isfinite(record.loss) for record in records)
    assert_trained(exchange, before)
    assert not exchange.rejections, exchange.rejections  # payloads decoded from the wire were all used
    assert_on(exchange, device)


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_every_algorithm_runs_every_step_through_the_device_it_is_given(name):
    two_rounds_on(name, CPU)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; torch sees none here")
@pytest.mark.parametrize("mixed_precision", [False, True], ids=["float32", "mixed"])
@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_every_algorithm_runs_every_step_on_cuda(name, mixed_precision):
    two_rounds_on(name, resolve_device("cuda"), mixed_precision=mixed_precision)


# --- checkpoints --------------------------------------------------------------------------------


def test_a_checkpoint_is_read_onto_any_device_and_a_resumed_node_trains_on_exactly(tmp_path):
    trained = network("mapl", CPU, nodes=2)
    trained.run_round(0)
    node = trained.nodes[0]
    path = tmp_path / "checkpoint.pt"
    Checkpoint("mapl", 0, node.state_dict(), ()).save(path)

    # Where the tensors land is up to the reader: map_location relocates every one of them ("meta"
    # stands in here for a device this machine lacks; a GPU node's file is read onto the CPU so).
    relocated = torch.load(path, map_location="meta", weights_only=True)
    assert all(tensor.is_meta for _, tensor in tensors(relocated["state"]))
    assert hasattr(relocated["state"]["trainer"]["model"], "_metadata")  # layer versions survive on_cpu

    # The daemon reads it onto the CPU, and the algorithm puts it where its model is.
    resumed = network("mapl", CPU, nodes=2).nodes[0]
    resumed.load_state_dict(Checkpoint.load(path, "mapl").state)
    saved = dict(tensors(node.state_dict()))
    for key, tensor in tensors(resumed.state_dict()):
        assert torch.equal(tensor, saved[key]), key
    assert resumed.local_step(1).loss == node.local_step(1).loss


# --- no tensor created off the node's device ----------------------------------------------------

FACTORIES = {
    "tensor",
    "as_tensor",
    "from_numpy",
    "zeros",
    "ones",
    "empty",
    "full",
    "eye",
    "arange",
    "linspace",
    "logspace",
    "rand",
    "randn",
    "randint",
    "randperm",
    "normal",
    "Generator",
}
# Tensors created on the CPU on purpose: (file, function, torch factory) → why.
ALLOWED = {
    ("algorithms/models/inference.py", "Preprocessing.batch", "from_numpy"): "images to classify are decoded on the "
    "CPU; `classify` moves them to the model's device",
    ("algorithms/models/personal.py", "_flattened_size", "zeros"): "models are built on the CPU, then moved",
    ("algorithms/models/user_backbone.py", "feature_size", "zeros"): "a user's backbone is measured as it is "
    "built, on the CPU, then moved with the model",
    (
        "algorithms/models/personal.py",
        "PersonalModel.__init__",
        "empty",
    ): "the prototypes' room, filled before the move",
    (
        "algorithms/models/personal.py",
        "PersonalModel.reset_prototypes",
        "randn",
    ): "the prototypes' initialisation, before the move (node_model builds on the CPU)",
    ("algorithms/data/setup.py", "node_data", "tensor"): "the shard is read on the CPU; NodeSetup.on moves it",
    ("algorithms/data/setup.py", "class_list_data", "tensor"): "the same, for a node that names its classes",
    (
        "algorithms/data/setup.py",
        "own_data_setup",
        "tensor",
    ): "a device's own files are read on the CPU; NodeSetup.on moves them",
    (
        "algorithms/models/training.py",
        "seeded_generator",
        "Generator",
    ): "generators stay on the CPU: the same draws anywhere",
    (
        "algorithms/graphs/attention.py",
        "UpdateSketch.__init__",
        "Generator",
    ): "the sketch's hash, drawn on the CPU, then moved",
    (
        "algorithms/graphs/priors.py",
        "SbmPrior.state_dict",
        "tensor",
    ): "numpy state, for the checkpoint (read on the CPU)",
    ("algorithms/models/selection.py", "hold_out", "randperm"): "drawn on the CPU with the node's CPU generator: "
    "the same images held out on any device",
    ("algorithms/models/selection.py", "hold_out", "zeros"): "the mask is built on the CPU beside the draw, then moved",
    ("algorithms/models/selection.py", "training_sample", "randperm"): "drawn on the CPU with the node's CPU "
    "generator, as hold_out's: the same images checked on any device, then moved",
}


def unplaced_factories(path: Path) -> list[tuple[str, str, int]]:
    """(function, factory, line) of every `torch.<factory>(...)` in `path` that has no `device=`
    and is not moved by an enclosing `.to(...)`."""
    tree = ast.parse(path.read_text(), str(path))
    moved = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to"
        for inner in ast.walk(node.func.value)
    }
    found = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = (*scope, node.name)  # the qualified name: Class.method, function.inner
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
            and node.func.attr in FACTORIES
            and not any(keyword.arg == "device" for keyword in node.keywords)
            and id(node) not in moved
        ):
            found.append((".".join(scope) or "<module>", node.func.attr, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, ())
    return found


def test_the_placement_check_tells_placed_from_unplaced_calls(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "import torch\n"
        "class Step:\n"
        "    def run(self, x, generator):\n"
        "        a = torch.zeros(3, device=x.device)\n"
        "        b = (torch.randint(0, 2, (3,), generator=generator).float() * 2 - 1).to(x.device)\n"
        "        c = torch.tensor([1.0])\n"
        "        def inner():\n"
        "            return torch.eye(2).sum() + torch.arange(2, device=x.device)\n"
        "        return a, b, c, inner, torch.stack([a, b])\n"
    )
    assert unplaced_factories(source) == [("Step.run", "tensor", 6), ("Step.run.inner", "eye", 8)]


def test_no_tensor_of_the_training_path_is_created_off_the_nodes_device():
    unplaced, used = [], set()
    for path in sorted((ROOT / "algorithms").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        for function, factory, line in unplaced_factories(path):
            if (name, function, factory) in ALLOWED:
                used.add((name, function, factory))
            else:
                unplaced.append(f"{name}:{line} torch.{factory} in {function}")
    assert not unplaced, "give these a device= (or .to(...) them), or allow them here with a reason:\n" + "\n".join(
        unplaced
    )
    assert used == set(ALLOWED), f"allowed but no longer there: {set(ALLOWED) - used}"


# --- on a GPU -----------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; torch sees none here")
@pytest.mark.parametrize("mixed_precision", [False, True], ids=["float32", "mixed"])
def test_mapl_steps_on_cuda(mixed_precision, tmp_path):
    device = resolve_device("cuda")
    exchange = network("mapl", device, mixed_precision=mixed_precision, nodes=2)
    before = snapshot(exchange)
    for round in range(2):
        records = exchange.run_round(round)
    assert all(math.isfinite(record.loss) for record in records)
    assert_trained(exchange, before)
    assert not exchange.rejections, exchange.rejections
    assert_on(exchange, device)
    # Saved from the GPU, resumed on the CPU.
    path = tmp_path / "checkpoint.pt"
    Checkpoint("mapl", 1, exchange.nodes[0].state_dict(), ()).save(path)
    on_cpu = network("mapl", CPU, nodes=2).nodes[0]
    on_cpu.load_state_dict(Checkpoint.load(path, "mapl").state)
    saved = dict(tensors(exchange.nodes[0].state_dict()))
    for key, tensor in tensors(on_cpu.state_dict()):
        assert tensor.device == CPU and torch.equal(tensor, saved[key].cpu()), key


def test_the_cpu_threads_bound_numpy_s_blas_as_torch_s():
    """[model].threads: numpy's BLAS gets the bound torch gets (its spare threads spin beside
    other nodes); 0 leaves both alone."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas() -> set[int]:
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    torch_threads = torch.get_num_threads()
    try:
        with threadpool_limits(2, user_api="blas"):  # restored on leaving
            assert blas() == {2}
            set_cpu_threads(0)
            assert blas() == {2}
            set_cpu_threads(1)
            assert blas() == {1} and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(torch_threads)
