"""vector_add: out = x + y, elementwise, same shape and dtype."""
import torch

from .spec import ALL_FLOAT, Direction, Headline, OpSpec, Suite, dtype_label


def check_shapes(label, x, y):
    if x.shape != y.shape:
        raise ValueError(f"{label}: x and y must have the same shape, got {tuple(x.shape)} "
                         f"and {tuple(y.shape)} (no broadcasting)")


def make_inputs(shape, dtype, device, gen):
    return tuple(torch.randn(shape, generator=gen, dtype=torch.float32, device=device).to(dtype)
                 for _ in range(2))


def reference(x, y):
    # The one correctly rounded add torch does (fp32 math, then the output type), exactly: a kernel
    # that adds in fp32 and rounds once must match it bit for bit, so the gate compares exactly.
    return (x.float() + y.float()).to(x.dtype).double()


# Sizes users bring: a few KB (launch-bound) to 2 GB of fp32 per operand (three of them, each
# step's outputs and the fp64 check beside them), powers of two and odd ones.
SUITE_SIZES = (2**10, 10_007, 2**14, 2**18, 1_000_003, 2**22, 12_345_679, 2**26, 2**28, 2**29)
SUITE = Suite(cases=tuple(((n,), d) for d in (torch.float32, torch.bfloat16) for n in SUITE_SIZES),
              rows=("dtype", lambda shape, dtype: dtype_label(dtype)),
              cols=("elements", lambda shape, dtype: f"{shape[0]:,}"))

SPEC = OpSpec(
    name="vector_add",
    position=1,
    forward=Direction(
        inputs=("x", "y"), outputs=("out",), make_inputs=make_inputs,
        allocate=lambda x, y: torch.empty_like(x, memory_format=torch.contiguous_format),
        reference=reference,
        error_scale=lambda inputs, ref: 1.0,  # absolute difference: any nonzero one fails
        tolerance={d: 0.0 for d in ALL_FLOAT},
        # two reads and one write per element, nothing else
        minimal_bytes=lambda shape, dtype: 3 * torch.Size(shape).numel() * dtype.itemsize,
        flops=lambda shape: torch.Size(shape).numel(),
        torch_eager=lambda x, y, out: torch.add(x, y, out=out),
        torch_expr=lambda x, y: x + y,
    ),
    check_shapes=check_shapes,
    kernel_view=lambda *ts: tuple(t.view(-1) for t in ts),  # contiguous: a free view
    headlines=(Headline((2**28,), ALL_FLOAT),),
    sweep=tuple((2**k,) for k in range(12, 29, 4)),
    sweep_dtype=torch.float32,
    problem=lambda x, *rest: (x.numel(),),
    suite=SUITE,
    test_shapes=(
        (1,),  # one element, one partial vector
        (17,),  # prime: scalar tail only, no full 16-byte vector for fp16/bf16 (8 per vector)
        (4097,),  # 2^12 + 1: one element past a block/vector boundary
        (2**20 + 3,),  # a full grid-stride sweep plus a 3-element tail
        (2**28,),  # 1 GiB of fp32: far past the 50 MiB L2, the bench's headline size
    ),
    cpu_shapes=(
        (1,),  # a single element: every lane but one masked off
        (17,),  # a prime below one block/vector: only the masked tail
        (100003,),  # a prime over many blocks: the last block partial, n % 8 != 0
    ),
)
