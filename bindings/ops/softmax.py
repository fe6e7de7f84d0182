"""softmax over the last dimension (any leading dimensions), fp32 math inside; differentiable:
the backward is dx = y * (dy - sum(y * dy)) per row, run by the same step's backward kernel."""
import math

import torch

from .spec import Direction, Headline, OpSpec, Suite, SweepAxis, address, dtype_label

SWEEP_NUMEL = 2**26  # elements in every shape of the row-length sweep: 256 MB of fp32


def check_shapes(label, *tensors):
    x = tensors[0]
    if x.dim() == 0:
        raise ValueError(f"{label}: softmax needs at least one dimension (the row), got a 0-dim tensor")
    if any(t.shape != x.shape for t in tensors[1:]):
        raise ValueError(f"{label}: y and dy must have one shape, got {[tuple(t.shape) for t in tensors]}")


def rows_view(*tensors):
    """rows x cols: every leading dimension folded into rows. view() never copies: a tensor whose
    leading dimensions cannot fold raises, and the layout check makes it contiguous first."""
    return tuple(t.view(-1, t.shape[-1]) if t.shape[-1] else t.reshape(math.prod(t.shape[:-1]), 0) for t in tensors)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def row_bytes(*tensors):
    """Bytes of one row of every input, each rounded up to whole 16-byte vectors: what a step that
    keeps the row on chip must hold (forward x; backward y and dy). CUDA step 5 holds up to one
    SM's 227 KB; steps 6 and 8 a cluster of 16 SMs' worth."""
    x = tensors[0]
    return len(tensors) * ceil_div(x.shape[-1] * x.element_size(), 16) * 16


def unaligned_rows(*tensors):
    """1 when some row of an input or of the output is not whole 16-byte vectors from a 16-byte
    boundary. CUDA steps 7 and 8 move rows only as 16-byte vectors, with no element-wise tail."""
    x = tensors[0]
    size, cols = x.element_size(), x.shape[-1]
    pitches = [t.stride(-2) if t.dim() >= 2 else cols for t in tensors] + [cols]  # + the output's
    return int(any((p * size) % 16 for p in pitches) or any(address(t) % 16 for t in tensors))


def uneven_register_slices(*tensors):
    """1 when the row does not cut into equal slices of whole 16-byte vectors, one per CTA of
    16,384 elements at most (16 CTAs at most): CUDA step 7 holds exactly such slices in registers."""
    cols, vec = tensors[0].shape[-1], 16 // tensors[0].element_size()
    ranks = max(1, ceil_div(cols, 16384))
    slice_ = ceil_div(ceil_div(cols, ranks), vec) * vec
    return int(ranks > 16 or ranks * slice_ != cols)


def make_inputs(shape, dtype, device, gen):
    return (torch.randn(shape, generator=gen, dtype=torch.float32, device=device).mul_(2).to(dtype),)


def make_backward_inputs(shape, dtype, device, gen):
    """y = softmax(x) (a real forward output, rows summing to 1) and a random upstream gradient."""
    x = torch.randn(shape, generator=gen, dtype=torch.float32, device=device).mul_(2)
    dy = torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
    return torch.softmax(x, -1).to(dtype), dy.to(dtype)


def forward_scale(inputs, ref):
    """Relative to each probability, with a floor far below the row's largest one (a kernel that
    flushes a 1e-40 probability to zero is right) and the output type's smallest normal."""
    row_max = ref.abs().amax(-1, keepdim=True) if ref.numel() else ref
    return ref.abs() + 1e-7 * row_max + torch.finfo(inputs[0].dtype).tiny


def unfused(x, out):
    """softmax written from the formula, one torch op per line (the Triton tutorial's naive_softmax):
    max, subtract, exp, sum and divide each run as their own kernel with x-sized temporaries
    between them: 5 reads and 3 writes of x's size where a fused kernel does 1 and 1. In 16-bit,
    x - max is rounded to the input type before exp (~4% in bf16): the gate reports it wrong."""
    x_max = x.max(-1, keepdim=True).values
    e = torch.exp(x - x_max)
    torch.div(e, e.sum(-1, keepdim=True), out=out)


