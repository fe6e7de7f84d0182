"""rms_norm over the last dimension with a weight: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps),
fp32 math and an fp32 rstd saved for the backward (shape (*leading, 1), as torch's _fused_rms_norm).
Differentiable: dx = rstd * (g - x * rstd^2 * mean(g * x)) with g = dy * w; dweight sums
dy * x * rstd over the rows."""
import torch

from . import _norm as norm
from .spec import Direction, OpSpec, Param

EPS = norm.EPS


def check_shapes(label, x, weight, *rest):
    norm.check_shapes(label, x, weight)
    if rest:  # the backward: (x, weight, rstd, dy)
        rstd, dy = rest
        norm.check_parts(label, x, [("rstd", rstd, norm.stats_shape(x)), ("dy", dy, x.shape)])


def reference(x, w, eps=EPS):
    x64 = x.double()
    rstd = torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)
    return x64 * rstd * w.double(), rstd


def make_backward_inputs(shape, dtype, device, gen):
    """x and w, the rstd the forward saves (fp32, computed from x), and an upstream gradient."""
    x, w = norm.make_x(shape, dtype, device, gen)
    rstd = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + EPS)
    return x, w, rstd, norm.make_dy(shape, dtype, device, gen)


def backward_reference(x, w, rstd, dy):
    x64, w64, r, dy64 = x.double(), w.double(), rstd.double(), dy.double()
    g = dy64 * w64
    dx = r * (g - x64 * r.square() * (g * x64).mean(-1, keepdim=True))
    dw = (dy64 * x64 * r).reshape(-1, x.shape[-1]).sum(0)
    return dx, dw


def dx_scale(inputs, ref):
    """dx = r (g - x r^2 mean(g x)) cancels: its yardstick r (|g| + |x| r^2 mean|g x|)."""
    x, w, rstd, dy = (t.double() for t in inputs)
    g = dy * w
    return rstd * (g.abs() + x.abs() * rstd.square() * (g * x).abs().mean(-1, keepdim=True)) \
        + torch.finfo(inputs[0].dtype).tiny


def dw_scale(inputs, ref):
    x, w, rstd, dy = (t.double() for t in inputs)
    return norm.column_sum_scale(dy * x * rstd) + torch.finfo(inputs[0].dtype).tiny


def formula(x, w, eps=EPS):
    """The op in torch ops, fp32 inside (what torch.compile fuses; eager, one kernel per op)."""
    xf = x.float()
    rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (xf * rstd * w.float()).to(x.dtype), rstd


def backward_formula(x, w, rstd, dy):
    xf, g = x.float(), dy.float() * w.float()
    dx = rstd * (g - xf * rstd.square() * (g * xf).mean(-1, keepdim=True))
    dw = (dy.float() * xf * rstd).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype)


def autograd_setup(ctx, inputs, output, params):
    ctx.save_for_backward(inputs[0], inputs[1], output[1])


def autograd_grads(step_ops, ctx, grad, grad_rstd=None):
    x, w, rstd = ctx.saved_tensors
    return step_ops.backward(x, w, rstd, grad.to(x.dtype))


SPEC = OpSpec(
    name="rms_norm",
    position=5,
    forward=Direction(
        inputs=("x", "weight"), outputs=("y", "rstd"), params=(Param("eps", float, EPS),),
        fixed_dtypes={"rstd": torch.float32},
        make_inputs=norm.make_x,
        allocate=lambda x, w: (torch.empty_like(x, memory_format=torch.contiguous_format),
                               x.new_empty(norm.stats_shape(x), dtype=torch.float32)),
        reference=reference, error_scale=(lambda inputs, ref: ref.abs() + torch.finfo(inputs[0].dtype).tiny,
                                          norm.relative),
        tolerance=norm.TOLERANCE,
        # the yardstick: x read once, y written once (weight and rstd aside)
        minimal_bytes=lambda shape, dtype: 2 * torch.Size(shape).numel() * dtype.itemsize,
        flops=lambda shape: 4 * torch.Size(shape).numel(),  # square-add, scale, scale
        torch_eager=lambda x, w, out: torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], w, EPS),
        torch_expr=formula,
        torch_unfused=lambda x, w, out: formula(x, w),
    ),
    backward=Direction(
        inputs=("x", "weight", "rstd", "dy"), outputs=("dx", "dweight"),
        fixed_dtypes={"rstd": torch.float32},
        make_inputs=make_backward_inputs,
        allocate=lambda x, w, rstd, dy: (torch.empty_like(x, memory_format=torch.contiguous_format),
                                         torch.empty_like(w)),
        reference=backward_reference, error_scale=(dx_scale, dw_scale), tolerance=norm.TOLERANCE,
        minimal_bytes=lambda shape, dtype: 3 * torch.Size(shape).numel() * dtype.itemsize,  # x, dy in; dx out
        flops=lambda shape: 8 * torch.Size(shape).numel(),
        torch_eager=lambda x, w, rstd, dy, out: torch.ops.aten._fused_rms_norm_backward(
            dy, x, [x.shape[-1]], rstd, w, [True, True]),
        torch_expr=backward_formula,
        torch_unfused=lambda x, w, rstd, dy, out: backward_formula(x, w, rstd, dy),
    ),
    autograd=(autograd_setup, autograd_grads),
    saved=("rstd",),
    check_shapes=check_shapes,
    backward_inputs=lambda x, w: (x, w, x.new_empty(norm.stats_shape(x), dtype=torch.float32), x),
    **norm.SHARED,
)
