"""Every Triton step under TRITON_INTERPRET=1 on CPU tensors, against fp64, for each direction
(fp32/fp16 only: the interpreter computes bf16 wrongly)."""
import pytest
import torch

import rosetta
from cases import make_inputs, poisoned_output, strided_cases
from helpers import assert_matches_reference
from rosetta.dispatch import fits
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
    # matmul: rows TMA can read, M <= 16; else the last non-empty CPU shape the step takes
    shapes = [(8, 16, 8)] if v.op == "matmul" else [s for s in reversed(SPECS[v.op].cpu_shapes) if 0 not in s]
    inputs = next(i for i in (make_inputs(v.op, s, dtype, "cpu", cpu_gen) for s in shapes) if fits(v, i))
    out = poisoned_output(v.op, inputs)
    assert_matches_reference(v, inputs, v.launch_into(*inputs, out=out))


# ---- softmax: a declared limit, refused before any launch -------------------------------------
SOFTMAX_BOUNDED = [v for v in rosetta.variants("softmax", "triton") if v.bounds]


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("v", SOFTMAX_BOUNDED, ids=lambda v: v.label)
def test_softmax_declared_limit_refused_before_launch(interpreter, cpu_gen, v, direction):
    """A row one past the step's `Max:` (Triton step 1: cols <= 32768) is refused by the input
    checks, before the kernel is launched, so the CPU sees the same error as a GPU: the limit, the
    value, and exactly the steps of the ladder that take the row."""
    (quantity, limit), = v.bounds
    inputs = make_inputs(v.op, (2, limit + 1), torch.float32, "cpu", cpu_gen, direction)
    takers = [s.step for s in rosetta.variants(v.op, v.backend)
              if not any(q == quantity and limit + 1 > m for q, m in s.bounds)]
    assert v.step not in takers and takers
    with pytest.raises(ValueError, match=rf"^{v.label} takes {quantity} <= {limit}, got {quantity} = {limit + 1}"
                                         rf".*; {v.op}/{v.backend} steps {', '.join(map(str, takers))} take it$"):
        v(*inputs) if direction == "forward" else v.backward(*inputs)