def backward_reference(y, dy):
    y64, dy64 = y.double(), dy.double()
    return y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))


def backward_scale(inputs, ref):
    """dx_i = y_i (dy_i - s) cancels; its yardstick is y_i (|dy_i| + sum_j |y_j dy_j|)."""
    y, dy = (t.double() for t in inputs)
    return y * (dy.abs() + (y * dy).abs().sum(-1, keepdim=True)) + torch.finfo(inputs[0].dtype).tiny


def autograd_setup(ctx, inputs, output, params):
    ctx.save_for_backward(output)


def autograd_grads(step_ops, ctx, grad):
    (y,) = ctx.saved_tensors
    return step_ops.backward(y, grad.to(y.dtype))


# Rows users bring: one row (a single decode step) to 32,768 (a long batch of tokens) x row
# lengths from attention rows (128, 1,000, 4,096) to vocabularies (32,000; GPT-2's 50,257;
# 131,072) and a 1 MB fp32 row; at most 2^28 elements (1 GB of fp32).
SUITE_ROWS = (1, 8, 64, 512, 4096, 32768)
SUITE_COLS = (128, 1000, 4096, 32000, 50257, 131072, 262144)
SUITE = Suite(cases=tuple(((r, c), d) for d in (torch.float32, torch.bfloat16) for r in SUITE_ROWS
                          for c in SUITE_COLS if r * c <= 2**28),
              rows=("rows", lambda shape, dtype: f"{dtype_label(dtype)} x {shape[0]:,}"),
              cols=("row length", lambda shape, dtype: f"{shape[1]:,}"))

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}

