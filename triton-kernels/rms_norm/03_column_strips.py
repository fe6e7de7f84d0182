"""
Step 3 — dweight in column strips (no partials, no second kernel), long rows in chunks
Changed:  backward: G persistent programs (1-4 an SM, autotuned) sweep the rows in waves of
          G x ROWS rows; after its own tile of a wave (dx only: g = dy*w, dx = rstd*(g -
          x*rstd^2*mean(g*x))), program p reads its strip of the wave's rows, columns
          [p*S, (p+1)*S) with S = cols/G rounded up to 16, and adds dy*x*rstd into fp32
          registers; at the end it writes its strip of dweight. The strip reads hit L2 (the wave
          was just loaded by its programs), every column is summed by one program in a fixed
          order (deterministic), and step 2's partial rows and their second kernel are gone.
          Rows past 8,192 (16,384 at 32 warps) stream in chunks of 4,096-8,192: a pass for
          mean(g*x), a pass from L2 (chunks in reverse) for dx, so nothing but a chunk lives in
          registers. Forward: step 1's program per row (the hardware keeps the SMs full), with
          ROWS and warps autotuned around step 1's own config; past 65,536 columns, chunks.
Why:      step 2 loses at 4,096 x 4,096 to its tail (the partials, 4.3 MB, and a second launch:
          ~5 of its 41.8 us) and collapses at 32k columns because the row and its dweight row
          spill (x, dy, w and dw: 4 x 32 fp32 a thread at 32 warps, 64 registers allowed). Here
          the register row holds x, dy and w only, and long rows hold a chunk. Bytes: DRAM 3·n
          (x, dy read once, dx written once), L2 another 2·n for the strips (and 2·n more for
          the chunked second pass). Prediction, bf16: backward ~2,750-2,850 GB/s at 4,096 x
          4,096 (32 waves of 132 rows: the last SM row is the ~3% tail), ~2,800-2,900 at
          16,384 x 8,192 and 32,768 x 4,096, ~2,500-2,800 at 4,096 x 32,768 (L2-bound: ~3x
          the DRAM bytes cross it); fp32 4,096 x 4,096 ~2,900-3,000. Forward: step 1's numbers or
          better, ~2,950-3,050 GB/s on all four bf16 headlines and fp32.
Still:    the strip reads are L2 traffic the size of x and dy again: if the programs drift more
          than a few waves apart, or a wave outgrows L2 (G x ROWS x cols x 4 bytes; 17 MB at
          4,096 x 32,768 bf16), they come from DRAM. Nothing overlaps a program's own load,
          reduce, store: only the other programs on the SM and the strip phase hide it.
Limits:   no row limit (step 2's 65,536 is gone). ptxas -v, sm_90a, bf16: every backward config
          is spill-free but fp32 4,096 at 16 warps (ptxas caps it at 64 registers: 20 B); bf16
          takes 100-128 registers at 4-16 warps, so PER_SM x WARPS <= 16 keeps the grid
          resident, and fp32 (up to ~194) runs one program an SM;
          the forward keeps step 1's register row up to 65,536 (its spill too: 44 B at 32,768,
          ~840 B at 65,536; the chunked candidate is spill-free). Grid:
          max(SMs x PER_SM, cols / 512) programs, all resident only while that fits the SMs
          (past ~67,584 columns strips may miss L2: correct, slower). The first call for each
          (cols, dtype) runs the autotuner, forward and backward.
Layout:   rows
Mirrors:  CUDA step 2 (row in registers); the dweight sum of CUDA step 1's column kernel, moved
          into the same kernel as strips read from L2
"""
import functools

import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import tuned
from rosetta.triton_kernels.norm_common import STRIP_VALUES, backward_pairs, forward_pairs, strip_block, \
    strip_programs


