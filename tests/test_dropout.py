"""dropout's promises beyond the elementwise gate: the mask is the same in both backends and every
step, bit for bit, for the same (seed, offset); it is a fair coin of 1 - p; masks of different
offsets (and seeds) are independent; the expectation of x is kept; the backward regenerates the
forward's mask. CPU: the reference generator and the Triton steps under the interpreter; GPU:
every step."""
import math

import pytest
import torch

import rosetta
from helpers import GPU
from rosetta.ops import SPECS
from rosetta.ops.dropout import keep_mask
from rosetta.torch_ops import interpreting

STEPS = rosetta.variants("dropout")
# seeds and offsets past 32 bits: both words of the key and the counter matter
DRAWS = [(0, 0), (1, 3), (2**40 + 5, 2**33 - 2)]


def z(share: float, p: float, n: int) -> float:
    """How many standard deviations a kept share is from 1 - p."""
    return abs(share - (1 - p)) / math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_is_one_minus_p_within_4_sigma(p):
    n = 2**20
    share = keep_mask(n, p, 1234, 0, "cpu").double().mean().item()
    assert z(share, p, n) < 4, f"kept {share:.5f} of {n}, expected {1 - p}"


def test_masks_of_other_offsets_and_seeds_are_independent():
    """Kept in both of two masks: (1-p)^2 of the elements within 4 sigma, for the next offset past
    the first draw (ceil(n / 4) counters), a far offset and another seed."""
    n, p = 2**20, 0.5
    first = keep_mask(n, p, 1234, 0, "cpu")
    for seed, offset in ((1234, n // 4), (1234, 2**35), (1235, 0)):
        both = (first & keep_mask(n, p, seed, offset, "cpu")).double().mean().item()
        q = (1 - p) ** 2
        assert abs(both - q) / math.sqrt(q * (1 - q) / n) < 4, (seed, offset, both)


def test_expectation_is_kept():
    """E[dropout(x)] = x: the mean of dropout(ones) is 1 within 4 sigma of its spread."""
    n, p = 2**20, 0.3
    y = SPECS["dropout"].forward.reference(torch.ones(n, dtype=torch.float32), p, 99, 0)
    sigma = math.sqrt(p / (1 - p) / n)
    assert abs(y.mean().item() - 1) < 4 * sigma


def run_all(x, p, seed, offset):
    return {v.label: v(x, params=(p, seed, offset)) for v in STEPS if v.backend == "triton" or not interpreting()}


@pytest.mark.skipif(not interpreting(), reason="the Triton steps on the CPU need TRITON_INTERPRET=1")
def test_triton_steps_draw_the_reference_mask_on_cpu():
    x = torch.ones(4099)  # ones: the output's zeros are the mask
    for seed, offset in DRAWS:
        expected = keep_mask(x.numel(), 0.5, seed, offset, "cpu")
        for label, y in run_all(x, 0.5, seed, offset).items():
            assert torch.equal(y != 0, expected), (label, seed, offset)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_every_step_of_both_backends_gives_the_same_bits(gen, dtype):
    x = torch.randn(3 * 2**20 + 7, device=GPU, generator=gen).to(dtype)
    for seed, offset in DRAWS:
        outs = run_all(x, 0.1, seed, offset)
        mask = keep_mask(x.numel(), 0.1, seed, offset, GPU)
        for label, y in outs.items():
            assert torch.equal(y != 0, mask & (x != 0)), f"{label}: another mask at seed {seed}, offset {offset}"
            first = next(iter(outs.values()))
            assert torch.equal(y.view(torch.int16 if dtype.itemsize == 2 else torch.int32),
                               first.view(torch.int16 if dtype.itemsize == 2 else torch.int32)), label


@pytest.mark.gpu
@pytest.mark.parametrize("v", STEPS, ids=lambda v: v.label)
def test_backward_regenerates_the_forward_mask(gen, v):
    x = torch.randn(2**20 + 3, device=GPU, generator=gen).requires_grad_()
    y = rosetta.dropout(x, 0.2, seed=5, offset=11, backend=v.backend, step=v.step)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad != 0, y != 0)
    assert torch.equal(x.grad[y != 0], torch.full_like(x.grad[y != 0], 1 / (1 - 0.2)))
