import os

import pytest
import torch

from helpers import GPU

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip, with the reason, where there is no GPU; they never pass vacuously."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on the GPU box)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def interpreter():
    """Triton steps on the CPU: only valid when TRITON_INTERPRET=1 was set before triton loaded."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 (make test does) to run Triton steps on the CPU")


def _generator(device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(1234)
    return g


@pytest.fixture
def gen():
    """A fresh seeded generator per test, on the GPU where there is one: reproducible, never zeros."""
    return _generator(GPU if HAS_CUDA else "cpu")


@pytest.fixture
def cpu_gen():
    """For tensors made on the CPU (interpreter tests), also on a GPU box."""
    return _generator("cpu")
