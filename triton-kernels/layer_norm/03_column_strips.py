"""
Step 3 — dweight and dbias in column strips (no partials, no second kernel), long rows in chunks
Changed:  backward: G persistent programs (1-4 an SM, autotuned) sweep the rows in waves of
          G x ROWS rows; after its own tile of a wave (dx only: xhat = (x - mean)*rstd, g = dy*w,
          dx = rstd*(g - mean(g) - xhat*mean(g*xhat))), program p reads its strip of the wave's
          rows, columns [p*S, (p+1)*S) with S = cols/G rounded up to 16, and adds dy*xhat and dy
          into two fp32 register tiles; at the end it writes its strips of dweight and dbias.
          The strip reads hit L2 (the wave was just loaded by its programs), every column is
          summed by one program in a fixed order (deterministic), and step 2's two partial rows
          a program and their second kernel are gone. Rows past 8,192 may stream in chunks of
          4,096-8,192: a pass for mean(g*xhat) and mean(g), a pass from L2 (chunks in reverse)
          for dx, so nothing but a chunk lives in registers. Forward: step 1's program per row
          (the hardware keeps the SMs full), ROWS and warps autotuned around step 1's config;
          past 65,536 columns, chunks (three passes: mean, variance of x - mean, y).
Why:      step 2's backward loses at 4,096 x 4,096 to its tail (2 x 4.3 MB of partials and a
          second launch: ~8 of its 48.1 us) and collapses at 32k columns because the row and its
          dweight and dbias rows spill (x, dy, w, dw, db at 32 warps, 64 registers allowed).
          Here the register row holds x, dy and w only, and long rows hold a chunk. Bytes: DRAM
          3·n (x, dy read once, dx written once), L2 another 2·n for the strips (and 2·n more
          for the chunked second pass). Prediction, bf16: backward ~2,700-2,800 GB/s at 4,096 x
          4,096 (32 waves of 132 rows: the last SM row is the ~3% tail), ~2,750-2,850 at
          16,384 x 8,192 and 32,768 x 4,096, ~2,400-2,700 at 4,096 x 32,768 (L2-bound: ~3x the
          DRAM bytes cross it); fp32 4,096 x 4,096 ~2,850-2,950. Forward: at least step 1's,
          ~2,900-3,000 GB/s (4,096 x 4,096 bf16 gains from the 4- and 16-warp candidates: step
          1's 8-warp row takes 64 registers, 4 programs an SM).
Still:    the strip reads are L2 traffic the size of x and dy again: if the programs drift more
          than a few waves apart, or a wave outgrows L2 (G x ROWS x cols x 4 bytes; 17 MB at
          4,096 x 32,768 bf16), they come from DRAM. Nothing overlaps a program's own load,
          reduce, store: only the other programs on the SM and the strip phase hide it.
Limits:   no row limit (step 2's 65,536 is gone). ptxas -v, sm_90a, bf16: every backward config
          is spill-free (<= 16 values a thread and tensor in the row tile, 4 in the strip tiles,
          <= 16 warps; bf16 ~95-128 registers, so PER_SM x WARPS <= 16 keeps the grid resident;
          fp32 up to ~194 at 8 warps, so one program an SM);
          the forward keeps step 1's register row up to 65,536 (step 1's spill at 32,768 and
          up: ~288 B at 32,768, ~1.3 KB at 65,536; the chunked candidate is spill-free). Grid: max(SMs x PER_SM, cols / 512)
          programs, all resident only while that fits the SMs (past ~67,584 columns strips may
          miss L2: correct, slower). The first call for each (cols, dtype) runs the autotuner.
Layout:   rows
Mirrors:  CUDA step 2 (row in registers); the dweight/dbias sums of CUDA step 1's column kernel,
          moved into the same kernel as strips read from L2
"""
import functools

import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import tuned
from rosetta.triton_kernels.norm_common import backward_pairs, forward_pairs, strip_block, strip_programs

# Strip tile values a thread and tensor: two sums (dweight, dbias) live, so half of rms_norm's 8
# (ptxas -v, sm_90a: 8 spills 12 B at 4,096 x 8 warps, 4 takes 95 registers and none).
STRIP_VALUES = 4
CHUNK_WARPS = (16,)  # the chunked pass 1 with two sums takes 170 registers at 8 warps


