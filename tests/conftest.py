import os

# Before torch loads MKL: MKL's own allocator is not fork-safe. The simulator forks its workers
# (testnet/simulation/workers.py) from this process, where earlier tests' daemons ran torch in
# worker threads; twice in a day a forked worker spun for good in MKL's allocator
# (`mm_account_ptr_by_tid`, seen with py-spy) and its test timed out. malloc is fork-safe.
os.environ.setdefault("MKL_DISABLE_FAST_MM", "1")

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, settings

from protocol import Decoder, Encoder, Identity

# CI runs a fixed, derandomized set of examples so a red build is reproducible; locally the
# examples vary between runs and explore more.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, max_examples=100)
# A long local hunt: HYPOTHESIS_PROFILE=soak make test (fuzz tests then run 10 000 examples each).
settings.register_profile("soak", deadline=None, max_examples=1000, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# --- make test-quick: modules marked `quick` (no daemons, no training), and kept so -------------


def pytest_addoption(parser):
    parser.addoption(
        "--quick", action="store_true", help="only the modules marked quick: no daemons, no training (make test-quick)"
    )


# make test hands out whole files (xdist's loadfile) in collection order: the longest first, so no
# long file starts when the others are nearly done and runs on alone (longest-processing-time
# first). Their time on two processes, 2026-12-06; the order changes wall time, not results.
LONGEST_FIRST = (
    "test_bench_commands.py",  # 52 s
    "test_processes.py",  # 41 s
    "test_dual.py",  # 39 s
    "test_churn.py",  # 36 s
    "adversarial/test_ingress.py",  # 34 s
    "test_readme.py",  # 31 s
    "test_learning_daemon.py",  # 29 s
    "test_own_data_simulate.py",  # 28 s
    "test_nat.py",  # 28 s (skipped without root)
    "adversarial/test_poisoning.py",  # 23 s
    "adversarial/test_flood.py",  # 21 s
    "adversarial/test_hostile_learning.py",  # 17 s
    "test_fuzz.py",  # 17 s
    "test_init.py",  # 15 s
)


def _longest_first(items) -> None:
    tests = os.path.dirname(__file__)
    rank = {os.path.join(tests, name): place for place, name in enumerate(LONGEST_FIRST)}
    if gone := [name for name in rank if not os.path.exists(name)]:
        raise pytest.UsageError(f"tests/conftest.py's LONGEST_FIRST names files that are gone: {gone}")
    items.sort(key=lambda item: rank.get(str(item.path), len(LONGEST_FIRST)))


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--quick"):
        _longest_first(items)
        return
    slow = [item for item in items if item.get_closest_marker("quick") is None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("quick") is not None]


@pytest.fixture(autouse=True)
def quick_stays_quick(request, monkeypatch):
    """Under --quick, a test that starts a daemon, another Python or a backward pass fails and
    says so: a module marked quick that grows a slow test is caught, not silently slow."""
    if not request.config.getoption("--quick"):
        return
    import subprocess
    import sys

    import torch

    from p2pnode.node import Node

    def refuse(what: str):
        def refused(*args, **kwargs):
            raise AssertionError(f"marked quick, but {what}: move it to a module without `pytestmark = quick`")

        return refused

    popen = subprocess.Popen.__init__

    def no_python(self, args, *rest, **kwargs):
        program = str(args[0] if isinstance(args, list | tuple) else args).split()[0]
        if program == sys.executable or program.endswith("p2pnode"):
            refuse("it starts another Python")()
        popen(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", no_python)
    monkeypatch.setattr(Node, "run", refuse("it runs a daemon"))
    monkeypatch.setattr(torch.Tensor, "backward", refuse("it trains (a backward pass)"))


NETWORK = "test"
NOW_US = 1_700_000_000_000_000


def fixed_identity(seed: int) -> Identity:
    return Identity(Ed25519PrivateKey.from_private_bytes(bytes((seed + i) % 256 for i in range(32))))


@pytest.fixture(scope="session")
def alice() -> Identity:
    return fixed_identity(1)


@pytest.fixture(scope="session")
def bob() -> Identity:
    return fixed_identity(2)


@pytest.fixture(scope="session")
def encoder(alice) -> Encoder:
    return Encoder(alice, NETWORK)


@pytest.fixture(scope="session")
def decoder() -> Decoder:
    return Decoder(NETWORK)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Every test's torch runs one thread, as the daemons and the simulator's workers do: tiny
    batches gain nothing from threads, and spinning threads crawl when the machine is busy (a
    10-node simulation on torch's 2 threads took 16× as long with other jobs running)."""
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1, user_api="blas"):  # numpy's BLAS too (algorithms/models/device.py)
        yield
    torch.set_num_threads(threads)
