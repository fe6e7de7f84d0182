"""attention beyond the defaults the generic tests run (non-causal): every step with causal
masking (Sq = Sk, Sq < Sk, Sq > Sk), forward and backward against fp64 (at the spec's scale, which
the backward's yardsticks assume; the public call's tests take other scales);
the public call (scale=None is 1/sqrt(head_dim)) against F.scaled_dot_product_attention and
through autograd. Triton steps also run here under the interpreter on CPU."""
import pytest
import torch
import torch.nn.functional as F

import rosetta
from helpers import GPU, gpu_memory_allows
from rosetta.dispatch import fits
from rosetta.ops import SPECS
from rosetta.ops.attention import SCALE, make_inputs, reference

SPEC = SPECS["attention"]
STEPS = rosetta.variants("attention")
# (B, H, Sq, Sk, D): square, fewer queries than keys, more queries than keys; ragged everywhere
GPU_SHAPES = ((1, 2, 129, 129, 64), (2, 1, 65, 300, 128), (1, 2, 300, 70, 64))
CPU_SHAPES = ((1, 1, 9, 9, 64), (1, 1, 5, 12, 64), (1, 1, 12, 5, 128))


def check(v, shape, dtype, device, gen, causal, scale=SCALE):
    """Forward against fp64; at the spec's scale the backward too."""
    inputs = make_inputs(shape, dtype, device, gen)
    if not fits(v, inputs):  # a declared limit: refused before launch, naming the steps that take it
        with pytest.raises(ValueError, match="steps"):
            v(*inputs)
        return
    params = (causal, scale)
    out = v(*inputs, params=params)
    ref = reference(*inputs, *params)
    tol = SPEC.forward.tolerance[dtype]
    for name, (err, *_rest) in SPEC.forward.output_errors(out, ref, inputs):
        assert err <= tol, f"{v.label} causal={causal} scale={scale} {shape}: {name} error {err:.3g} > {tol}"
    if scale != SCALE:
        return
    dout = torch.randn(out[0].shape, generator=gen, device=device).to(dtype)
    back = (*inputs, out[0], out[1], dout)
    grads = v.backward(*back, params=params)
    ref_grads = SPEC.backward.reference(*back, *params)
    for name, (err, *_rest) in SPEC.backward.output_errors(grads, ref_grads, back):
        assert err <= tol, f"{v.label} causal={causal} {shape}: {name} error {err:.3g} > {tol}"


@pytest.mark.gpu
@pytest.mark.parametrize("causal", (0, 1))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("v", STEPS, ids=lambda v: v.label)
def test_step_causal_and_scale(gen, v, dtype, causal):
    for shape in GPU_SHAPES:
        check(v, shape, dtype, GPU, gen, causal)


@pytest.mark.parametrize("causal", (0, 1))
@pytest.mark.parametrize("v", [v for v in STEPS if v.backend == "triton"], ids=lambda v: v.label)
def test_triton_step_causal_on_cpu(interpreter, cpu_gen, v, causal):
    for shape in CPU_SHAPES:
        check(v, shape, torch.float16, "cpu", cpu_gen, causal)


