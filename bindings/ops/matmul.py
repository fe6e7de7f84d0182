"""matmul: (M, K) @ (K, N) -> (M, N) as torch.matmul for 2-D inputs, fp32 accumulation, output dtype
= input dtype. Shapes are written (M, K, N). Differentiable: dA = dC @ B^T and dB = A^T @ dC run
through the same step, on transposed views."""
import math

import torch

from .spec import HALF, Direction, Headline, OpSpec, Suite, address, dtype_label, fits_layout, layout_copy

FP32 = (torch.float32,)


def check_shapes(label, a, b):
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{label}: a and b must be 2-D (M, K) and (K, N), got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{label}: inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)} "
                         f"(a.shape[1] must equal b.shape[0])")


def make_inputs(shape, dtype, device, gen):
    m, k, n = shape
    a = torch.randn((m, k), generator=gen, dtype=torch.float32, device=device).to(dtype)
    b = torch.randn((k, n), generator=gen, dtype=torch.float32, device=device).to(dtype)
    return a, b


def error_scale(inputs, ref):
    """Each output against (|A| |B|)_ij: the sum of the magnitudes it accumulated (cancellation
    cannot make a right answer fail), times max(1, log2 K) for the accumulation order, with the
    output type's smallest normal as a floor (an fp16 result below it is rounded absolutely)."""
    a, b = (t.double() for t in inputs)
    return (a.abs() @ b.abs()) * max(1.0, math.log2(max(a.shape[1], 1))) + torch.finfo(inputs[0].dtype).tiny


def is_column_major(t: torch.Tensor) -> bool:
    """A 2-D matrix whose rows are adjacent in memory (e.g. x.t() of a contiguous x): its leading
    stride is the second one. A matrix with a unit last stride reads as row-major."""
    return t.stride(0) == 1 and t.stride(1) != 1


def tma_unaligned(*operands) -> int:
    """Operands the Hopper bulk-tensor copy (TMA) cannot read: it needs one unit stride, the other
    stride a multiple of 16 bytes and a 16-byte-aligned start. An operand that is neither row- nor
    column-major is copied by the dispatcher into 16-byte-aligned rows first, which TMA reads."""
    bad = 0
    for t in operands:
        if t.numel() == 0 or not fits_layout(t, "rows_or_cols"):
            continue
        other = t.stride(1 if is_column_major(t) else 0)
        bad += (other * t.element_size()) % 16 != 0 or address(t) % 16 != 0
    return bad


def tma_out_unaligned(a: torch.Tensor, b: torch.Tensor) -> int:
    """Output rows a TMA store cannot write: out is M x N, contiguous (N * size a multiple of 16
    bytes), and when a gradient will be taken, dA = dC @ B^T is M x K (so K too)."""
    rows = [b.shape[1]] + ([a.shape[1]] if a.requires_grad else [])
    return sum((n * a.element_size()) % 16 != 0 for n in rows if a.shape[0] and n)


SPLIT_K_MAX_TILES = 264  # two waves of 128 x 128 output tiles on the H100's 132 SMs


