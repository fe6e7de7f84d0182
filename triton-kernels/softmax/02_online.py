"""
Step 2 — online softmax: loop over the row in blocks, running max and rescaled sum
Changed:  the tile is no longer the row: program r walks row r in BLOCK-element blocks keeping a
          per-lane running max m and a sum d rescaled whenever m grows (d = d*exp(m_old - m_new)
          + exp(x - m_new)), folds the lanes into one (m, d) at the end, then walks the row again
          writing exp(x - m)/d. Backward: one loop for dot = sum(y*dy), a second for dx.
Why:      any row length now runs (step 1 stops at 32,768). The online recurrence fuses the max
          pass and the sum pass into one read, so the cost is 2 reads + 1 write forward (3·n
          bytes instead of 2·n: at most 2/3 of the copy ceiling, ~2,000 GB/s, unless the second
          read hits L2) and 4 reads + 1 write backward (5/3 the minimal 3·n). Per-lane (m, d)
          keeps the loop free of block-wide reductions and barriers.
Still:    every row is read twice (the data went through the SM and was dropped), and one
          program per row with a fixed BLOCK under-fills the machine on short rows. Step 3 keeps
          the row in registers when it fits and tunes the tile per row length.
Limits:   none (any row length; 64-bit offsets).
Layout:   rows
Mirrors:  CUDA step 4 (online softmax, one block per row)
"""
import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import next_power_of_2

MAX_BLOCK = 4096  # elements per loop step: 16 per thread at 8 warps
NUM_WARPS = 8


@triton.jit
def softmax_online_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    out_ptr,  # output, contiguous rows x cols
    cols,
    x_row_stride,
    BLOCK: tl.constexpr,  # elements per loop step
):
    row = tl.program_id(0).to(tl.int64)  # 64-bit: row * stride passes 2^31 on big inputs
    x_row = x_ptr + row * x_row_stride
    offs = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -float("inf"), tl.float32)  # lane j's running max over its elements
    d = tl.zeros([BLOCK], tl.float32)  # lane j's sum of exp(x - m)
    for start in range(0, cols, BLOCK):
        # other=-inf: a padding lane keeps m and adds nothing.
        x = tl.load(x_row + start + offs, mask=start + offs < cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # A lane that has seen only -inf (padding, or -inf inputs) has m_new = -inf, and
        # exp(-inf - -inf) would be NaN: shift by 0 instead, so it keeps d = 0 exactly.
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        d = d * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new
    # Fold the lanes: the row max, and each lane's sum rescaled to it (same -inf guard).
    m_row = tl.max(m, axis=0)
    shift = tl.where(m_row == -float("inf"), 0.0, m_row)
    # A row of all -inf keeps m_row = -inf: exp(x - m_row) = exp(NaN) below, NaN as in torch.
    # A +inf or NaN anywhere has made some lane's d NaN, and inv with it.
    inv = 1.0 / tl.sum(d * tl.exp(m - shift), axis=0)
    for start in range(0, cols, BLOCK):
        mask = start + offs < cols
        x = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.exp(x - m_row) * inv
        tl.store(out_ptr + row * cols + start + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_online_backward_kernel(
    y_ptr,  # forward output, rows x cols, unit column stride
    dy_ptr,  # gradient of the output, rows x cols, unit column stride
    dx_ptr,  # gradient of the input, contiguous rows x cols
    cols,
    y_row_stride,
    dy_row_stride,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * y_row_stride
    dy_row = dy_ptr + row * dy_row_stride
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)  # per-lane partial dots, folded once after the loop
    for start in range(0, cols, BLOCK):
        mask = start + offs < cols
        y = tl.load(y_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        acc += y * dy
    dot = tl.sum(acc, axis=0)
    for start in range(0, cols, BLOCK):
        mask = start + offs < cols
        y = tl.load(y_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + start + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + row * cols + start + offs, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


def block_for(cols):
    return min(MAX_BLOCK, next_power_of_2(cols))


def launch(x, out):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    wrap_triton(softmax_online_kernel)[(rows,)](x, out, cols, x.stride(0), BLOCK=block_for(cols),
                                                num_warps=NUM_WARPS)


def launch_backward(y, dy, dx):
    rows, cols = y.shape
    if rows == 0 or cols == 0:
        return
    wrap_triton(softmax_online_backward_kernel)[(rows,)](y, dy, dx, cols, y.stride(0), dy.stride(0),
                                                         BLOCK=block_for(cols), num_warps=NUM_WARPS)
