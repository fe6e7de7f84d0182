"""Property-based fuzzing of every step: shapes (0, 1, primes, tile +- 1), strides (contiguous,
transposed, every other column, storage starting one element in), dtypes and special values.
CPU: the Triton steps under the interpreter, small and few examples (derandomized: the same
examples every run, so CI stays reproducible and inside its time). GPU: every step, more and larger.
A failure prints the step, shapes, strides and the first element that is wrong."""
import math
import os
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rosetta
from helpers import GPU, assert_matches_reference
from rosetta.dispatch import fits
from rosetta.ops import SPECS

ON_CPU = os.environ.get("TRITON_INTERPRET") == "1"
EDGE_SIZES = [0, 1, 2, 3, 5, 7, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129]
GPU_SIZES = EDGE_SIZES + [255, 256, 257, 1023, 1024, 1025, 4095, 4097, 65537]
LAYOUTS = ("contiguous", "transposed", "every other column", "one element in")


def sizes(big: bool):
    return st.sampled_from(GPU_SIZES if big else EDGE_SIZES)


@st.composite
def cases(draw, op: str, dtypes, big: bool):
    """(shape, dtype, layout, special) for one op."""
    n = sizes(big)
    if op in ("matmul", "linear_gelu"):
        shape = (draw(n), draw(n), draw(n))
        if big and shape[0] * shape[1] * shape[2] > 2**30:
            shape = (shape[0], min(shape[1], 129), shape[2])
    elif op == "softmax":
        shape = (draw(n), max(1, draw(n)))
    elif op == "attention":  # (B, H, Sq, Sk, D): few heads, any sequence lengths, a head_dim it takes
        seq = st.sampled_from([1, 2, 7, 17, 64, 65] + ([127, 1000] if big else []))
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(seq), draw(seq), draw(st.sampled_from((64, 128))))
    else:
        shape = (draw(n),) if draw(st.booleans()) else (draw(n), draw(n))
        if big and math.prod(shape) > 2**26:  # 65537 x 65537 would be 17 GB in fp32, 34 in the fp64 reference
            shape = (shape[0], min(shape[1], 1025))
    dtype = draw(st.sampled_from(dtypes))
    layout = draw(st.sampled_from(LAYOUTS if len(shape) >= 2 else LAYOUTS[:1] + LAYOUTS[2:]))
    special = op == "softmax" and draw(st.integers(0, 3)) == 0
    return shape, dtype, layout, special


def laid_out(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as t, in the requested memory layout."""
    if layout == "transposed":
        return t.t().contiguous().t() if t.dim() == 2 else t
    if layout == "every other column":
        wide = torch.empty((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
        wide[..., ::2] = t
        return wide[..., ::2]
    if layout == "one element in":
        flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        flat[1:] = t.reshape(-1)
        return flat[1:].view(t.shape)
    return t


def make(op, shape, dtype, device, layout, special, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    inputs = SPECS[op].forward.make_inputs(shape, dtype, device, gen)
    if special and inputs[0].numel():
        x = inputs[0].clone()
        flat = x.view(-1)
        picks = torch.randint(0, flat.numel(), (3,), generator=gen, device=device)
        flat[picks] = torch.tensor([float("-inf"), float("inf"), float("nan")], dtype=dtype, device=device)
        inputs = (x, *inputs[1:])
    return tuple(laid_out(t, layout) for t in inputs)


def fuzz(v, big: bool, examples: int, device: str):
    dtypes = [d for d in v.dtypes if big or d != torch.bfloat16]  # the interpreter gets bf16 wrong
    if not dtypes:
        pytest.skip(f"{v.label} takes only bf16, which the interpreter computes wrongly")

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(v.op, dtypes, big), st.integers(0, 2**31 - 1))
    def check(case, seed):
        shape, dtype, layout, special = case
        inputs = make(v.op, shape, dtype, device, layout, special, seed)
        try:  # a shape the op itself refuses (a norm's rows of no elements): the step says so, in the op's words
            SPECS[v.op].check_shapes(v.label, *inputs)
        except ValueError as refused:
            with pytest.raises(ValueError, match=re.escape(str(refused))):
                v(*inputs)
            return
        if not fits(v, inputs):
            with pytest.raises(ValueError, match="steps"):
                v(*inputs)
            return
        assert_matches_reference(v, inputs, v(*inputs))

    check()


@pytest.mark.parametrize("v", rosetta.variants(backend="triton"), ids=lambda v: v.label)
def test_fuzz_triton_steps_on_cpu(interpreter, v):
    fuzz(v, big=False, examples=6, device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("v", rosetta.variants(), ids=lambda v: v.label)
def test_fuzz_every_step_on_gpu(v):
    fuzz(v, big=True, examples=10, device=GPU)