# Steps that fold the scale into the exponent (max on raw scores, exp2(k s - m)) may do so only for
# k > 0: under a zero scale a masked score's -inf * 0 is NaN, and under a negative one k max(s) is
# not the row max of k s (exp2 may overflow on large scores).
ODD_SCALES = (-0.2, 0.0, 0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", ODD_SCALES)
@pytest.mark.parametrize("v", STEPS, ids=lambda v: v.label)
def test_step_forward_at_any_scale(gen, v, scale):
    for causal in (0, 1):
        for shape in GPU_SHAPES:
            check(v, shape, torch.bfloat16, GPU, gen, causal, scale)


@pytest.mark.parametrize("scale", ODD_SCALES)
@pytest.mark.parametrize("v", [v for v in STEPS if v.backend == "triton"], ids=lambda v: v.label)
def test_triton_step_forward_at_any_scale_on_cpu(interpreter, cpu_gen, v, scale):
    for causal in (0, 1):
        for shape in CPU_SHAPES:
            check(v, shape, torch.float16, "cpu", cpu_gen, causal, scale)


def rows_far_apart(shape, row_stride, dtype, gen):
    """k or v of shape (1, 1, S, D) whose rows lie row_stride elements apart in one big buffer:
    the offsets inside the head pass 2^31 elements, so 32-bit row offsets would wrap."""
    _, _, s, d = shape
    buffer = torch.empty((s - 1) * row_stride + d, device=GPU, dtype=dtype)  # only the rows are written
    t = buffer.as_strided(shape, (s * row_stride, s * row_stride, row_stride, 1))
    t.copy_(torch.randn(shape, device=GPU, generator=gen).to(dtype))
    return t


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("v", STEPS, ids=lambda v: v.label)
def test_step_row_offsets_past_2_31_inside_a_head(gen, huge_gpu_memory, v):
    """Keys 2^24 elements apart (130 rows: 2.2 x 2^31 elements from the first to the last) with
    ragged tiles, forward and backward against fp64: a step addressing rows inside a head with
    32-bit offsets (Triton step 2's ROWS32) must see that they do not fit and use 64 bits."""
    if not gpu_memory_allows(2 * 130 * 2**24 * 2 + 2**32):
        pytest.skip("not enough GPU memory")
    q = torch.randn(1, 1, 70, 64, device=GPU, generator=gen).to(torch.bfloat16)
    k, val = (rows_far_apart((1, 1, 130, 64), 2**24, torch.bfloat16, gen) for _ in range(2))
    inputs = (q, k, val)
    if not fits(v, inputs):
        pytest.skip(f"{v.label} declares a limit these strides pass")
    for causal in (0, 1):
        params = (causal, SCALE)
        out = v(*inputs, params=params)
        tol = SPEC.forward.tolerance[torch.bfloat16]
        for name, (err, *_rest) in SPEC.forward.output_errors(out, reference(*inputs, *params), inputs):
            assert err <= tol, f"{v.label} causal={causal}: {name} error {err:.3g} > {tol}"
        back = (*inputs, out[0], out[1], torch.randn(out[0].shape, generator=gen, device=GPU).to(torch.bfloat16))
        grads = v.backward(*back, params=params)
        for name, (err, *_rest) in SPEC.backward.output_errors(grads, SPEC.backward.reference(*back, *params), back):
            assert err <= tol, f"{v.label} causal={causal}: {name} error {err:.3g} > {tol}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", rosetta.BACKENDS)
@pytest.mark.parametrize("causal", (False, True))
def test_public_call_matches_sdpa_and_autograd(gen, backend, causal):
    q, k, v = (t.requires_grad_() for t in make_inputs((2, 4, 200, 200, 128), torch.bfloat16, GPU, gen))
    out = rosetta.attention(q, k, v, causal=causal, backend=backend)
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    expected = F.scaled_dot_product_attention(*(t.float() for t in leaves), is_causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    dout = torch.randn_like(out)
    out.backward(dout)
    expected.backward(dout.float())
    for ours, theirs in zip((q, k, v), leaves):
        torch.testing.assert_close(ours.grad.float(), theirs.grad.float(), atol=5e-2, rtol=5e-2)


def test_bad_shapes_are_refused_with_what_to_do():
    q = torch.empty(1, 2, 3, 96, dtype=torch.float16)
    with pytest.raises(ValueError, match="head_dim must be one of"):
        rosetta.attention(q, q, q)
    with pytest.raises(ValueError, match="4-D"):
        rosetta.attention(q[0], q[0], q[0])
    k = torch.empty(1, 2, 0, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="at least one key"):
        rosetta.attention(torch.empty(1, 2, 3, 64, dtype=torch.float16), k, k)
    with pytest.raises(ValueError, match="float16"):
        rosetta.attention(*(torch.empty(1, 2, 3, 64),) * 3)
