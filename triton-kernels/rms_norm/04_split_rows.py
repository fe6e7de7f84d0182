"""
Step 4 — long rows split across a group of programs that meet through L2
Changed:  a long row is cut into slices, and a group of consecutive programs shares each of its
          rows, program s holding slice s of every row the group does, in registers, for the
          whole launch. Per row each program posts its slice's partial sum (forward: of x^2;
          backward: of dy*w*x) as a 64-bit word, the fp32 bits with a "posted" flag above them
          (one relaxed atomic exchange, done at L2), polls its peers' words with volatile loads
          until all are posted, and adds them in slice order (norm_common.share). The next row's
          slices are loaded before the wait (the forward's two rows ahead), so the loads stay in
          flight through it. The backward's dweight sum for the program's columns stays in
          registers across the launch: one partial row per group. The grid then meets once (all its
          programs are resident: the split's register cap) and sums the partial rows itself, each
          program a strip of 32 columns, in a fixed order (norm_grid_sum.py): no
          second launch. The grid is a host table
          (norm_common.split_plan), not a tuner: rows up to 16 KB stay whole in one program (16
          values a thread and tensor, fp32 8, 16 warps an SM), longer ones split into slices of
          2,048 at 4 warps, 4 programs an SM.
Why:      step 3 streams a row of 32,768 columns in chunks, twice: pass 2 reads each chunk again
          from L2 and read-modify-writes its fp32 partial row there, ~18 bytes of L2 traffic an
          element against 6 from DRAM: 1,150 GB/s backward (bf16, 4,096 x 32,768), where CUDA
          step 3, its row across a cluster's registers, reached 2,768. A row split over programs
          is read once, and the program's registers hold 16 values a tensor at any row length.
          The flag rides in the value's own word because a counter bumped after the values needs
          a release, and the SASS of that version had a MEMBAR.ALL.GPU, which waits for every
          load the thread has in flight: the next row's prefetch, on every row. Slices measured
          on H100 (bf16, backward GB/s at 4,096 x 32,768 / 16,384 x 8,192): 2,048 at 4 programs
          an SM 2,717 / 2,796; 4,096 at 2: 2,636 / 2,806; 8,192 at 1: 2,499 / 2,945 (8,192 is one
          slice there: no wait). Predicted: 4,096 x 32,768 backward ~2,600 GB/s (the CUDA cluster's
          figure less one L2 round trip a row, hidden behind the next row's loads), forward ~2,900.
Still:    a program waits for its slowest peer on every row, an L2 round trip where a cluster's
          exchange is a DSMEM one. The forward gains nothing: step 3 already holds a 64 KB row in
          one program's registers, so the split only adds the wait. Under TRITON_INTERPRET=1
          programs run one after another and cannot wait: the slice is the whole row and the host
          launches step 3's sum. The posted words take a memset a call where a row is split; a
          whole row (one slice) skips it: forward 4096^2 2,592 -> 2,749 GB/s, backward 2,604 ->
          2,661 (bf16; runs 8d5086c82d25, 3113cf739b37). The grid's own sum in place of step 3's
          sum launch: backward 4096^2 2,670 -> 2,700 GB/s, fp32 2,898 -> 2,911, the large shapes
          unchanged (runs aeb7dde80dae, 1b5644dd6c75): a development probe had put the launch at
          ~3 us of ~40, but the meeting and the strips' L2 reads cost most of that back. Whole
          rows at 1 program an SM (8 values a thread, half the partial bytes) measured slower in
          a development probe (4096^2 backward 41.2 -> 45.1 us).
Limits:   rows of 4,096 columns and more (shorter rows are step 3's); at most 65,536 (32 slices).
          Every program of the grid must be resident at once (registers capped for it, maxnreg):
          other work holding SMs (another stream, MPS, a green context) makes the groups wait
          for it, and hangs them if it never ends. ptxas -v, sm_90a: no spills, 56-128 registers
          a thread. Workspace: 16 bytes a slice a row, and groups x cols fp32 (backward), and two
          counters the kernel leaves at zero (triton_launch.tickets).
Layout:   rows
Min:      cols >= 4096
Max:      cols <= 65536
Mirrors:  CUDA step 3 (a long row across a cluster's CTAs, the sums through DSMEM), with L2 and
          posted words in place of DSMEM and the cluster barrier
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import next_power_of_2
from rosetta.triton_kernels.norm_common import empty_partials, share, split_kernel, split_plan, split_workspace, \
    sum_counted_partials
from rosetta.triton_kernels.norm_grid_sum import GRID_SUM, grid_sum_partials, grid_sum_tile
from rosetta.triton_launch import tickets  # counters the kernel leaves at zero: one buffer per stream


@triton.jit
def rms_norm_forward_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    y_ptr,  # output, contiguous rows x cols
    rstd_ptr,  # fp32 (rows,), saved for the backward
    part_ptr,  # int64 [2, rows, slices], zeroed: posted words (norm_common.share), each slice's partial sum of x^2
    rows,
    cols,
    x_row_stride,
    eps,
    slices,  # programs a row (a group)
    SLICE: tl.constexpr,  # columns a program
    SLICES_P2: tl.constexpr,  # next_power_of_2(slices)
):
    pid = tl.program_id(0)
    s = pid % slices
    groups = tl.num_programs(0) // slices
    c = s * SLICE + tl.arange(0, SLICE)
    c_mask = c < cols
    w = tl.load(w_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
    first = (pid // slices).to(tl.int64)  # 64-bit: row * stride passes 2^31 on big inputs
    # Two rows ahead, kept packed: the loads in flight through a row's wait are all that keeps
    # DRAM busy while a program waits, and the forward has the registers for two rows of them.
    x = tl.load(x_ptr + first * x_row_stride + c, mask=c_mask, other=0.0)
    x_next = tl.load(x_ptr + (first + groups) * x_row_stride + c, mask=c_mask & (first + groups < rows), other=0.0)
    for row in range(first, rows, groups):
        ahead = row + 2 * groups
        x_ahead = tl.load(x_ptr + ahead * x_row_stride + c, mask=c_mask & (ahead < rows), other=0.0)
        xf = x.to(tl.float32)
        ss = tl.sum(xf * xf, axis=0)  # padding: 0
        if slices > 1:
            parts, _ = share(part_ptr, row, rows, s, slices, ss, 0.0, SLICES_P2, False)
            ss = tl.sum(parts, axis=0)
        rstd = tl.rsqrt(ss / cols + eps)
        tl.store(y_ptr + row * cols + c, (xf * rstd * w).to(y_ptr.dtype.element_ty), mask=c_mask)
        if s == 0:
            tl.store(rstd_ptr + row, rstd)
        x = x_next
        x_next = x_ahead


@triton.jit
def rms_norm_backward_kernel(
    x_ptr,  # forward input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    rstd_ptr,  # fp32 (rows,), from the forward
    dy_ptr,  # gradient of y, rows x cols, unit column stride
    dx_ptr,  # gradient of x, contiguous rows x cols
    partial_ptr,  # fp32 (1, groups, cols): row g is group g's sum of dy*x*rstd
    part_ptr,  # int64 [2, rows, slices], zeroed: posted words (norm_common.share), each slice's partial dot
    count_ptr,  # int32 (1,): partial rows written (program 0 stores groups), for step 3's sum
    dweight_ptr,  # (cols,): the partials' sum, stored by the grid (GRID_SUM)
    sync_ptr,  # int32 (2,) at zero, left at zero: the grid's meeting (GRID_SUM)
    rows,
    cols,
    x_row_stride,
    dy_row_stride,
    slices,
    SLICE: tl.constexpr,
    SLICES_P2: tl.constexpr,
    GRID_SUM: tl.constexpr,  # the partials summed here (a GPU); else by sum_counted_partials
    BLOCK_G: tl.constexpr,  # grid_sum_tile: partial rows and columns a strip of the sum
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    s = pid % slices
    group = pid // slices
    groups = tl.num_programs(0) // slices
    if pid == 0:
        tl.store(count_ptr, groups)
    c = s * SLICE + tl.arange(0, SLICE)
    c_mask = c < cols
    w = tl.load(w_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
    acc = tl.zeros([SLICE], tl.float32)  # dweight's sum over the group's rows, these columns
    first = group.to(tl.int64)
    x = tl.load(x_ptr + first * x_row_stride + c, mask=c_mask, other=0.0)
    dy = tl.load(dy_ptr + first * dy_row_stride + c, mask=c_mask, other=0.0)
    rstd = tl.load(rstd_ptr + first)
    for row in range(first, rows, groups):
        # the next row's slices and rstd, in flight through this row's wait (rstd loaded when
        # needed would put a memory round trip on every row's critical path)
        nxt = row + groups
        n_mask = c_mask & (nxt < rows)
        x_next = tl.load(x_ptr + nxt * x_row_stride + c, mask=n_mask, other=0.0)
        dy_next = tl.load(dy_ptr + nxt * dy_row_stride + c, mask=n_mask, other=0.0)
        rstd_next = tl.load(rstd_ptr + nxt, mask=nxt < rows, other=0.0)
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        g = dyf * w
        dot = tl.sum(g * xf, axis=0)
        if slices > 1:
            parts, _ = share(part_ptr, row, rows, s, slices, dot, 0.0, SLICES_P2, False)
            dot = tl.sum(parts, axis=0)
        dx = rstd * (g - xf * (rstd * rstd * dot / cols))
        tl.store(dx_ptr + row * cols + c, dx.to(dx_ptr.dtype.element_ty), mask=c_mask)
        acc += dyf * xf * rstd
        x = x_next
        dy = dy_next
        rstd = rstd_next
    tl.store(partial_ptr + group.to(tl.int64) * cols + c, acc, mask=c_mask)
    if GRID_SUM:
        grid_sum_partials(partial_ptr, sync_ptr, groups, cols, dweight_ptr, None, 1, BLOCK_G, BLOCK_C)


def launch(x, weight, y, rstd, eps):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    width, warps, per_sm, slices, groups = split_plan(x.device, int(rows), int(cols), x.element_size())
    part = split_workspace(rows, slices, x.device)
    wrap_triton(split_kernel(rms_norm_forward_kernel, warps, per_sm))[(groups * slices,)](
        x, weight, y, rstd, part, rows, cols, x.stride(0), eps, slices, SLICE=width,
        SLICES_P2=next_power_of_2(slices))


def launch_backward(x, weight, rstd, dy, dx, dweight):
    rows, cols = x.shape
    if cols == 0:
        return
    if rows == 0:
        dweight.zero_()  # a sum over no rows
        return
    width, warps, per_sm, slices, groups = split_plan(x.device, int(rows), int(cols), x.element_size())
    part = split_workspace(rows, slices, x.device)
    count = torch.empty(1, dtype=torch.int32, device=x.device)
    partial = empty_partials(1, groups, cols, x.device)
    block_g, block_c = grid_sum_tile(groups, cols)
    wrap_triton(split_kernel(rms_norm_backward_kernel, warps, per_sm))[(groups * slices,)](
        x, weight, rstd, dy, dx, partial, part, count, dweight, tickets(x, 2), rows, cols, x.stride(0), dy.stride(0),
        slices, SLICE=width, SLICES_P2=next_power_of_2(slices), GRID_SUM=GRID_SUM, BLOCK_G=block_g, BLOCK_C=block_c)
    if not GRID_SUM:
        sum_counted_partials(partial, count, dweight)
