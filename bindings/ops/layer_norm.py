"""layer_norm over the last dimension with weight and bias: xhat = (x - mean) * rstd, y = xhat * w + b,
rstd = 1/sqrt(var + eps) (biased variance), fp32 math; fp32 mean and rstd saved for the backward
(shape (*leading, 1), as torch's native_layer_norm). Differentiable: with g = dy * w,
dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dweight sums dy * xhat and dbias dy over rows."""
import torch

from . import _norm as norm
from .spec import Direction, OpSpec, Param

EPS = norm.EPS


def check_shapes(label, x, weight, *rest):
    norm.check_shapes(label, x, weight)
    stats = norm.stats_shape(x)
    if len(rest) == 1:  # the forward: (x, weight, bias)
        norm.check_parts(label, x, [("bias", rest[0], weight.shape)])
    else:  # the backward: (x, weight, mean, rstd, dy)
        mean, rstd, dy = rest
        norm.check_parts(label, x, [("mean", mean, stats), ("rstd", rstd, stats), ("dy", dy, x.shape)])


def make_inputs(shape, dtype, device, gen):
    x, w = norm.make_x(shape, dtype, device, gen)
    b = torch.randn(shape[-1:], generator=gen, dtype=torch.float32, device=device).to(dtype)
    return x, w, b


def stats(x, eps=EPS):
    """fp64 mean and rstd of each row (biased variance, two-pass: exact enough to judge by)."""
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    return mean, torch.rsqrt((x64 - mean).square().mean(-1, keepdim=True) + eps)


def reference(x, w, b, eps=EPS):
    mean, rstd = stats(x, eps)
    return (x.double() - mean) * rstd * w.double() + b.double(), mean, rstd


def y_scale(inputs, ref):
    """y = xhat w + b cancels where b ~ -xhat w, and x - mean in fp32 is rounded at the scale of
    |x| (an x near the mean loses its digits): against (|x| + |mean|) rstd |w| + |b|."""
    x, w, b = (t.double() for t in inputs)
    mean, rstd = stats(inputs[0])
    return (x.abs() + mean.abs()) * rstd * w.abs() + b.abs() + torch.finfo(inputs[0].dtype).tiny


def mean_scale(inputs, ref):
    """The mean against the mean of magnitudes (a row of mean ~0 is judged in the data's units)."""
    return inputs[0].double().abs().mean(-1, keepdim=True) + torch.finfo(torch.float32).tiny


def make_backward_inputs(shape, dtype, device, gen):
    """x and w, the mean and rstd the forward saves (fp32, from x), and an upstream gradient."""
    x, w, _ = make_inputs(shape, dtype, device, gen)
    mean, rstd = (s.float() for s in stats(x))
    return x, w, mean, rstd, norm.make_dy(shape, dtype, device, gen)


def backward_reference(x, w, mean, rstd, dy):
    x64, dy64, r = x.double(), dy.double(), rstd.double()
    xhat = (x64 - mean.double()) * r
    g = dy64 * w.double()
    dx = r * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    n = x.shape[-1]
    return dx, (dy64 * xhat).reshape(-1, n).sum(0), dy64.reshape(-1, n).sum(0)


def dx_scale(inputs, ref):
    """dx = r (g - mean(g) - xhat mean(g xhat)) cancels: r (|g| + mean|g| + |xhat| mean|g xhat|)."""
    x, w, mean, rstd, dy = (t.double() for t in inputs)
    xhat, g = (x - mean) * rstd, dy * w
    return rstd * (g.abs() + g.abs().mean(-1, keepdim=True) + xhat.abs() * (g * xhat).abs().mean(-1, keepdim=True)) \
        + torch.finfo(inputs[0].dtype).tiny


def dw_scale(inputs, ref):
    x, w, mean, rstd, dy = (t.double() for t in inputs)
    return norm.column_sum_scale(dy * (x - mean) * rstd) + torch.finfo(inputs[0].dtype).tiny


def db_scale(inputs, ref):
    return norm.column_sum_scale(inputs[4].double()) + torch.finfo(inputs[0].dtype).tiny


def formula(x, w, b, eps=EPS):
    """The op in torch ops, fp32 inside (what torch.compile fuses; eager, one kernel per op)."""
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt((xf - mean).square().mean(-1, keepdim=True) + eps)
    return ((xf - mean) * rstd * w.float() + b.float()).to(x.dtype), mean, rstd


def backward_formula(x, w, mean, rstd, dy):
    xhat = (x.float() - mean) * rstd
    g = dy.float() * w.float()
    dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    n = x.shape[-1]
    dw = (dy.float() * xhat).reshape(-1, n).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype), dy.float().reshape(-1, n).sum(0).to(w.dtype)


def autograd_setup(ctx, inputs, output, params):
    ctx.save_for_backward(inputs[0], inputs[1], output[1], output[2])


def autograd_grads(step_ops, ctx, grad, grad_mean=None, grad_rstd=None):
    x, w, mean, rstd = ctx.saved_tensors
    return step_ops.backward(x, w, mean, rstd, grad.to(x.dtype))


def stat_outputs(x):
    return tuple(x.new_empty(norm.stats_shape(x), dtype=torch.float32) for _ in range(2))


SPEC = OpSpec(
    name="layer_norm",
    position=6,
    forward=Direction(
        inputs=("x", "weight", "bias"), outputs=("y", "mean", "rstd"), params=(Param("eps", float, EPS),),
        fixed_dtypes={"mean": torch.float32, "rstd": torch.float32},
        make_inputs=make_inputs,
        allocate=lambda x, w, b: (torch.empty_like(x, memory_format=torch.contiguous_format), *stat_outputs(x)),
        reference=reference, error_scale=(y_scale, mean_scale, norm.relative), tolerance=norm.TOLERANCE,
        # the yardstick: x read once, y written once (weight, bias and statistics aside)
        minimal_bytes=lambda shape, dtype: 2 * torch.Size(shape).numel() * dtype.itemsize,
        flops=lambda shape: 7 * torch.Size(shape).numel(),
        torch_eager=lambda x, w, b, out: torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, EPS),
        torch_expr=formula,
        torch_unfused=lambda x, w, b, out: formula(x, w, b),
    ),
    backward=Direction(
        inputs=("x", "weight", "mean", "rstd", "dy"), outputs=("dx", "dweight", "dbias"),
        fixed_dtypes={"mean": torch.float32, "rstd": torch.float32},
        make_inputs=make_backward_inputs,
        allocate=lambda x, w, mean, rstd, dy: (torch.empty_like(x, memory_format=torch.contiguous_format),
                                               torch.empty_like(w), torch.empty_like(w)),
        reference=backward_reference, error_scale=(dx_scale, dw_scale, db_scale), tolerance=norm.TOLERANCE,
        minimal_bytes=lambda shape, dtype: 3 * torch.Size(shape).numel() * dtype.itemsize,  # x, dy in; dx out
        flops=lambda shape: 11 * torch.Size(shape).numel(),
        # the bias argument only says that dbias is wanted (its values are not read): w stands in
        torch_eager=lambda x, w, mean, rstd, dy, out: torch.ops.aten.native_layer_norm_backward(
            dy, x, [x.shape[-1]], mean, rstd, w, w, [True, True, True]),
        torch_expr=backward_formula,
        torch_unfused=lambda x, w, mean, rstd, dy, out: backward_formula(x, w, mean, rstd, dy),
    ),
    autograd=(autograd_setup, autograd_grads),
    saved=("mean", "rstd"),
    check_shapes=check_shapes,
    backward_inputs=lambda x, w, b: (x, w, *stat_outputs(x), x),
    **norm.SHARED,
)
