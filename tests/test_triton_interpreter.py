"""Every Triton step under TRITON_INTERPRET=1 on CPU tensors, against fp64, for each direction
(fp32/fp16 only: the interpreter computes bf16 wrongly)."""
import pytest
import torch

import rosetta
from cases import make_inputs, poisoned_output, strided_cases
from helpers import assert_matches_reference, fits
from rosetta.ops import SPECS

TRITON = rosetta.variants(backend="triton")
CPU_DTYPES = (torch.float32, torch.float16)
CASES = [(v, d, direction) for v in TRITON for d in CPU_DTYPES if d in v.dtypes
         for direction in SPECS[v.op].directions()]



@pytest.mark.parametrize("v,dtype,direction", CASES, ids=lambda p: getattr(p, "label", str(p)))
def test_triton_step_on_cpu(interpreter, cpu_gen, v, dtype, direction):
    for shape in SPECS[v.op].cpu_shapes:
        inputs = make_inputs(v.op, shape, dtype, "cpu", cpu_gen, direction)
        if not fits(v, inputs):  # a declared limit: refused before launch, naming the steps that take it
            with pytest.raises(ValueError, match="steps"):
                v(*inputs) if direction == "forward" else v.backward(*inputs)
            continue
        out = v(*inputs) if direction == "forward" else v.backward(*inputs)
        assert_matches_reference(v, inputs, out, direction)


@pytest.mark.parametrize("v", TRITON, ids=lambda v: v.label)
def test_triton_step_strided(interpreter, cpu_gen, v):
    dtype = torch.float32 if torch.float32 in v.dtypes else torch.float16
    for name, inputs in strided_cases(v.op, dtype, "cpu", cpu_gen):
        if not fits(v, inputs):
            with pytest.raises(ValueError, match="steps"):
                v(*inputs)
            continue
        assert_matches_reference(v, inputs, v(*inputs))


@pytest.mark.parametrize("v", TRITON, ids=lambda v: v.label)
def test_triton_launch_into_poisoned_output(interpreter, cpu_gen, v):
    """The bench's path: a preallocated output poisoned with NaN must be fully overwritten."""
    dtype = torch.float32 if torch.float32 in v.dtypes else torch.float16
    shape = {"matmul": (24, 16, 8)}.get(v.op, SPECS[v.op].cpu_shapes[-2])  # matmul: rows TMA can read
    inputs = make_inputs(v.op, shape, dtype, "cpu", cpu_gen)
    out = poisoned_output(v.op, inputs)
    assert_matches_reference(v, inputs, v.launch_into(*inputs, out=out))
