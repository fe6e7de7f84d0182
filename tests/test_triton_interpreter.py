"""Every Triton step under TRITON_INTERPRET=1 on CPU tensors, against fp64 (fp32/fp16 only: the
interpreter computes bf16 wrongly)."""
import pytest
import torch

import rosetta
from cases import CPU_SHAPES, make_inputs
from helpers import assert_matches_reference

TRITON = [v for v in rosetta.variants(backend="triton") if v.op in CPU_SHAPES]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("v", TRITON, ids=lambda v: v.label)
def test_triton_step_on_cpu(interpreter, gen, v, dtype):
    for shape in CPU_SHAPES[v.op]:
        inputs = make_inputs(v.op, shape, dtype, "cpu", gen)
        assert_matches_reference(v, inputs, v(*inputs))


@pytest.mark.parametrize("v", TRITON, ids=lambda v: v.label)
def test_triton_step_non_contiguous(interpreter, gen, v):
    inputs = make_inputs(v.op, (33, 40), torch.float32, "cpu", gen, contiguous=False)
    assert not inputs[0].is_contiguous()
    assert_matches_reference(v, inputs, v(*inputs))


@pytest.mark.parametrize("v", TRITON, ids=lambda v: v.label)
def test_triton_launch_into_poisoned_output(interpreter, gen, v):
    """The bench's path: a preallocated output poisoned with NaN must be fully overwritten."""
    from rosetta.ops import SPECS

    inputs = make_inputs(v.op, CPU_SHAPES[v.op][-1], torch.float32, "cpu", gen)
    out = SPECS[v.op].allocate(*inputs).fill_(float("nan"))
    assert_matches_reference(v, inputs, v.launch_into(*inputs, out=out))