@triton.jit
def layer_norm_forward_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    b_ptr,  # bias, (cols,)
    y_ptr,  # output, contiguous rows x cols
    mean_ptr,  # fp32 (rows,), saved for the backward
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
        # Step 1's kernel: a 1-D row (a [1, BLOCK] tile costs registers).
        row = tl.program_id(0).to(tl.int64)  # 64-bit: row * stride passes 2^31 on big inputs
        c_mask = c_offs < cols
        # other=0: padding adds nothing to the sum. A NaN makes its row NaN.
        x = tl.load(x_ptr + row * x_row_stride + c_offs, mask=c_mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / cols
        # Variance of x - mean from registers (no E[x^2] - E[x]^2 cancellation); padding zeroed
        # first, else each lane would add mean^2.
        xc = tl.where(c_mask, x - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / cols + eps)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)
        w = tl.load(w_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)  # after the sums: fewer live
        b = tl.load(b_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * cols + c_offs, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=c_mask)
    elif CHUNK >= BLOCK:
        r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        r_mask = r < rows
        c_mask = c_offs < cols
        mask = r_mask[:, None] & c_mask[None, :]
        x = tl.load(x_ptr + r[:, None] * x_row_stride + c_offs[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / cols
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / cols + eps)
        tl.store(mean_ptr + r, mean, mask=r_mask)
        tl.store(rstd_ptr + r, rstd, mask=r_mask)
        w = tl.load(w_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)
        y = xc * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(y_ptr + r[:, None] * cols + c_offs[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # A row in chunks, three passes (the last two from L2: a program's rows are a few
        # hundred KB): the mean, the variance of x - mean (still no cancellation), y.
        r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        r_mask = r < rows
        acc = tl.zeros([ROWS, CHUNK], tl.float32)
        for c0 in range(0, cols, CHUNK):
            c = c0 + c_offs
            mask = r_mask[:, None] & (c < cols)[None, :]
            acc += tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=1) / cols
        acc = tl.zeros([ROWS, CHUNK], tl.float32)
        for c0 in range(0, cols, CHUNK):
            c = c0 + c_offs
            mask = r_mask[:, None] & (c < cols)[None, :]
            x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
            xc = tl.where(mask, x - mean[:, None], 0.0)
            acc += xc * xc
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / cols + eps)
        tl.store(mean_ptr + r, mean, mask=r_mask)
        tl.store(rstd_ptr + r, rstd, mask=r_mask)
        for c0 in range(0, cols, CHUNK):
            c = c0 + c_offs
            mask = r_mask[:, None] & (c < cols)[None, :]
            x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
            y = (x - mean[:, None]) * rstd[:, None] * w[None, :] + b[None, :]
            tl.store(y_ptr + r[:, None] * cols + c[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layer_norm_backward_kernel(
    x_ptr,  # forward input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    mean_ptr,  # fp32 (rows,), from the forward
    rstd_ptr,  # fp32 (rows,), from the forward
    dy_ptr,  # gradient of y, rows x cols, unit column stride
    dx_ptr,  # gradient of x, contiguous rows x cols
    dw_ptr,  # dweight, (cols,), in the weight's dtype: each program writes its strip
    db_ptr,  # dbias, (cols,), likewise
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
    # This program's strip of dweight and dbias: the same arithmetic as norm_common.strip_width.
    strip = tl.cdiv(tl.cdiv(cols, progs), 16) * 16
    s_lanes = tl.arange(0, STRIP_BLOCK)
    s_cols = pid * strip + s_lanes
    s_mask = (s_lanes < strip) & (s_cols < cols)
    sr_offs = tl.arange(0, STRIP_ROWS)
    # fp32 strip sums, STRIP_ROWS rows apart: each lane adds rows / STRIP_ROWS terms in row order,
    # then one tl.sum over the lanes' rows: a fixed order, whatever the timing.
    acc_w = tl.zeros([STRIP_ROWS, STRIP_BLOCK], tl.float32)
    acc_b = tl.zeros([STRIP_ROWS, STRIP_BLOCK], tl.float32)
    wave_rows = progs * ROWS
    for wave in range(0, tl.cdiv(rows, wave_rows)):
        # ---- this program's tile of the wave: dx (a tile past the last row is all masked) ----
        r = (wave * progs + pid).to(tl.int64) * ROWS + r_offs
        r_mask = r < rows
        mean = tl.load(mean_ptr + r, mask=r_mask, other=0.0)[:, None]
        rstd = tl.load(rstd_ptr + r, mask=r_mask, other=0.0)[:, None]
        if CHUNK >= BLOCK:
            mask = r_mask[:, None] & (c_offs < cols)[None, :]
            x = tl.load(x_ptr + r[:, None] * x_row_stride + c_offs[None, :], mask=mask, other=0.0).to(tl.float32)
            # other=0: padding has dy = 0 (so g = 0) and xhat = 0 below: it adds nothing.
            dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c_offs[None, :], mask=mask,
                         other=0.0).to(tl.float32)
            # w again each tile (L1 hits): held across the loop it would cost 8-16 registers.
            w = tl.load(w_ptr + c_offs, mask=c_offs < cols, other=0.0).to(tl.float32)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            g = dy * w[None, :]
            c_hat = tl.sum(g * xhat, axis=1)[:, None] / cols
            c_one = tl.sum(g, axis=1)[:, None] / cols
            dx = rstd * (g - c_one - xhat * c_hat)
            tl.store(dx_ptr + r[:, None] * cols + c_offs[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        else:
            # Pass 1: mean(g*xhat) and mean(g) chunk by chunk into register tiles, reduced once.
            acc_hat = tl.zeros([ROWS, CHUNK], tl.float32)
            acc_one = tl.zeros([ROWS, CHUNK], tl.float32)
            for c0 in range(0, cols, CHUNK):
                c = c0 + c_offs
                mask = r_mask[:, None] & (c < cols)[None, :]
                x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c[None, :], mask=mask,
                             other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
                g = dy * w[None, :]
                acc_hat += g * tl.where(mask, (x - mean) * rstd, 0.0)
                acc_one += g
            c_hat = tl.sum(acc_hat, axis=1)[:, None] / cols
            c_one = tl.sum(acc_one, axis=1)[:, None] / cols
            # Pass 2: the chunks again, last first (the most recently loaded are likeliest in L2).
            chunks = tl.cdiv(cols, CHUNK)
            for k in range(0, chunks):
                c = (chunks - 1 - k) * CHUNK + c_offs
                mask = r_mask[:, None] & (c < cols)[None, :]
                x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c[None, :], mask=mask,
                             other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
                dx = rstd * (dy * w[None, :] - c_one - (x - mean) * rstd * c_hat)
                tl.store(dx_ptr + r[:, None] * cols + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
        # ---- this program's strip of the whole wave: dweight += dy * xhat, dbias += dy ----
        lo = wave * wave_rows
        hi = tl.minimum(lo + wave_rows, rows)
        for r0 in range(lo, hi, STRIP_ROWS):
            sr = (r0 + sr_offs).to(tl.int64)
            sr_mask = sr < hi
            s_tile = sr_mask[:, None] & s_mask[None, :]
            # other=0: masked lanes have dy = 0 and add nothing to either sum.
            xs = tl.load(x_ptr + sr[:, None] * x_row_stride + s_cols[None, :], mask=s_tile, other=0.0).to(tl.float32)
            dys = tl.load(dy_ptr + sr[:, None] * dy_row_stride + s_cols[None, :], mask=s_tile,
                          other=0.0).to(tl.float32)
            ms = tl.load(mean_ptr + sr, mask=sr_mask, other=0.0)[:, None]
            rs = tl.load(rstd_ptr + sr, mask=sr_mask, other=0.0)[:, None]
            acc_w += dys * ((xs - ms) * rs)
            acc_b += dys
    tl.store(dw_ptr + s_cols, tl.sum(acc_w, axis=0).to(dw_ptr.dtype.element_ty), mask=s_mask)
    tl.store(db_ptr + s_cols, tl.sum(acc_b, axis=0).to(db_ptr.dtype.element_ty), mask=s_mask)


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
    return triton.autotune(configs=tuned(configs, interpret), key=["cols"])(layer_norm_forward_kernel)


def backward_configs(block, s_block, wide=False):
    """wide: 4-byte data, one program an SM (norm_common.backward_pairs)."""
    def config(rows, chunk, warps, per_sm):
        strip_rows = max(1, STRIP_VALUES * 32 * warps // s_block)
        return triton.Config({"ROWS": rows, "CHUNK": chunk, "WARPS": warps, "PER_SM": per_sm,
                              "STRIP_ROWS": strip_rows}, num_warps=warps)
    pairs = backward_pairs(block, CHUNK_WARPS, shared_sm=not wide)
    return tuned([config(*p) for p in pairs], config(2, _interpret_chunk(block), 4, 2))


def min_per_sm(block):
    return min(c.kwargs["PER_SM"] for c in backward_configs(block, 16))


@functools.cache
def backward_kernel(block, s_block, wide):
    return triton.autotune(configs=backward_configs(block, s_block, wide), key=["cols"])(layer_norm_backward_kernel)


def launch(x, weight, bias, y, mean, rstd, eps):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    block = triton.next_power_of_2(int(cols))  # int: a traced (symbolic) cols keys the cache too

    def grid(meta):
        return (triton.cdiv(rows, meta["ROWS"]),)

    wrap_triton(forward_kernel(block))[grid](x, weight, bias, y, mean, rstd, rows, cols, x.stride(0), eps,
                                             BLOCK=block)


def launch_backward(x, weight, mean, rstd, dy, dx, dweight, dbias):
    rows, cols = x.shape
    if cols == 0:
        return
    if rows == 0:
        dweight.zero_()  # sums over no rows
        dbias.zero_()
        return
    n = int(cols)  # int: a traced (symbolic) cols keys the caches too
    block = triton.next_power_of_2(n)
    # The strip tile holds the widest strip of any config's grid (the fewest programs).
    s_block = strip_block(x.device, n, min_per_sm(block))

    def grid(meta):
        return (strip_programs(x.device, n, meta["PER_SM"]),)

    kernel = backward_kernel(block, s_block, x.element_size() >= 4)
    wrap_triton(kernel)[grid](x, weight, mean, rstd, dy, dx, dweight, dbias, rows, cols, x.stride(0), dy.stride(0),
                              BLOCK=block, STRIP_BLOCK=s_block)
