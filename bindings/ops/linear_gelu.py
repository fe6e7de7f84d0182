"""linear_gelu: gelu(a @ weight + bias) with the tanh GELU, a (M, K), weight (K, N), bias (N,), fp32
accumulation and fp32 epilogue math, one rounding to the output's type. Shapes are written (M, K, N),
as matmul's. The forward keeps nothing for the backward: the backward recomputes z = a @ weight + bias
(a GEMM whose epilogue turns dy into dz = dy * gelu'(z)), then da = dz @ weight^T, dweight =
a^T @ dz and dbias = the column sums of dz. One GEMM more than storing z, and no M x N tensor
written in the forward: the forward is what inference runs."""
import math

import torch
import torch.nn.functional as F

from .matmul import INPUT_LAYOUTS, LAYERS, check_shapes as check_matmul
from .spec import HALF, Direction, Headline, OpSpec, Suite, as_is, dtype_label

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


def check_shapes(label, a, weight, bias, *rest):
    check_matmul(label, a, weight)
    n = weight.shape[1]
    if bias.shape != (n,):
        raise ValueError(f"{label}: bias must have shape ({n},), weight's columns, got {tuple(bias.shape)}")
    if rest and tuple(rest[0].shape) != (a.shape[0], n):  # the backward's dy
        raise ValueError(f"{label}: dy must have shape {(a.shape[0], n)}, the output's, got {tuple(rest[0].shape)}")


def make_inputs(shape, dtype, device, gen):
    """a ~ N(0, 1), weight ~ N(0, 1/K) (so z = a @ w is ~N(0, 1): GELU's curved part, not its
    linear tail), bias ~ N(0, 1/4)."""
    m, k, n = shape
    a = torch.randn((m, k), generator=gen, dtype=torch.float32, device=device).to(dtype)
    w = torch.randn((k, n), generator=gen, dtype=torch.float32, device=device).div_(math.sqrt(max(k, 1))).to(dtype)
    b = torch.randn((n,), generator=gen, dtype=torch.float32, device=device).mul_(0.5).to(dtype)
    return a, w, b


def make_backward_inputs(shape, dtype, device, gen):
    a, w, b = make_inputs(shape, dtype, device, gen)
    return a, w, b, torch.randn((shape[0], shape[2]), generator=gen, dtype=torch.float32, device=device).to(dtype)


def gelu_grads(z):
    """(gelu'(z), gelu''(z)) of the tanh GELU, u = sqrt(2/pi) (z + 0.044715 z^3), t = tanh(u)."""
    t = torch.tanh(SQRT_2_OVER_PI * (z + CUBIC * z**3))
    du = SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC * z**2)
    sech2 = 1.0 - t * t
    first = 0.5 * (1.0 + t) + 0.5 * z * sech2 * du
    second = sech2 * (du - z * t * du * du + 3.0 * SQRT_2_OVER_PI * CUBIC * z * z)
    return first, second


def pre_activation(a, w, b):
    return a.double() @ w.double() + b.double()


def reference(a, w, b):
    return F.gelu(pre_activation(a, w, b), approximate="tanh")


def accumulated(a, w, b):
    """|a| @ |w| + |b|, times max(1, log2 K) for the accumulation order: what z's error scales with."""
    return (a.double().abs() @ w.double().abs()) * max(1.0, math.log2(max(a.shape[1], 1))) + b.double().abs()


def error_scale(inputs, ref):
    """out against its own rounding (|out|) plus z's accumulation error carried through gelu'."""
    z = pre_activation(*inputs)
    return ref.abs() + gelu_grads(z)[0].abs() * accumulated(*inputs) + torch.finfo(inputs[0].dtype).tiny


def backward_reference(a, w, b, dy):
    dz = dy.double() * gelu_grads(pre_activation(a, w, b))[0]
    return dz @ w.double().t(), a.double().t() @ dz, dz.sum(0)


def dz_magnitude(a, w, b, dy):
    """|dy| (|gelu'(z)| + |z gelu''(z)|): dz's size, plus what z rounded to the input type (a
    relative error of z) moves it by. Each gradient is then held to the sums of these."""
    z = pre_activation(a, w, b)
    first, second = gelu_grads(z)
    return dy.double().abs() * (first.abs() + (z * second).abs())


def _sum_factor(n):
    return max(1.0, math.log2(max(n, 1)))


def da_scale(inputs, ref):
    a, w, b, dy = inputs
    return (dz_magnitude(*inputs) @ w.double().abs().t()) * _sum_factor(w.shape[1]) + torch.finfo(a.dtype).tiny


def dw_scale(inputs, ref):
    a, w, b, dy = inputs
    return (a.double().abs().t() @ dz_magnitude(*inputs)) * _sum_factor(a.shape[0]) + torch.finfo(a.dtype).tiny


def db_scale(inputs, ref):
    a = inputs[0]
    return dz_magnitude(*inputs).sum(0) * _sum_factor(a.shape[0]) + torch.finfo(a.dtype).tiny


def torch_backward(a, w, b, dy):
    """torch's autograd of addmm then gelu, with z recomputed as this op does: addmm, gelu_backward,
    two GEMMs and a column sum."""
    dz = torch.ops.aten.gelu_backward(dy, torch.addmm(b, a, w), approximate="tanh")
    return dz @ w.t(), a.t() @ dz, dz.sum(0)


def torch_unfused(a, w, b):
    """The way it is written without a fused kernel: a GEMM, a bias add, a GELU (three kernels)."""
    return F.gelu(torch.mm(a, w) + b, approximate="tanh")


def autograd_setup(ctx, inputs, output, params):
    ctx.save_for_backward(*inputs)