SPEC = OpSpec(
    name="softmax",
    position=3,
    forward=Direction(
        inputs=("x",), outputs=("out",), make_inputs=make_inputs,
        allocate=lambda x: torch.empty_like(x, memory_format=torch.contiguous_format),
        reference=lambda x: torch.softmax(x.double(), -1),
        error_scale=forward_scale, tolerance=TOLERANCE, row_inputs=lambda inputs, rows: (inputs[0][rows],),
        minimal_bytes=lambda shape, dtype: 2 * torch.Size(shape).numel() * dtype.itemsize,  # 1 read + 1 write
        flops=lambda shape: 5 * torch.Size(shape).numel(),  # max, subtract, exp, sum, scale
        torch_eager=lambda x, out: torch.ops.aten._softmax.out(x, -1, False, out=out),
        torch_expr=lambda x: torch.softmax(x, -1),
        torch_unfused=unfused,
    ),
    backward=Direction(
        inputs=("y", "dy"), outputs=("dx",), make_inputs=make_backward_inputs,
        allocate=lambda y, dy: torch.empty_like(y, memory_format=torch.contiguous_format),
        reference=backward_reference, error_scale=backward_scale, tolerance=TOLERANCE,
        row_inputs=lambda inputs, rows: tuple(t[rows] for t in inputs),
        minimal_bytes=lambda shape, dtype: 3 * torch.Size(shape).numel() * dtype.itemsize,  # 2 reads + 1 write
        flops=lambda shape: 4 * torch.Size(shape).numel(),
        torch_eager=lambda y, dy, out: torch.ops.aten._softmax_backward_data.out(dy, y, -1, y.dtype, grad_input=out),
        torch_expr=lambda y, dy: torch.ops.aten._softmax_backward_data(dy, y, -1, y.dtype),
    ),
    autograd=(autograd_setup, autograd_grads),
    check_shapes=check_shapes,
    kernel_view=rows_view,
    layout="rows",
    headlines=(
        Headline((4096, 1024), (torch.float32,), "short rows, 32 MB: L2-sized, launch-sensitive"),
        Headline((4096, 4096), (torch.float32, torch.bfloat16)),
        Headline((16384, 8192), (torch.bfloat16,)),
        Headline((32768, 4096), (torch.bfloat16,)),
        Headline((4096, 131072), (torch.bfloat16,), "long rows: 256 KB a row"),
        Headline((4096, 262144), (torch.float32,), "long rows: 1 MB a row, more than one SM holds"),
    ),
    # row length 256 ... 262,144 at a fixed 256 MB of fp32 input
    sweep=tuple((SWEEP_NUMEL // 2**k, 2**k) for k in range(8, 19, 2)),
    sweep_dtype=torch.float32,
    sweep_axis=SweepAxis(
        "row length", "row length (elements, log scale)", lambda shape: shape[-1],
        f"every point holds 2^{SWEEP_NUMEL.bit_length() - 1} elements (rows x row length): only the row length changes"),
    test_shapes=(
        (1, 1),  # one element: the answer is exactly 1
        (1, 2),  # two elements, one row: every lane but two masked
        (7, 3000),  # 3000 = not a power of two, not a multiple of a 16-byte vector of fp32 x warp
        (64, 1025),  # one past a 1024 tile: a second chunk holding one element
        # a long row on few rows: the block-per-row / looping paths; CUDA step 5's row in shared
        # memory (forward, and 16-bit backward); clusters of CUDA step 7 (fp32: 4 CTAs of 12,500)
        # and step 8 (fp32 7 CTAs of 7,144, 16-bit 4 of 12,504: a shorter last slice); Triton
        # step 4's split rows (13 fp32 chunks, 7 16-bit forward)
        (5, 50000),
        (2, 3, 777),  # leading dimensions folded into rows; 777 odd
        (300, 4097),  # many rows, one past 4096 (the register-tile size of several steps)
        # 2^18 + 7: CUDA step 6's 16-CTA cluster and Triton step 4's split rows (65 fp32 chunks,
        # the last of 7 elements). CUDA steps 7-8 refuse it before launch (odd cols are not whole
        # 16-byte vectors: their `unaligned_rows` limit)
        (3, 262151),
        # 2^18, aligned: the long-row paths as benchmarked (fp32 headline 4096 x 262144). CUDA
        # step 7: 16 CTAs of 16,384 in registers, fp32 and 16-bit; step 8: 16 bulk-copied slices
        # of 16,384 (64 KB fp32, 32 KB 16-bit; backward twice that); Triton step 4 on 132 SMs:
        # 64 fp32 / 32 16-bit forward chunks, 64 backward, each one tile
        (3, 262144),
        # 2^17, aligned: the bf16 headline's row (4096 x 131072). CUDA step 7: clusters of 8 CTAs
        # (16,384 each); step 8: 16-bit 8 slices of 16,384, fp32 16 slices of 8,192 (32 KB a slice)
        (2, 131072),
        (0, 100),  # zero rows: an empty result, no launch
    ),
    cpu_shapes=(
        (1, 1),  # one element
        (3, 7),  # tiny rows, odd
        (4, 1025),  # one past a power of two
        # Triton step 2's loop over the row: 3 blocks of 4,096, the last ragged (808); step 4
        # under the interpreter (sm_count 1): one chunk of several tiles (3 of 4,096 fp32 / 2 of
        # 8,192 fp16 forward, 3 of 4,096 backward), its two-pass loop; step 3's single tile
        (2, 9000),
        # past 32,768: Triton step 1 refuses it (its Max: cols <= 32768, checked before launch);
        # step 3 takes its online loop, forward and backward (5 blocks of 8,192, the last of 232);
        # step 2 loops 9 blocks; step 4 one chunk of 9 fp32 / 5 fp16 tiles
        (1, 33000),
        (2, 3, 33),  # leading dimensions
        (0, 5),  # zero rows
    ),
    bounds={"cols": lambda x, *rest: x.shape[-1], "row_bytes": row_bytes, "unaligned_rows": unaligned_rows,
            "uneven_register_slices": uneven_register_slices},
    problem=lambda x, *rest: (x.numel() // max(x.shape[-1], 1), x.shape[-1]),
    suite=SUITE,
    backward_inputs=lambda x: (x, x),
    peers=("liger",),
    ceiling="dram_copy",
)
