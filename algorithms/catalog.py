"""Names of what can be chosen, importable without torch (the command line parses with these).

tests/test_learning.py checks that they match the registries in `registry` and `models`.
"""

ALGORITHM_NAMES = (
    "local",
    "oracle",
    "fedproto",
    "mapl",
    "mapl-nocgl",
    "mapl+",
    "mapl-dual",
    "fedmrl",
    "dfedavgm",
    "scool-local",
    "scool-dirac",
    "scool-sbm",
    "scool-attention",
    "sfmtl",
)
GRAPH_LEARNING = (
    "mapl",
    "mapl+",
    "mapl-dual",
    "fedmrl",
    "scool-sbm",
    "scool-attention",
    "sfmtl",
)  # the algorithms whose W is learned (the others' is fixed)
CPU_BACKBONES = ("convnet", "resnet", "mobilenet", "mlp")
GPU_BACKBONES = ("resnet18", "shufflenet", "googlenet", "alexnet")
BACKBONES = CPU_BACKBONES + GPU_BACKBONES
BASELINES = ("local", "oracle")  # beside a run: the floor (alone) and the ceiling (true cluster's pooled data)
ATTACKS = ("scale", "rescale", "sign-flip", "random", "none")  # a poisoning peer's (algorithms/poison.py)
# Where a model trains ([model].device, `--device`): "auto" (CUDA, else MPS, else the CPU), "cpu",
# "cuda" (the current CUDA device), "cuda:N" or "mps". Only the form is checked here; whether the
# device exists is checked where the model is placed (algorithms/device.py).
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:[0-9]{1,4})?"
DEVICE_FORMS = '"auto", "cpu", "cuda", "cuda:N" or "mps"'
FLOAT32_ONLY_DEVICES = ("cpu", "mps")  # names that never get mixed precision (CUDA only)

# Datasets (algorithms/datasets.py) and non-IID scenarios (algorithms/partitions.py): named here,
# where the daemon's config check reads them without importing numpy.
DATASETS = ("mnist5k", "digits", "mnist", "fashionmnist", "cifar10", "svhn")
# `[data].dataset` naming no benchmark: the images at `[data].path`, dealt out by the partition
# (what `p2pnode testnet --data` gives each daemon).
DATASET_FROM_PATH = "path"
SCENARIOS = ("1", "2", "3", "4", "noniid-sbm", "noniid", "dirichlet")
