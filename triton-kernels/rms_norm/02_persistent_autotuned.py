"""
Step 2 — persistent programs, tiles of several rows, tuned per row length
Changed:  the tile is ROWS rows x BLOCK = next_power_of_2(cols), and programs are persistent:
          forward, a machine-sized grid (SMs x the programs one SM holds) walks the tiles in
          strides of the grid; backward, G = min(rows, 2 x SMs) programs do the same, each
          summing its tiles' dy*x*rstd into one fp32 register row (tl.sum over the tile's rows)
          and storing it as its partial, summed in a fixed order as in step 1. ROWS and
          num_warps are autotuned per row length and power-of-two class of row count (key: cols,
          rows.bit_length()) among tiles of 2,048-16,384 elements at 8-16 elements per thread;
          one autotuner per BLOCK, so every config it times is valid for the rows it sees.
Why:      short rows: a 1,024-element row is too little for one program; tiles of >= 2,048
          elements give every thread >= 8 loads in flight, and the persistent loop pays program
          start-up and the weight load once per program instead of once per row. Backward, the
          partials shrink to 2 x SMs rows (4,096 x 4,096 bf16: 4.3 MB, half of step 1's) while
          each program still keeps a tile's loads in flight. Bytes stay minimal (2·n forward,
          3·n backward plus the partials), so the prediction is the copy ceiling's
          neighbourhood: ~2,900-3,000 GB/s forward and ~2,700 backward on bf16 4,096 x 4,096
          to 16,384 x 8,192, and a gain over step 1 that grows as rows get shorter.
Still:    a program loads a tile, then reduces, then stores: its next tile's loads wait for
          that, so latency is hidden only by the other programs on the SM. Rows past 65,536 do
          not fit one tile.
Limits:   cols <= 65536, as step 1. ptxas -v, sm_90a, bf16: configs are capped at 16 values
          per thread and tensor (32 spilled ~500 B backward at 4,096 x 4 rows); past 16,384 only
          32 warps remain, and the backward spills ~100-150 B at 16,384, ~2 KB at 65,536. The
          first call for each (cols, row class, dtype) runs the autotuner.
Max:      cols <= 65536
Layout:   rows
Mirrors:  CUDA step 2 (row in registers, per-block dweight partials + second pass), with
          several rows per program
"""
import functools

import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import cdiv, next_power_of_2, sm_count
from rosetta.triton_kernels.norm_common import check_cols, configs_for, empty_partials, programs, sum_partials

BACKWARD_PROGRAMS_PER_SM = 2  # G = 2 x SMs: one dweight partial row per program


