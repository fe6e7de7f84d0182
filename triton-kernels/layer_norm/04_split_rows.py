"""
Step 4 — long rows split across a group of programs that meet through L2
Changed:  rms_norm step 4's split: a long row cut into slices, program s of a group of
          consecutive programs holding slice s of every row the group does, in registers, for
          the whole launch; per row the group exchanges partial sums through L2 as posted 64-bit
          words (post, poll, add in slice order), the next row's slices (and, backward, its mean
          and rstd) in flight through the wait. A slice's two sums travel as one word
          (share_pair: one's bits high, the other's low with their last bit set, so a posted
          word is never the zero of an unposted one), where rms_norm's one sum takes a word with
          a flag half (norm_common.share); two words a slice, as first built, cost each row's
          wait a second atomic and poll (KERNEL_LOG: 2,261 -> 2,516 GB/s backward at 4,096 x
          32,768). Forward: each slice posts its
          mean and its sum of squared deviations from that mean, and every program merges them
          exactly (Chan: M2 = sum of M2_s + n_s (mean_s - mean)^2), so the variance never forms
          E[x^2] - E[x]^2. Backward: the slices' sums of g = dy*w and of g*xhat; dweight's and
          dbias's sums for the program's columns stay in registers across the launch, one
          partial row each a group. The grid then meets once (all its programs are resident) and
          sums the partial rows itself, a strip of 32 columns of one sum a program, in a fixed
          order (norm_grid_sum.py): no second launch. The weight's
          slice is reloaded each row (from L1): held, it was 16 registers a thread too many.
Why:      step 3 streams a long row in chunks, reading each chunk again from L2 and
          read-modify-writing two fp32 partial rows there for every row: 699 GB/s backward at
          4,096 x 32,768 (bf16) where CUDA step 3, its row across a cluster, reached 2,197, and
          below torch's own 1,149. Here x and dy are read once. The first version loaded a row's
          mean and rstd when it needed them: a memory round trip on every row's critical path
          (2,084 GB/s at 4,096 x 32,768, against 2,231 with them prefetched). Predicted: 4,096 x
          32,768 backward ~2,400 GB/s (twice RMSNorm's posted words and one more register sum: a
          little below rms_norm step 4), forward ~2,850; rows of 4,096-8,192 about step 3.
Still:    a program waits for its slowest peer on every row, an L2 round trip where a cluster's
          exchange is a DSMEM one; the backward's tile fills the 128 registers the grid allows
          (ptxas spills 24 bytes at 2,048-column slices, 8 before the grid sum: loop-invariant
          words). The forward gains nothing over step 3, whose program holds the whole row.
          Under TRITON_INTERPRET=1 programs run one after another and cannot wait: the slice is
          the whole row and the host launches step 3's sum. The posted words take a memset a
          call where a row is split; a whole row (one slice) skips it. That and one sum launch in
          place of two: bf16 4096^2 backward 2,286 -> 2,439 GB/s, forward 2,473 -> 2,617 (runs
          8d5086c82d25, 3113cf739b37). The grid's own sum in place of that launch: backward
          4096^2 2,452 -> 2,477 GB/s, 4,096 x 32,768 2,251 -> 2,272, 16,384 x 8,192 2,911 ->
          2,880 (runs aeb7dde80dae, 1b5644dd6c75): the meeting costs about what the launch did.
          Whole rows at 1 program an SM (8 values a thread, half the partial bytes) measured
          slower in a development probe (4096^2 backward 44.1 -> 48.9 us). Not kept: a grid-sum
          task for both sums of a strip (one round of 128 at 4,096 columns, not two of 256; no
          faster within this step's ~5% from process to process, run a6434ea31418) and one
          tl.reduce over the row's two sums (slower: ablation_norm_triton_pair_reduce.txt).
Limits:   rows of 4,096 columns and more (shorter rows are step 3's); at most 65,536. Every
          program of the grid must be resident at once (registers capped for it): other work
          holding SMs (another stream, MPS) makes the groups wait for it, and hangs them if it
          never ends. Workspace: 8 bytes a slice a row (the first half of norm_common's 16-byte plan), 2 x groups x cols fp32 (backward), and two
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
from rosetta.triton_kernels.norm_common import empty_partials, split_kernel, split_plan, split_workspace, \
    sum_counted_partials
from rosetta.triton_kernels.norm_grid_sum import GRID_SUM, grid_sum_partials, grid_sum_tile
from rosetta.triton_launch import tickets  # counters the kernel leaves at zero: one buffer per stream


@triton.jit
def _pair_word(a, b):
    """Two fp32 partials as one 64-bit word a peer can poll: a's bits high, b's low with their
    last bit set, so the word is never 0 (a zeroed word: not posted). rms_norm's one value takes
    a word with a flag half (norm_common.share); a second word a row here was a second atomic and
    a second poll on every row's wait. Setting b's last bit moves b by at most one unit in its
    last place (2^-23 relative), the same on every run."""
    high = a.to(tl.int32, bitcast=True).to(tl.int64) << 32
    low = (b.to(tl.int32, bitcast=True) | 1).to(tl.int64) & 0xFFFFFFFF
    return high | low


@triton.jit
def share_pair(part_ptr, row, s, slices, a, b, SLICES_P2: tl.constexpr):
    """Posts this program's partials (a, b) of `row`'s slice s as one word, spins until every
    slice of the row has posted, and returns all of them in slice order, [SLICES_P2] each (0
    past `slices`). part_ptr: int64 [rows, slices], zeroed before the launch. The rest as
    norm_common.share: the atomic performs at L2, volatile polls read L2."""
    words = part_ptr + row * slices
    tl.atomic_xchg(words + s, _pair_word(a, b), sem="relaxed")
    k = tl.arange(0, SLICES_P2)
    w = tl.load(words + k, mask=k < slices, other=-1, volatile=True)  # past `slices`: posted
    while tl.min((w != 0).to(tl.int32), axis=0) == 0:
        w = tl.load(words + k, mask=k < slices, other=-1, volatile=True)
    w = tl.where(k < slices, w, 0)
    return ((w >> 32).to(tl.int32).to(tl.float32, bitcast=True),
            w.to(tl.int32).to(tl.float32, bitcast=True))


@triton.jit
def layer_norm_forward_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    b_ptr,  # bias, (cols,)
    y_ptr,  # output, contiguous rows x cols
    mean_ptr,  # fp32 (rows,), saved for the backward
    rstd_ptr,  # fp32 (rows,), saved for the backward
    part_ptr,  # int64 [rows, slices], zeroed: posted words (share_pair), each slice's mean and its sum of squared deviations
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
    n = tl.minimum(cols - s * SLICE, SLICE).to(tl.float32)  # this slice's columns
    k = tl.arange(0, SLICES_P2)
    n_k = tl.minimum(tl.maximum(cols - k * SLICE, 0), SLICE).to(tl.float32)  # each slice's (0 past the last)
    w = tl.load(w_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
    first = (pid // slices).to(tl.int64)  # 64-bit: row * stride passes 2^31 on big inputs
    # Two rows ahead, kept packed: the loads in flight through a row's wait are all that keeps
    # DRAM busy while a program waits, and the forward has the registers for two rows of them.
    x = tl.load(x_ptr + first * x_row_stride + c, mask=c_mask, other=0.0)
    x_next = tl.load(x_ptr + (first + groups) * x_row_stride + c, mask=c_mask & (first + groups < rows), other=0.0)
    for row in range(first, rows, groups):
        ahead = row + 2 * groups
        x_ahead = tl.load(x_ptr + ahead * x_row_stride + c, mask=c_mask & (ahead < rows), other=0.0)
        xf = x.to(tl.float32)
        mean = tl.sum(xf, axis=0) / n
        xc = tl.where(c_mask, xf - mean, 0.0)  # padding: 0, not -mean
        m2 = tl.sum(xc * xc, axis=0)
        if slices > 1:
            means, m2s = share_pair(part_ptr, row, s, slices, mean, m2, SLICES_P2)
            mean_s = mean
            mean = tl.sum(n_k * means, axis=0) / cols
            dm = means - mean
            m2 = tl.sum(m2s + n_k * dm * dm, axis=0)  # Chan's merge, in slice order
            xc = tl.where(c_mask, xc + (mean_s - mean), 0.0)  # x - the row's mean
        rstd = tl.rsqrt(m2 / cols + eps)
        tl.store(y_ptr + row * cols + c, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=c_mask)
        if s == 0:
            tl.store(mean_ptr + row, mean)
            tl.store(rstd_ptr + row, rstd)
        x = x_next
        x_next = x_ahead


@triton.jit
def layer_norm_backward_kernel(
    x_ptr,  # forward input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    mean_ptr,  # fp32 (rows,), from the forward
    rstd_ptr,  # fp32 (rows,), from the forward
    dy_ptr,  # gradient of y, rows x cols, unit column stride
    dx_ptr,  # gradient of x, contiguous rows x cols
    partial_ptr,  # fp32 (2, groups, cols): group g's sums of dy*xhat (dweight), then of dy (dbias)
    part_ptr,  # int64 [rows, slices], zeroed: posted words (share_pair), each slice's sum of g and of g*xhat
    count_ptr,  # int32 (1,): partial rows written (program 0 stores groups), for step 3's sum
    dweight_ptr,  # (cols,): the partials' sums, stored by the grid (GRID_SUM)
    dbias_ptr,  # (cols,)
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
    dw = tl.zeros([SLICE], tl.float32)  # sums over the group's rows, these columns
    db = tl.zeros([SLICE], tl.float32)
    first = group.to(tl.int64)
    x = tl.load(x_ptr + first * x_row_stride + c, mask=c_mask, other=0.0)
    dy = tl.load(dy_ptr + first * dy_row_stride + c, mask=c_mask, other=0.0)
    mean = tl.load(mean_ptr + first)
    rstd = tl.load(rstd_ptr + first)
    for row in range(first, rows, groups):
        # the next row's slices and statistics, in flight through this row's wait (a statistic
        # loaded when needed would put a memory round trip on every row's critical path)
        nxt = row + groups
        n_mask = c_mask & (nxt < rows)
        x_next = tl.load(x_ptr + nxt * x_row_stride + c, mask=n_mask, other=0.0)
        dy_next = tl.load(dy_ptr + nxt * dy_row_stride + c, mask=n_mask, other=0.0)
        mean_next = tl.load(mean_ptr + nxt, mask=nxt < rows, other=0.0)
        rstd_next = tl.load(rstd_ptr + nxt, mask=nxt < rows, other=0.0)
        xhat = tl.where(c_mask, (x.to(tl.float32) - mean) * rstd, 0.0)  # padding: 0 (x - mean is not)
        dyf = dy.to(tl.float32)
        # the weight's slice again each row, from L1: held across the loop it was 16 more
        # registers a thread, and ptxas spilled at the 128 the grid allows
        g = dyf * tl.load(w_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
        sum_g = tl.sum(g, axis=0)
        sum_gx = tl.sum(g * xhat, axis=0)
        if slices > 1:
            gs, gxs = share_pair(part_ptr, row, s, slices, sum_g, sum_gx, SLICES_P2)
            sum_g = tl.sum(gs, axis=0)
            sum_gx = tl.sum(gxs, axis=0)
        dx = rstd * (g - (sum_g + xhat * sum_gx) / cols)
        tl.store(dx_ptr + row * cols + c, dx.to(dx_ptr.dtype.element_ty), mask=c_mask)
        dw += dyf * xhat
        db += dyf
        x = x_next
        dy = dy_next
        mean = mean_next
        rstd = rstd_next
    p = partial_ptr + group.to(tl.int64) * cols + c
    tl.store(p, dw, mask=c_mask)
    tl.store(p + groups.to(tl.int64) * cols, db, mask=c_mask)
    if GRID_SUM:
        grid_sum_partials(partial_ptr, sync_ptr, groups, cols, dweight_ptr, dbias_ptr, 2, BLOCK_G, BLOCK_C)


def launch(x, weight, bias, y, mean, rstd, eps):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    width, warps, per_sm, slices, groups = split_plan(x.device, int(rows), int(cols), x.element_size())
    part = split_workspace(rows, slices, x.device)[0]  # one word a slice a row: the first half
    wrap_triton(split_kernel(layer_norm_forward_kernel, warps, per_sm))[(groups * slices,)](
        x, weight, bias, y, mean, rstd, part, rows, cols, x.stride(0), eps, slices, SLICE=width,
        SLICES_P2=next_power_of_2(slices))


def launch_backward(x, weight, mean, rstd, dy, dx, dweight, dbias):
    rows, cols = x.shape
    if cols == 0:
        return
    if rows == 0:
        dweight.zero_()  # sums over no rows
        dbias.zero_()
        return
    width, warps, per_sm, slices, groups = split_plan(x.device, int(rows), int(cols), x.element_size())
    part = split_workspace(rows, slices, x.device)[0]  # one word a slice a row: the first half
    count = torch.empty(1, dtype=torch.int32, device=x.device)
    partial = empty_partials(2, groups, cols, x.device)
    block_g, block_c = grid_sum_tile(groups, cols)
    wrap_triton(split_kernel(layer_norm_backward_kernel, warps, per_sm))[(groups * slices,)](
        x, weight, mean, rstd, dy, dx, partial, part, count, dweight, dbias, tickets(x, 2), rows, cols, x.stride(0),
        dy.stride(0), slices, SLICE=width, SLICES_P2=next_power_of_2(slices), GRID_SUM=GRID_SUM, BLOCK_G=block_g,
        BLOCK_C=block_c)
    if not GRID_SUM:
        sum_counted_partials(partial, count, dweight, dbias)
