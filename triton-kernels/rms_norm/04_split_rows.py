"""
Step 4 — long rows split across a group of programs that meet through L2
Changed:  a row is cut into slices of 4,096 columns (fp32: 2,048), and a group of consecutive
          programs shares each of its rows, program s holding slice s of every row the group
          does, in registers, for the whole launch. Per row each program publishes its slice's
          partial sum (forward: of x^2; backward: of dy*w*x), bumps the row's arrival counter,
          spins until the group has arrived (norm_common.share) and adds the partials in slice
          order; the next row's slice is loaded before the wait, so the loads stay in flight
          through it. The backward's dweight sum for the program's columns stays in registers
          across the launch and becomes one partial row per group, summed by a second kernel in a
          fixed order. The grid (SMs x 2 programs, 8 warps each) is a host table, not a tuner.
Why:      step 3 streams a row of 32,768 columns in chunks, twice: pass 2 reads each chunk again
          from L2 and read-modify-writes its fp32 partial row there, ~18 bytes of L2 traffic an
          element against 6 from DRAM, and measured 1,152 GB/s (bf16, 4,096 x 32,768) where CUDA
          step 3, whose row spans a cluster's registers, reached 2,768. Here every byte of x and
          dy is read once, and a program's registers hold 16 values a tensor, as at 4,096
          columns. Predicted: 4,096 x 32,768 backward ~2,600 GB/s (the CUDA cluster's figure less
          the exchange, one L2 round trip a row, hidden behind the next row's loads), forward
          ~2,900 (step 3: 2,980, its row in one program); rows of 4,096-8,192 about step 3.
Still:    a program waits for its slowest peer on every row, and the exchange is an L2 round
          trip (~1 us) where a cluster's is a DSMEM one. Under TRITON_INTERPRET=1 programs run
          one after another and cannot wait: there the slice is the whole row, and only a GPU
          runs the exchange. The arrival counters take a memset a call.
Limits:   rows of 4,096 columns and more (shorter rows are step 3's: one slice, nothing to
          split); at most 65,536 (16 slices, 32 fp32). Every program of the grid must be resident
          at once: other work holding SMs (another stream, MPS) makes the groups wait for it.
          Workspace: 8 bytes a slice a row, 4 a row, and groups x cols fp32 (backward).
Layout:   rows
Min:      cols >= 4096
Max:      cols <= 65536
Mirrors:  CUDA step 3 (a long row across a cluster's CTAs, the sums through DSMEM), with L2 and
          an arrival counter in place of DSMEM and the cluster barrier
"""
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import next_power_of_2
from rosetta.triton_kernels.norm_common import empty_partials, share, split_kernel, split_plan, split_workspace, \
    sum_partials


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
    rows,
    cols,
    x_row_stride,
    dy_row_stride,
    slices,
    SLICE: tl.constexpr,
    SLICES_P2: tl.constexpr,
):
    pid = tl.program_id(0)
    s = pid % slices
    group = pid // slices
    groups = tl.num_programs(0) // slices
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
    partial = empty_partials(1, groups, cols, x.device)
    wrap_triton(split_kernel(rms_norm_backward_kernel, warps, per_sm))[(groups * slices,)](
        x, weight, rstd, dy, dx, partial, part, rows, cols, x.stride(0), dy.stride(0), slices, SLICE=width,
        SLICES_P2=next_power_of_2(slices))
    sum_partials(partial, dweight)
