"""Names of what can be chosen, importable without torch (the command line parses with these):
the algorithms (the one list; `registry` imports their classes), backbones, datasets, scenarios,
attacks and device names.

tests/test_learning.py checks that the backbones match the models' own registry.
"""

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One algorithm: where its class lives (imported by `registry` only, which may load torch),
    what it is, and how a driver treats it."""

    cls: str  # "module:Class" under algorithms/
    summary: str
    graph_learning: bool = False  # its W is learned (the others' is fixed)
    pooled_training_data: bool = False  # the driver hands the node its true cluster's pooled shard


# The one list of algorithms: the command line, the daemon's config check and the registry read it.
ALGORITHMS: Mapping[str, Entry] = {
    "local": Entry("methods.mapl:Local", "PML on the node's own data, no communication (the floor)"),
    "oracle": Entry(
        "methods.mapl:Oracle",
        "PML on the pooled data of the node's true cluster (the ceiling; not a P2P method)",
        pooled_training_data=True,
    ),
    "fedproto": Entry("methods.baselines:FedProto", "FedProto-style: class-mean prototypes averaged over all peers"),
    "mapl": Entry(
        "methods.mapl:Mapl",
        "MAPL: PML + learned collaboration graph (CGL) + prototype aggregation",
        graph_learning=True,
    ),
    "mapl-nocgl": Entry("methods.mapl:MaplNoCgl", "MAPL with the graph fixed all-to-all uniform"),
    "mapl+": Entry(
        "methods.mapl:MaplPlus",
        "MAPL+: MAPL that also averages backbones (one backbone everywhere)",
        graph_learning=True,
    ),
    "mapl-dual": Entry(
        "methods.dual:MaplDual",
        "MAPL-Dual: MAPL + a small shared model mixed over a graph learned from its heads",
        graph_learning=True,
    ),
    "mapl-auto": Entry(
        "methods.auto:MaplAuto",
        "MAPL-Auto: MAPL-Dual, plus MAPL+'s backbone averaging with neighbours that run the same model, "
        "served with a local-only model",
        graph_learning=True,
    ),
    "fedmrl": Entry(
        "methods.fedmrl:FedMrl",
        "FedMRL: own + small shared model fused into nested heads; the small one mixed over CGL",
        graph_learning=True,
    ),
    "dfedavgm": Entry("methods.baselines:DFedAvgM", "DFedAvgM: momentum SGD + uniform model averaging (one backbone)"),
    "scool-local": Entry("methods.scool:ScoolLocal", "SCooL's model and optimiser, no communication (its floor)"),
    "scool-dirac": Entry(
        "methods.scool:ScoolDirac", "SCooL with the Dirac prior = D-PSGD: fixed uniform graph, model mixing"
    ),
    "scool-sbm": Entry(
        "methods.scool:ScoolSbm",
        "SCooL, stochastic-block-model prior: W from cross-client scores (EM)",
        graph_learning=True,
    ),
    "scool-attention": Entry(
        "methods.scool:ScoolAttention",
        "SCooL, attention prior over model updates: W from cross-client scores (EM)",
        graph_learning=True,
    ),
    "sfmtl": Entry(
        "methods.sfmtl:Sfmtl",
        "SFMTL-Graph: feature anchors + heads, Louvain communities, per-community aggregation (one backbone)",
        graph_learning=True,
    ),
}
ALGORITHM_NAMES = tuple(ALGORITHMS)
# What `p2pnode init` writes and `make demo` runs: it finds out from its neighbours which of MAPL+
# and MAPL-Dual fits the fleet (issue #44).
DEFAULT_ALGORITHM = "mapl-auto"
GRAPH_LEARNING = tuple(name for name, entry in ALGORITHMS.items() if entry.graph_learning)
CPU_BACKBONES = ("convnet", "resnet", "mobilenet", "mlp")
GPU_BACKBONES = ("resnet18", "shufflenet", "googlenet", "alexnet")
BACKBONES = CPU_BACKBONES + GPU_BACKBONES
# A user's own backbone: "module:callable" (algorithms/models/user_backbone.py), beside the names above.
USER_BACKBONE_PATTERN = r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*"
BACKBONE_PATTERN = "|".join((*BACKBONES, USER_BACKBONE_PATTERN))
BACKBONE_FORMS = f"one of {', '.join(BACKBONES)}, or your own as MODULE:CALLABLE"
BASELINES = ("local", "oracle")  # beside a run: the floor (alone) and the ceiling (true cluster's pooled data)
# A poisoning peer's attacks (algorithms/methods/poison.py)
ATTACKS = ("scale", "rescale", "sign-flip", "random", "rotate", "copy", "none")
# Where a model trains ([model].device, `--device`): "auto" (CUDA, else MPS, else the CPU), "cpu",
# "cuda" (the current CUDA device), "cuda:N" or "mps". Only the form is checked here; whether the
# device exists is checked where the model is placed (algorithms/models/device.py).
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:[0-9]{1,4})?"
DEVICE_FORMS = '"auto", "cpu", "cuda", "cuda:N" or "mps"'
FLOAT32_ONLY_DEVICES = ("cpu", "mps")  # names that never get mixed precision (CUDA only)

# Datasets (algorithms/data/datasets.py) and non-IID scenarios (algorithms/data/partitions.py): named here,
# where the daemon's config check reads them without importing numpy.
DATASETS = ("mnist5k", "digits", "mnist", "fashionmnist", "cifar10", "svhn")
# `[data].dataset` naming no benchmark: the images at `[data].path`, dealt out by the partition
# (what `p2pnode testnet --data` gives each daemon).
DATASET_FROM_PATH = "path"
SCENARIOS = ("1", "2", "3", "4", "noniid-sbm", "noniid", "dirichlet")
