"""reduce_sum beyond the shared GPU checks: all-positive data (the hard case for long chains of
fp32 adds), run-to-run spread of the atomic steps, and more than 2^31 elements."""
import pytest
import torch

import rosetta
from cases import HUGE_NUMEL
from helpers import GPU, assert_matches_reference

pytestmark = pytest.mark.gpu
STEPS = rosetta.variants("reduce_sum")


def nondeterministic(v):
    """A step that is not bit-reproducible says so in its header's Still field."""
    return "NON-DETERMINISTIC" in v.header.still


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("v", STEPS, ids=lambda v: v.label)
def test_uniform_positive_data(gen, v, dtype):
    """U(0,1): no cancellation to hide accumulated rounding; the bound is 1e-5 * sum|x|."""
    for n in (2**20 + 7, 2**28):
        x = torch.rand(n, device=GPU, generator=gen).to(dtype)
        assert_matches_reference(v, (x,), v(x))


@pytest.mark.parametrize("v", STEPS, ids=lambda v: v.label)
def test_run_to_run(gen, v):
    """Deterministic steps give identical bits every run; the atomic ones stay in the bound."""
    x = torch.rand(2**24 + 3, device=GPU, generator=gen)
    results = torch.stack([v(x) for _ in range(20)]).double()
    if not nondeterministic(v):
        assert torch.equal(results, results[:1].expand_as(results)), f"{v.label} is not deterministic"
    bound = 1e-5 * x.double().abs().sum()
    assert (results.max() - results.min()) <= bound
    assert ((results - x.double().sum()).abs() <= bound).all()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("v", STEPS, ids=lambda v: v.label)
def test_past_2_31_elements(gen, huge_gpu_memory, v, dtype):
    """2^31 + 17 elements: 32-bit indexing would wrap. Reference accumulated chunk by chunk."""
    x = torch.rand(HUGE_NUMEL, device=GPU, generator=gen).to(dtype)
    out = v(x).double()
    chunks = x.split(2**28)
    ref = sum(c.double().sum() for c in chunks)
    scale = sum(c.double().abs().sum() for c in chunks)
    assert (out - ref).abs() <= 1e-5 * scale, f"{v.label}: {out.item()} vs {ref.item()}"