def autograd_grads(step_ops, ctx, grad):
    a, w, b = ctx.saved_tensors
    da, dw, db = step_ops.backward(a, w, b, grad.to(a.dtype))
    needs = ctx.needs_input_grad
    return (da if needs[0] else None), (dw if needs[1] else None), (db if needs[2] else None)


def flops(s):
    return 2 * s[0] * s[1] * s[2]


def minimal_bytes(s, dtype):
    m, k, n = s
    return (m * k + k * n + m * n + n) * dtype.itemsize


# The MLP up-projections of the matmul suite's model layers, at a decode step to a long prefill
SUITE = Suite(
    cases=tuple(((m, k, n), d) for d in HALF for m in (1, 16, 128, 1024, 4096) for k, n in LAYERS[:4]
                if 2 * m * k * n <= 1.2e12),
    rows=("M", lambda s, dtype: f"{dtype_label(dtype)} M={s[0]}"),
    cols=("K x N", lambda s, dtype: f"{s[1]}x{s[2]}"))

SPEC = OpSpec(
    name="linear_gelu",
    position=8,
    forward=Direction(
        inputs=("a", "weight", "bias"), outputs=("out",), make_inputs=make_inputs,
        allocate=lambda a, w, b: a.new_empty((a.shape[0], w.shape[1])),
        reference=reference, error_scale=error_scale,
        tolerance={torch.float16: 2e-3, torch.bfloat16: 1e-2},
        minimal_bytes=minimal_bytes, flops=flops,
        # cuBLASLt's fused bias + GELU epilogue (its tanh GELU)
        torch_eager=lambda a, w, b, out: torch._addmm_activation(b, a, w, use_gelu=True, out=out),
        torch_expr=torch_unfused,
        torch_unfused=lambda a, w, b, out: torch_unfused(a, w, b),
        # the GEMM alone, no bias and no GELU: what the fused epilogue's cost is measured against
        baselines={"bare_gemm": lambda a, w, b, out: torch.mm(a, w, out=out)},
    ),
    backward=Direction(
        inputs=("a", "weight", "bias", "dy"), outputs=("da", "dweight", "dbias"),
        make_inputs=make_backward_inputs,
        allocate=lambda a, w, b, dy: (torch.empty_like(a, memory_format=torch.contiguous_format),
                                      torch.empty_like(w, memory_format=torch.contiguous_format),
                                      torch.empty_like(b)),
        reference=backward_reference, error_scale=(da_scale, dw_scale, db_scale),
        tolerance={torch.float16: 2e-3, torch.bfloat16: 1e-2},
        # a, weight, dy in; da, dweight out (bias and dbias aside); three GEMMs of the forward's size
        minimal_bytes=lambda s, dtype: (2 * s[0] * s[1] + 2 * s[1] * s[2] + s[0] * s[2]) * dtype.itemsize,
        flops=lambda s: 4 * flops(s),  # z recomputed, da, dweight
        torch_eager=lambda a, w, b, dy, out: torch_backward(a, w, b, dy),
        torch_expr=torch_backward,
    ),
    autograd=(autograd_setup, autograd_grads),
    check_shapes=check_shapes,
    kernel_view=lambda *ts: ts,
    views={"bias": as_is, "dbias": as_is},
    dtypes=HALF,
    layout="tma",  # a matrix TMA cannot read is copied into 16-byte rows by the dispatcher
    metric="TFLOP/s",
    ceiling="fp32_fma",  # per dtype: half types against the tensor-core peak
    headlines=(
        Headline((4096, 4096, 4096), HALF),
        Headline((8192, 4096, 14336), (torch.bfloat16,), "Llama-3 8B MLP up, an 8k-token prefill"),
        Headline((4096, 8192, 28672), (torch.bfloat16,), "Llama-3 70B MLP up, 4k tokens"),
        Headline((2048, 768, 3072), (torch.bfloat16,), "GPT-2 small MLP up: the epilogue's share is largest"),
        Headline((3000, 3000, 3000), (torch.bfloat16,), "odd: no tile divides it"),
    ),
    sweep=tuple((n, n, n) for n in (512, 1024, 2048, 4096, 8192)),
    sweep_dtype=torch.bfloat16,
    test_shapes=(
        (1, 64, 8),  # one row: the smallest TMA-aligned problem
        (129, 264, 520),  # one past a tile in M; K and N multiples of 8 but of no tile
        (300, 1000, 456),  # no tile divides M, N or K: zero-filled edge tiles, masked stores
        (17, 33, 65),  # odd K and N: rows no TMA can read (copied into 16-byte rows first)
        (2049, 64, 4097),  # many tiles, one K tile, N one past 4096 (masked epilogue columns)
        (64, 4096, 64),  # long K, one output tile
        (0, 16, 8),  # M = 0: an empty result; the backward's dweight and dbias are zeros
        (8, 0, 16),  # K = 0: z = bias
    ),
    cpu_shapes=(
        (1, 8, 8),  # one row
        (17, 33, 65),  # no dimension a tile multiple
        (24, 16, 8),  # whole 16-byte rows
        (0, 16, 8),  # M = 0
    ),
    problem=lambda a, w, *rest: (a.shape[0], a.shape[1], w.shape[1]),
    bounds={"k": lambda a, *rest: a.shape[1]},  # the inner dimension: a fused epilogue needs a GEMM
    suite=SUITE,
    input_layouts={k: (lambda f: lambda a, w, b: (*f(a, w), b))(f) for k, f in INPUT_LAYOUTS.items()},
    layout_headlines=(Headline((4096, 4096, 4096), (torch.bfloat16,)),),
)
