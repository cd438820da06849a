import os

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

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
