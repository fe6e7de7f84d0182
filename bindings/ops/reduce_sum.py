"""reduce_sum: the sum of all elements as a 0-dim float32 tensor, accumulated in fp32."""
import torch

from .spec import ALL_FLOAT, Direction, Headline, OpSpec, Suite, dtype_label


def make_inputs(shape, dtype, device, gen):
    return (torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype),)


def positive_inputs(shape, dtype, device, gen):
    """All-positive data: no cancellation, so a skipped block moves the sum by its own share
    (randn's sum hides a skipped 0.1% inside the 1e-5 * sum|x| bound; this one does not)."""
    return (torch.rand(shape, generator=gen, dtype=torch.float32, device=device).add_(0.5).to(dtype),)


# Sizes users bring: a few KB (launch-bound) to 4 GB of fp32, powers of two and odd ones.
SUITE_SIZES = (2**10, 10_007, 2**14, 2**18, 1_000_003, 2**22, 12_345_679, 2**26, 2**28, 2**30)
SUITE = Suite(cases=tuple(((n,), d) for d in (torch.float32, torch.bfloat16) for n in SUITE_SIZES),
              rows=("dtype", lambda shape, dtype: dtype_label(dtype)),
              cols=("elements", lambda shape, dtype: f"{shape[0]:,}"))

SPEC = OpSpec(
    name="reduce_sum",
    position=2,
    forward=Direction(
        inputs=("x",), outputs=("out",), make_inputs=make_inputs,
        allocate=lambda x: x.new_empty((), dtype=torch.float32),
        reference=lambda x: x.double().sum(),
        # |out - ref| <= 1e-5 * sum|x|: what fp32 accumulation must reach, whatever the order
        error_scale=lambda inputs, ref: inputs[0].double().abs().sum(),
        tolerance={d: 1e-5 for d in ALL_FLOAT},
        minimal_bytes=lambda shape, dtype: torch.Size(shape).numel() * dtype.itemsize,  # read once
        flops=lambda shape: torch.Size(shape).numel(),
        # sum(..., out=) needs a dim: reduce the flattened tensor's only one (same kernel as sum(x))
        torch_eager=lambda x, out: torch.sum(x.reshape(-1), 0, dtype=torch.float32, out=out),
        torch_expr=lambda x: torch.sum(x, dtype=torch.float32),
        gate_inputs=positive_inputs,
    ),
    check_shapes=lambda label, x: None,  # any shape: every element is summed
    kernel_view=lambda *ts: tuple(t.view(-1) for t in ts),  # contiguous: a free view
    headlines=(Headline((2**28,), ALL_FLOAT),),
    sweep=tuple((2**k,) for k in range(12, 29, 4)),
    sweep_dtype=torch.float32,
    problem=lambda x, *rest: (x.numel(),),
    suite=SUITE,
    test_shapes=(
        (0,),  # empty: 0.0 without launching an empty grid
        (1,),  # a single element through every pass
        (31,),  # less than a warp: shuffles with missing lanes
        (1025,),  # 2 x 512 + 1: one extra block holding one element
        (2**20 + 7,),  # many blocks, n % 8 != 0: the vector tail, a multi-pass partial count
        (2**28,),  # 1 GiB fp32, the headline size: grid-stride loops run many iterations
    ),
    cpu_shapes=(
        (0,),  # the empty sum: 0.0, and no launch with a zero-sized grid
        (1,),  # one element: every tree level but the first is padding
        (31,),  # under one warp, not a power of two
        (1025,),  # one past a 1024 block: a second program with a single element
        (100003,),  # prime, many programs, a ragged last block
    ),
    ceiling="dram_read",  # a reduction only reads: its roof is the read-only bandwidth
    tiers=("cub",),
)