@triton.jit
def rms_norm_tile_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    y_ptr,  # output, contiguous rows x cols
    rstd_ptr,  # fp32 (rows,), saved for the backward
    rows,
    cols,  # the autotune key, with row_class
    row_class,  # rows.bit_length(), unused here: a config tuned on 8 rows does not serve 8,192
    x_row_stride,  # elements between rows of x
    eps,
    BLOCK: tl.constexpr,  # next_power_of_2(cols): a whole row per tile row
    ROWS: tl.constexpr,  # rows per tile (autotuned)
    WARPS: tl.constexpr,  # num_warps, read by the grid function
):
    r_offs = tl.arange(0, ROWS)
    c_offs = tl.arange(0, BLOCK)
    c_mask = c_offs < cols
    w = tl.load(w_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)  # once per program
    # A 64-bit loop counter: r * stride passes 2^31 on big inputs.
    for tile in range(tl.program_id(0).to(tl.int64), tl.cdiv(rows, ROWS), tl.num_programs(0)):
        r = tile * ROWS + r_offs
        r_mask = r < rows
        mask = r_mask[:, None] & c_mask[None, :]
        # other=0: padding columns add nothing to the sum of squares; padding rows (past the
        # last row) get rstd = 1/sqrt(eps) and are never stored. A NaN makes its row NaN.
        x = tl.load(x_ptr + r[:, None] * x_row_stride + c_offs[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / cols + eps)
        tl.store(rstd_ptr + r, rstd, mask=r_mask)
        y = x * rstd[:, None] * w[None, :]
        tl.store(y_ptr + r[:, None] * cols + c_offs[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_tile_backward_kernel(
    x_ptr,  # forward input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    rstd_ptr,  # fp32 (rows,), from the forward
    dy_ptr,  # gradient of y, rows x cols, unit column stride
    dx_ptr,  # gradient of x, contiguous rows x cols
    partial_ptr,  # fp32 (1, programs, cols): this program's sum of dy*x*rstd
    rows,
    cols,  # the autotune key, with row_class
    row_class,  # rows.bit_length(), unused here: a config tuned on 8 rows does not serve 8,192
    x_row_stride,
    dy_row_stride,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    WARPS: tl.constexpr,
):
    pid = tl.program_id(0)
    r_offs = tl.arange(0, ROWS)
    c_offs = tl.arange(0, BLOCK)
    c_mask = c_offs < cols
    w = tl.load(w_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], tl.float32)  # this program's dweight partial
    # Tiles pid, pid + G, ...: which rows a program sums, and in what order, is fixed by the
    # shape and the config, never by timing. A program with no tile stores a zero partial.
    for tile in range(pid.to(tl.int64), tl.cdiv(rows, ROWS), tl.num_programs(0)):
        r = tile * ROWS + r_offs
        r_mask = r < rows
        mask = r_mask[:, None] & c_mask[None, :]
        # other=0 (and rstd 0 on padding rows): padding adds nothing to the dots or to dw.
        x = tl.load(x_ptr + r[:, None] * x_row_stride + c_offs[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c_offs[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + r, mask=r_mask, other=0.0)[:, None]
        g = dy * w[None, :]
        c = tl.sum(g * x, axis=1)[:, None] / cols
        dx = rstd * (g - x * (rstd * rstd * c))
        tl.store(dx_ptr + r[:, None] * cols + c_offs[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * x * rstd, axis=0)
    tl.store(partial_ptr + pid.to(tl.int64) * cols + c_offs, dw, mask=c_mask)


# One autotuner per BLOCK: its configs are the tiles that hold such a row (no pruner: torch's
# wrap_triton would rebuild an autotuner with one on every call). Built on first use.
@functools.cache
def forward_kernel(block):
    return triton.autotune(configs=configs_for(block), key=["cols", "row_class"])(rms_norm_tile_kernel)


@functools.cache
def backward_kernel(block):
    return triton.autotune(configs=configs_for(block), key=["cols", "row_class"])(rms_norm_tile_backward_kernel)


def launch(x, weight, y, rstd, eps):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    check_cols(cols, "rms_norm step 2")
    block = next_power_of_2(int(cols))  # int: a traced (symbolic) cols keys the cache too

    def grid(meta):
        # Registers per thread: x and w, ROWS x BLOCK / threads values each.
        per_thread = 2 * meta["ROWS"] * block // (32 * meta["WARPS"])
        return (programs(x.device, cdiv(rows, meta["ROWS"]), meta["WARPS"], per_thread),)

    row_class = int(rows).bit_length()  # with cols, the autotuners' key
    wrap_triton(forward_kernel(block))[grid](x, weight, y, rstd, rows, cols, row_class, x.stride(0), eps, BLOCK=block)


def launch_backward(x, weight, rstd, dy, dx, dweight):
    rows, cols = x.shape
    if cols == 0:
        return
    if rows == 0:
        dweight.zero_()  # a sum over no rows
        return
    check_cols(cols, "rms_norm step 2")
    block = next_power_of_2(int(cols))  # int: a traced (symbolic) cols keys the cache too
    # Fixed before the autotuner picks ROWS: the partials are allocated for this grid.
    groups = min(rows, BACKWARD_PROGRAMS_PER_SM * sm_count(x.device))
    partial = empty_partials(1, groups, cols, x.device)
    row_class = int(rows).bit_length()  # with cols, the autotuners' key
    wrap_triton(backward_kernel(block))[(groups,)](x, weight, rstd, dy, dx, partial, rows, cols, row_class, x.stride(0),
                                                    dy.stride(0), BLOCK=block)
    sum_partials(partial, dweight)
