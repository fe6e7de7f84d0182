"""
Step 1 — fused row: one program per row, the whole row in registers
Changed:  the starting point (the Triton layer-norm tutorial's shape): program r loads row r once
          into a BLOCK = next_power_of_2(cols) register tile, takes rstd = 1/sqrt(mean(x^2) + eps)
          in fp32, stores rstd and y = x * rstd * w. Backward: G = min(rows, 4 x SMs) programs,
          each walking a contiguous chunk of rows one row at a time: dx from the row in
          registers (g = dy*w, dx = rstd*(g - x*rstd^2*mean(g*x))), and dy*x*rstd added to an
          fp32 register row; each program stores that row as its partial, and a second kernel
          (norm_common.sum_partials) adds the G partials in a fixed order into dweight.
Why:      the row never leaves the chip, so x is read once: 1 read + 1 write forward (2·n·bytes,
          plus the weight, an L2 hit after the first rows), 2 reads + 1 write backward (3·n·bytes)
          plus G x cols fp32 partials written and read back (4,096 x 4,096 bf16 on 132 SMs: 8.6
          MB against 100 MB; most of it stays in L2). Forward, 4,096 x 4,096 bf16 and up, the
          prediction is near the copy ceiling, ~2,700-2,900 GB/s. The partials make dweight
          deterministic (same bits every run): no atomics, a fixed summation order.
Still:    one row per program forward: a 1,024-element row gives 4 warps 8 elements per thread,
          too little to hide DRAM latency; backward, each program handles its rows one after
          another with no other load in flight while it reduces, and 4 programs per SM at 8+
          warps may not be resident together: expect ~2,000-2,400 GB/s backward. Step 2 tiles
          several rows per program, persistent, tuned per row length.
Limits:   cols <= 65536: the tile is the whole row (32 warps, 64 values per thread and tensor
          at 65,536). ptxas -v, sm_90a, bf16: the forward is spill-free through 16,384; the
          backward (x, dy, w and the partial rows live) spills from 16,384 (~260-350 B) to
          ~1.8-2.1 KB at 65,536: long rows are correct, not fast.
Max:      cols <= 65536
Layout:   rows
Mirrors:  CUDA step 2 (row in registers, per-block dweight partials + second pass); the
          column kernel of CUDA step 1 becomes the fixed-order partial sum
"""
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import cdiv, next_power_of_2, sm_count
from rosetta.triton_kernels.norm_common import check_cols, empty_partials, sum_partials, warps_for

PROGRAMS_PER_SM = 4  # backward: G = 4 x SMs programs, one dweight partial row each


@triton.jit
def rms_norm_row_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    y_ptr,  # output, contiguous rows x cols
    rstd_ptr,  # fp32 (rows,): 1/sqrt(mean(x^2) + eps), saved for the backward
    cols,
    x_row_stride,  # elements between rows of x (>= cols: x may be a slice of a wider tensor)
    eps,
    BLOCK: tl.constexpr,  # next_power_of_2(cols): the whole row in one tile
):
    row = tl.program_id(0).to(tl.int64)  # 64-bit: row * stride passes 2^31 on big inputs
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    # other=0: padding lanes add nothing to the sum of squares. A NaN in x makes the sum, rstd
    # and so the whole row NaN, as torch does.
    x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / cols + eps)  # once per row; ~2 ulp, far below bf16's
    tl.store(rstd_ptr + row, rstd)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # the same cols for every row: L2
    tl.store(y_ptr + row * cols + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_row_backward_kernel(
    x_ptr,  # forward input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    rstd_ptr,  # fp32 (rows,), from the forward
    dy_ptr,  # gradient of y, rows x cols, unit column stride
    dx_ptr,  # gradient of x, contiguous rows x cols
    partial_ptr,  # fp32 (1, programs, cols): this program's sum of dy*x*rstd over its rows
    rows,
    cols,
    x_row_stride,
    dy_row_stride,
    rows_per_program,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # once per program, not per row
    dw = tl.zeros([BLOCK], tl.float32)  # this program's dweight partial, fp32 whatever the dtype
    start = pid * rows_per_program  # a contiguous chunk of rows: a fixed order within the partial
    for row in range(start, tl.minimum(start + rows_per_program, rows)):
        # other=0: padding lanes have g = 0 and x = 0, so they add nothing to the dot or to dw.
        x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * dy_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        g = dy * w
        # d(x*rstd)/dx: rstd*g minus the part of g along x, scaled by d(rstd)/dx = -x*rstd^3/cols.
        c = tl.sum(g * x, axis=0) / cols
        tl.store(dx_ptr + row * cols + offs, (rstd * (g - x * (rstd * rstd * c))).to(dx_ptr.dtype.element_ty),
                 mask=mask)
        dw += dy * x * rstd
    tl.store(partial_ptr + pid * cols + offs, dw, mask=mask)


def launch(x, weight, y, rstd, eps):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    check_cols(cols, "rms_norm step 1")
    block = next_power_of_2(cols)
    wrap_triton(rms_norm_row_kernel)[(rows,)](x, weight, y, rstd, cols, x.stride(0), eps, BLOCK=block,
                                              num_warps=warps_for(block))


def launch_backward(x, weight, rstd, dy, dx, dweight):
    rows, cols = x.shape
    if cols == 0:
        return
    if rows == 0:
        dweight.zero_()  # a sum over no rows
        return
    check_cols(cols, "rms_norm step 1")
    block = next_power_of_2(cols)
    groups = min(rows, PROGRAMS_PER_SM * sm_count(x.device))
    rows_per_program = cdiv(rows, groups)
    groups = cdiv(rows, rows_per_program)  # no program left without rows
    partial = empty_partials(1, groups, cols, x.device)
    wrap_triton(rms_norm_row_backward_kernel)[(groups,)](x, weight, rstd, dy, dx, partial, rows, cols,
                                                         x.stride(0), dy.stride(0), rows_per_program,
                                                         BLOCK=block, num_warps=warps_for(block))
    sum_partials(partial, dweight)
