"""reduce_sum: the sum of all elements as a 0-dim float32 tensor, accumulated in fp32."""
import torch

from .spec import OpSpec


def make_inputs(shape, dtype, device, gen):
    return (torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype),)


SPEC = OpSpec(
    name="reduce_sum",
    inputs=("x",),
    check_shapes=lambda label, x: None,  # any shape: every element is summed
    allocate=lambda x: torch.empty((), dtype=torch.float32, device=x.device),
    reference=lambda x: x.double().sum(),
    # sum(..., out=) needs a dim: reduce the flattened tensor's only one (same kernel as sum(x))
    torch_eager=lambda x, out: torch.sum(x.reshape(-1), 0, dtype=torch.float32, out=out),
    torch_expr=lambda x: torch.sum(x, dtype=torch.float32),
    make_inputs=make_inputs,
    minimal_bytes=lambda shape, dtype: torch.Size(shape).numel() * dtype.itemsize,  # read once
    flops=lambda shape: torch.Size(shape).numel(),
    headline=(2**28,),
    sweep=tuple((2**k,) for k in range(12, 29, 2)),
    # |out - ref| <= 1e-5 * sum|x|: what fp32 accumulation must reach, whatever the order
    error_scale=lambda inputs, ref: inputs[0].double().abs().sum().item(),
    tolerance={torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5},
    tiers=("cub",),
    ceiling="dram_read",  # a reduction only reads: its roof is the read-only bandwidth
)
