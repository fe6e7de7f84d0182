import fcntl
import gc
import os
import sys
import tempfile
import traceback

import pytest
import torch

from helpers import GPU

HAS_CUDA = torch.cuda.is_available()


def pytest_addoption(parser):
    parser.addoption("--shard", metavar="I/N", default=None,
                     help="run only the I-th of N interleaved slices of the selected tests (1 <= I <= N): "
                          "`make test-gpu` in N shorter runs, or on N GPUs at once")


def shard_of(spec: str) -> tuple[int, int]:
    """'2/4' -> (2, 4), or a UsageError that says what is expected."""
    try:
        i, n = (int(part) for part in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes I/N, e.g. --shard 2/4; got {spec!r}") from None
    if not 1 <= i <= n:
        raise pytest.UsageError(f"--shard {spec}: I must be between 1 and N")
    return i, n


def pytest_configure(config):
    if config.getoption("--shard"):
        shard_of(config.getoption("--shard"))  # a bad value stops the run before collection


@pytest.hookimpl(trylast=True)  # after -m and -k, so the shards split what was selected
def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip, with the reason, where there is no GPU; they never pass vacuously.
    With --shard I/N, keep every N-th selected test from the I-th: interleaved, so each shard gets
    its share of every file (a file's tests are alike in cost; runs of one file are not)."""
    if config.getoption("--shard"):
        i, n = shard_of(config.getoption("--shard"))
        keep = items[i - 1::n]
        kept = set(keep)
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = keep
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


def release_gpu_memory():
    """Hand this process's cached GPU blocks back, including those a failed test's traceback
    still holds (pytest keeps it in sys.last_traceback; its report is already written)."""
    tb = getattr(sys, "last_traceback", None)
    if tb is not None:
        traceback.clear_frames(tb)
    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _share_the_gpu_between_workers(request):
    """Under pytest-xdist, worker processes share one GPU: each gives its cache back after every
    GPU test, or a few workers holding tens of GB would run the others out of memory."""
    yield
    if HAS_CUDA and os.environ.get("PYTEST_XDIST_WORKER") and "gpu" in request.keywords:
        release_gpu_memory()


@pytest.fixture
def huge_gpu_memory():
    """For a test of 2^31-element tensors (4-13 GB): one such test at a time across pytest-xdist's
    workers, its memory given back afterwards, pass or fail."""
    with open(os.path.join(tempfile.gettempdir(), "rosetta-huge-gpu-test.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            release_gpu_memory()