@triton.jit
def rms_norm_forward_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    y_ptr,  # output, contiguous rows x cols
    rstd_ptr,  # fp32 (rows,), saved for the backward
    rows,
    cols,  # the autotune key
    x_row_stride,
    eps,
    BLOCK: tl.constexpr,  # next_power_of_2(cols)
    CHUNK: tl.constexpr,  # columns a tile: BLOCK (the row in registers) or a chunk of a long row
    ROWS: tl.constexpr,  # rows a program (not persistent: the hardware refills the SMs)
    WARPS: tl.constexpr,
):
    c_offs = tl.arange(0, CHUNK)
    if CHUNK >= BLOCK and ROWS == 1:
        # Step 1's kernel: a 1-D row (a [1, BLOCK] tile costs registers: ~76 B of spill at 32k).
        row = tl.program_id(0).to(tl.int64)  # 64-bit: row * stride passes 2^31 on big inputs
        c_mask = c_offs < cols
        # other=0: padding adds nothing to the sum of squares. A NaN makes its row NaN.
        x = tl.load(x_ptr + row * x_row_stride + c_offs, mask=c_mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / cols + eps)
        tl.store(rstd_ptr + row, rstd)
        w = tl.load(w_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)  # after the sum: fewer live
        tl.store(y_ptr + row * cols + c_offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=c_mask)
    elif CHUNK >= BLOCK:
        r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        r_mask = r < rows
        c_mask = c_offs < cols
        mask = r_mask[:, None] & c_mask[None, :]
        x = tl.load(x_ptr + r[:, None] * x_row_stride + c_offs[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / cols + eps)
        tl.store(rstd_ptr + r, rstd, mask=r_mask)
        w = tl.load(w_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + r[:, None] * cols + c_offs[None, :], (x * rstd[:, None] * w[None, :]).to(
            y_ptr.dtype.element_ty), mask=mask)
    else:
        # A row in chunks: sum of squares chunk by chunk, then the chunks again (from L2: a
        # program's rows are a few hundred KB) for y.
        r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        r_mask = r < rows
        acc = tl.zeros([ROWS, CHUNK], tl.float32)
        for c0 in range(0, cols, CHUNK):
            c = c0 + c_offs
            mask = r_mask[:, None] & (c < cols)[None, :]
            x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / cols + eps)
        tl.store(rstd_ptr + r, rstd, mask=r_mask)
        for c0 in range(0, cols, CHUNK):
            c = c0 + c_offs
            mask = r_mask[:, None] & (c < cols)[None, :]
            x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
            tl.store(y_ptr + r[:, None] * cols + c[None, :], (x * rstd[:, None] * w[None, :]).to(
                y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_backward_kernel(
    x_ptr,  # forward input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    rstd_ptr,  # fp32 (rows,), from the forward
    dy_ptr,  # gradient of y, rows x cols, unit column stride
    dx_ptr,  # gradient of x, contiguous rows x cols
    dw_ptr,  # dweight, (cols,), in the weight's dtype: each program writes its strip
    rows,
    cols,  # the autotune key
    x_row_stride,
    dy_row_stride,
    BLOCK: tl.constexpr,  # next_power_of_2(cols)
    CHUNK: tl.constexpr,  # BLOCK: the row tile in registers; less: a long row in chunks, two passes
    ROWS: tl.constexpr,  # rows a tile
    STRIP_BLOCK: tl.constexpr,  # power of two >= the strip width
    STRIP_ROWS: tl.constexpr,  # rows a strip tile (STRIP_VALUES a thread and tensor)
    WARPS: tl.constexpr,
    PER_SM: tl.constexpr,  # programs an SM, read by the grid function
):
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    r_offs = tl.arange(0, ROWS)
    c_offs = tl.arange(0, CHUNK)
    # This program's strip of dweight: the same arithmetic as norm_common.strip_width.
    strip = tl.cdiv(tl.cdiv(cols, progs), 16) * 16
    s_lanes = tl.arange(0, STRIP_BLOCK)
    s_cols = pid * strip + s_lanes
    s_mask = (s_lanes < strip) & (s_cols < cols)
    sr_offs = tl.arange(0, STRIP_ROWS)
    # fp32 strip sums, STRIP_ROWS rows apart: each lane adds rows / STRIP_ROWS terms in row order,
    # then one tl.sum over the lanes' rows: a fixed order, whatever the timing.
    acc = tl.zeros([STRIP_ROWS, STRIP_BLOCK], tl.float32)
    wave_rows = progs * ROWS
    for wave in range(0, tl.cdiv(rows, wave_rows)):
        # ---- this program's tile of the wave: dx (a tile past the last row is all masked) ----
        r = (wave * progs + pid).to(tl.int64) * ROWS + r_offs
        r_mask = r < rows
        rstd = tl.load(rstd_ptr + r, mask=r_mask, other=0.0)[:, None]
        if CHUNK >= BLOCK:
            mask = r_mask[:, None] & (c_offs < cols)[None, :]
            x = tl.load(x_ptr + r[:, None] * x_row_stride + c_offs[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c_offs[None, :], mask=mask,
                         other=0.0).to(tl.float32)
            # w again each tile (L1 hits): held across the loop it would cost 8-16 registers.
            w = tl.load(w_ptr + c_offs, mask=c_offs < cols, other=0.0).to(tl.float32)
            g = dy * w[None, :]
            dot = tl.sum(g * x, axis=1)[:, None] / cols
            dx = rstd * (g - x * (rstd * rstd * dot))
            tl.store(dx_ptr + r[:, None] * cols + c_offs[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        else:
            # Pass 1: mean(g*x) chunk by chunk into a register tile, reduced once.
            acc_dot = tl.zeros([ROWS, CHUNK], tl.float32)
            for c0 in range(0, cols, CHUNK):
                c = c0 + c_offs
                mask = r_mask[:, None] & (c < cols)[None, :]
                x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c[None, :], mask=mask,
                             other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
                acc_dot += dy * w[None, :] * x
            dot = tl.sum(acc_dot, axis=1)[:, None] / cols
            # Pass 2: the chunks again, last first (the most recently loaded are likeliest in L2).
            chunks = tl.cdiv(cols, CHUNK)
            for k in range(0, chunks):
                c = (chunks - 1 - k) * CHUNK + c_offs
                mask = r_mask[:, None] & (c < cols)[None, :]
                x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c[None, :], mask=mask,
                             other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
                g = dy * w[None, :]
                dx = rstd * (g - x * (rstd * rstd * dot))
                tl.store(dx_ptr + r[:, None] * cols + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        # ---- this program's strip of the whole wave: dweight += dy * x * rstd ----
        lo = wave * wave_rows
        hi = tl.minimum(lo + wave_rows, rows)
        for r0 in range(lo, hi, STRIP_ROWS):
            sr = (r0 + sr_offs).to(tl.int64)
            sr_mask = sr < hi
            s_tile = sr_mask[:, None] & s_mask[None, :]
            # other=0 and rstd 0 past the wave: masked lanes add nothing.
            xs = tl.load(x_ptr + sr[:, None] * x_row_stride + s_cols[None, :], mask=s_tile, other=0.0).to(tl.float32)
            dys = tl.load(dy_ptr + sr[:, None] * dy_row_stride + s_cols[None, :], mask=s_tile,
                          other=0.0).to(tl.float32)
            rs = tl.load(rstd_ptr + sr, mask=sr_mask, other=0.0)
            acc += dys * xs * rs[:, None]
    tl.store(dw_ptr + s_cols, tl.sum(acc, axis=0).to(dw_ptr.dtype.element_ty), mask=s_mask)


def _interpret_chunk(block):
    """Under the interpreter: chunks of 256, so the small CPU shapes run the long-row path too."""
    return min(block, 256)


# One autotuner per (BLOCK, strip tile): every config it times is valid for the rows it sees (no
# pruner: torch's wrap_triton would rebuild an autotuner with one on every call). Built on first use.
@functools.cache
def forward_kernel(block):
    configs = [triton.Config({"ROWS": rows, "CHUNK": chunk, "WARPS": warps}, num_warps=warps)
               for rows, chunk, warps in forward_pairs(block)]
    interpret = triton.Config({"ROWS": 2, "CHUNK": _interpret_chunk(block), "WARPS": 4}, num_warps=4)
    return triton.autotune(configs=tuned(configs, interpret), key=["cols"])(rms_norm_forward_kernel)


def backward_configs(block, s_block, wide=False):
    """wide: 4-byte data, one program an SM (norm_common.backward_pairs)."""
    def config(rows, chunk, warps, per_sm):
        strip_rows = max(1, STRIP_VALUES * 32 * warps // s_block)
        return triton.Config({"ROWS": rows, "CHUNK": chunk, "WARPS": warps, "PER_SM": per_sm,
                              "STRIP_ROWS": strip_rows}, num_warps=warps)
    pairs = backward_pairs(block, shared_sm=not wide)
    return tuned([config(*p) for p in pairs], config(2, _interpret_chunk(block), 4, 2))


def min_per_sm(block):
    return min(c.kwargs["PER_SM"] for c in backward_configs(block, 16))


@functools.cache
def backward_kernel(block, s_block, wide):
    return triton.autotune(configs=backward_configs(block, s_block, wide), key=["cols"])(rms_norm_backward_kernel)


def launch(x, weight, y, rstd, eps):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    block = triton.next_power_of_2(int(cols))  # int: a traced (symbolic) cols keys the cache too

    def grid(meta):
        return (triton.cdiv(rows, meta["ROWS"]),)

    wrap_triton(forward_kernel(block))[grid](x, weight, y, rstd, rows, cols, x.stride(0), eps, BLOCK=block)


def launch_backward(x, weight, rstd, dy, dx, dweight):
    rows, cols = x.shape
    if cols == 0:
        return
    if rows == 0:
        dweight.zero_()  # a sum over no rows
        return
    n = int(cols)  # int: a traced (symbolic) cols keys the caches too
    block = triton.next_power_of_2(n)
    # The strip tile holds the widest strip of any config's grid (the fewest programs).
    s_block = strip_block(x.device, n, min_per_sm(block))

    def grid(meta):
        return (strip_programs(x.device, n, meta["PER_SM"]),)

    kernel = backward_kernel(block, s_block, x.element_size() >= 4)
    wrap_triton(kernel)[grid](x, weight, rstd, dy, dx, dweight, rows, cols, x.stride(0), dy.stride(0), BLOCK=block,
                              STRIP_BLOCK=s_block)
