"""vector_add: out = x + y, elementwise, same shape and dtype."""
import torch

from .spec import OpSpec


def check_shapes(label, x, y):
    if x.shape != y.shape:
        raise ValueError(f"{label}: x and y must have the same shape, got {tuple(x.shape)} "
                         f"and {tuple(y.shape)} (no broadcasting)")


def make_inputs(shape, dtype, device, gen):
    return tuple(torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
                 for _ in range(2))


SPEC = OpSpec(
    name="vector_add",
    inputs=("x", "y"),
    check_shapes=check_shapes,
    allocate=lambda x, y: torch.empty(x.shape, dtype=x.dtype, device=x.device),
    reference=lambda x, y: x.double() + y.double(),
    torch_eager=lambda x, y, out: torch.add(x, y, out=out),
    torch_expr=lambda x, y: x + y,
    make_inputs=make_inputs,
    # two reads and one write per element, nothing else
    minimal_bytes=lambda shape, dtype: 3 * torch.Size(shape).numel() * dtype.itemsize,
    flops=lambda shape: torch.Size(shape).numel(),
    headline=(2**28,),
    sweep=tuple((2**k,) for k in range(12, 29, 2)),
    # one correctly rounded add: half an ulp of the output type, with room for fp64 norms
    tolerance={torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3},
)