def output_tiles(a: torch.Tensor, b: torch.Tensor) -> int:
    """Output tiles of 128 x 128 (M x N). The split-K steps are meant for problems of at most two
    waves of such tiles on 132 SMs: past that every SM has whole tiles of its own, and splitting K
    only adds the partials' traffic."""
    return -(-a.shape[0] // 128) * -(-b.shape[1] // 128)


def m_rows(a: torch.Tensor, b: torch.Tensor) -> int:
    """Rows of A in every product the call runs: the small-M steps stream B once and keep up to
    8 rows. With a gradient for b, dB = A^T @ dC is a product of K rows."""
    return max(a.shape[0], a.shape[1] if b.requires_grad else 0)


def b_column_major(a: torch.Tensor, b: torch.Tensor) -> int:
    """1 when a product the call runs has a B whose elements run down its columns (b.t() of a
    row-major (N, K) weight; and, with a gradient for a, dA = dC @ B^T): a step that streams
    B's rows cannot read it without a copy as large as B."""
    return int((b.shape[1] > 1 and b.stride(1) != 1) or (a.requires_grad and b.shape[0] > 1))


def tma_readable(t: torch.Tensor) -> torch.Tensor:
    """t, or a copy in 16-byte-aligned rows where TMA could not read t: the gradient dC arrives
    M x N contiguous, which a column-major b with an odd N lets through the forward."""
    return layout_copy(t, "rows") if tma_unaligned(t) else t


def column_major(t: torch.Tensor) -> torch.Tensor:
    """t's values stored column by column: what t.t() of a row-major matrix is, e.g. a weight
    kept as (out, in) and multiplied as W.t()."""
    return t.t().contiguous().t()


INPUT_LAYOUTS = {
    "a.t()": lambda a, b: (column_major(a), b),
    "b.t()": lambda a, b: (a, column_major(b)),
    "a.t(), b.t()": lambda a, b: (column_major(a), column_major(b)),
}


def autograd_setup(ctx, inputs, output, params):
    ctx.save_for_backward(*inputs)


def autograd_grads(step_ops, ctx, grad):
    a, b = ctx.saved_tensors
    grad = tma_readable(grad.to(a.dtype))  # a and b passed the step's checks; dC did not
    da = step_ops.forward(grad, b.t()) if ctx.needs_input_grad[0] else None
    db = step_ops.forward(a.t(), grad) if ctx.needs_input_grad[1] else None
    return da, db


# (K, N) of real model layers, y = x @ W for a batch of M tokens.
LAYERS = (
    (768, 3072),  # GPT-2 small, MLP up
    (4096, 4096),  # Llama-3 8B, attention output
    (4096, 14336),  # Llama-3 8B, MLP up / gate
    (14336, 4096),  # Llama-3 8B, MLP down
    (3584, 18944),  # Qwen2.5 7B, MLP up / gate
    (8192, 28672),  # Llama-3 70B, MLP up / gate
)
TOKENS = (1, 4, 16, 64, 128, 256, 1024, 4096, 8192)  # one decode step ... a long prefill
ODD = (
    (7, 4096, 4096),  # a few tokens, not a power of two
    (100, 4096, 14336),
    (777, 1234, 2345),  # odd everywhere
    (1009, 997, 1013),  # primes: no tile and no 16-byte row divides them
    (300, 8192, 300),  # K-heavy: K >= 16 M and K >= 16 N, few output tiles
    (64, 16384, 64),
    (3000, 3000, 3000),
)
SUITE_MAX_FLOP = 1.2e12  # per case (~2 ms on cuBLAS): the suite fits one device call
SUITE = Suite(
    cases=tuple(
        [((m, k, n), torch.bfloat16) for m in TOKENS for k, n in LAYERS if 2 * m * k * n <= SUITE_MAX_FLOP]
        + [(s, torch.bfloat16) for s in ODD]
        + [((m, k, n), torch.float16) for m in (1, 16, 128, 1024) for k, n in LAYERS[1:3]]
        + [((m, 4096, 4096), torch.float32) for m in (1, 16, 128, 1024, 4096)]
        + [(s, torch.float32) for s in ODD[2:]]),
    rows=("M", lambda s, dtype: f"{dtype_label(dtype)} M={s[0]}"),
    cols=("K x N", lambda s, dtype: f"{s[1]}x{s[2]}"))

SPEC = OpSpec(
    name="matmul",
    position=4,
    forward=Direction(
        inputs=("a", "b"), outputs=("out",), make_inputs=make_inputs,
        allocate=lambda a, b: a.new_empty((a.shape[0], b.shape[1])),
        reference=lambda a, b: a.double() @ b.double(),
        error_scale=error_scale,
        # fp32: true fp32 (TF32 would miss by 1e-3); half types: the output's rounding, 2^-11 / 2^-8
        tolerance={torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3},
        minimal_bytes=lambda s, dtype: (s[0] * s[1] + s[1] * s[2] + s[0] * s[2]) * dtype.itemsize,
        flops=lambda s: 2 * s[0] * s[1] * s[2],
        torch_eager=lambda a, b, out: torch.mm(a, b, out=out),
        torch_expr=lambda a, b: a @ b,
    ),
    autograd=(autograd_setup, autograd_grads),
    check_shapes=check_shapes,
    kernel_view=lambda *ts: ts,
    layout="rows",
    metric="TFLOP/s",
    ceiling="fp32_fma",  # per dtype: fp32 steps against the FMA peak, half types against tensor cores
    headlines=(
        Headline((2048, 2048, 2048), FP32, "every step, the naive ones included"),
        Headline((4096, 4096, 4096), (*FP32, *HALF)),
        Headline((8192, 8192, 8192), (*FP32, *HALF)),
        Headline((3000, 3000, 3000), (*FP32, *HALF), "odd: no tile divides it"),
        Headline((4097, 4095, 4099), FP32, "odd: one past / short of every power of two"),
        Headline((5120, 1536, 3072), HALF, "an LLM projection"),
        # where the tile ladder loses (the shape suite): split-K's steps, CUDA step 8's small tiles
        Headline((16, 4096, 14336), (torch.bfloat16,), "decode: 16 tokens x a Llama-3 8B MLP weight, a stream of B"),
        Headline((1, 4096, 14336), (torch.bfloat16,), "decode: one token, a GEMV"),
        Headline((8, 4096, 4096), FP32, "eight rows in fp32: a GEMV on the CUDA cores"),
        Headline((300, 8192, 300), FP32, "K-heavy: 9 output tiles of 128 x 128"),
    ),
    sweep=tuple((n, n, n) for n in (256, 1024, 2048, 4096, 8192)),
    sweep_dtype=torch.float32,
    test_shapes=(
        (1, 1, 1),  # a single multiply-add
        (129, 257, 513),  # one past a power of two everywhere: a ragged last tile in M, K and N
        (17, 33, 65),  # every dimension prime-ish, none a tile multiple
        (1000, 1, 999),  # K = 1: one rank-1 update, tiles mostly empty along K
        (1, 64, 1),  # one dot product of length 64: the whole K loop for one output
        (64, 4096, 8),  # long K, thin N: N smaller than any tile
        (3, 5000, 7),  # long K, tiny M and N
        (1, 3000, 4096),  # one row: a GEMV, K split over blocks, 16-byte rows of B (CUDA step 14:
                          # narrow 64 x 64 tiles, no split, A's boxes one row tall)
        (7, 777, 1031),  # 7 rows (padded to 8), odd K and N: B's rows element by element
        (8, 4096, 520),  # 8 rows, a ragged last strip of columns, K split
        (5, 0, 6),  # K = 0: the result is zeros
        (0, 16, 8),  # M = 0: an empty result
        (300, 1000, 456),  # 16-bit rows in whole 16 bytes (K, N multiples of 8), yet no tile divides
                           # M, N or K: the TMA steps' zero-filled edge tiles and masked stores
        (2049, 64, 4097),  # CUDA step 8 on 132 SMs: 289 tiles = 2 waves + 25, so a data-parallel wave
                           # then stream-K pieces that cross tiles; N = 4097 also repacks b
        (1500, 200, 3000),  # CUDA step 13 on 132 SMs picks its 192 x 192 tile pair (64 pairs, one
                            # wave, where 128-row tiles need two): ragged in M, N and K
        (200, 520, 3104),  # CUDA step 14's narrow 128 x 64 tiles without a split (98 blocks, where
                           # 128 x 128 tiles would split K in two): ragged in M, K and N
        (5, 712, 3104),  # the same with 64 x 64 tiles at M < 64 (49 blocks; A's boxes 5 rows tall,
                         # the tile's other rows of shared memory never written): ragged in K and N
    ),
    cpu_shapes=(
        (1, 1, 1),  # a single multiply-add
        (17, 33, 65),  # no dimension a tile multiple
        (40, 1, 24),  # K = 1
        (3, 40, 20),  # three rows: the small-M steps, K split (three slices under the interpreter)
        (5, 0, 6),  # K = 0: zeros
        (0, 16, 8),  # M = 0
        (24, 16, 8),  # 16-bit rows in whole 16 bytes: what the TMA steps take (their one CPU check)
    ),
    slow_call_ms=150.0,
    problem=lambda a, b: (a.shape[0], a.shape[1], b.shape[1]),
    suite=SUITE,
    bounds={"tma_unaligned": tma_unaligned, "tma_out_unaligned": tma_out_unaligned, "output_tiles": output_tiles,
            "m_rows": m_rows, "b_column_major": b_column_major},
    input_layouts=INPUT_LAYOUTS,
    layout_headlines=(Headline((4096, 4096, 4096), HALF), Headline((8192, 8192, 8192), HALF)),
)
