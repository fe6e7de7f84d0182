"""
Step 3 — backward: prefetched tiles into partial rows, long rows in chunks; forward tuned per row
Changed:  backward: step 2's persistent programs, each with two fp32 partial rows (dy*xhat and
          dy) summed in a fixed order by a second kernel, with four changes. (1) The next tile's
          x and dy (kept bf16, packed), mean and rstd are loaded before the current tile is
          reduced and stored: two tiles in flight a program. (2) dweight and dbias are summed elementwise into two
          ROWS x BLOCK fp32 tiles and reduced over their rows once, at the end: no cross-warp
          reduction a tile. (3) The grid is autotuned with the tile: PER_SM = 1, 2 or 4 programs
          an SM (8-16 warps an SM, maxnreg keeps them all resident), at most the count whose
          partials stay within 3% of the 3·n bytes (4,096 rows: one an SM; 16,384: two; 32,768
          and up: four); program 0 writes how many partial rows exist and one launch of the sum
          kernel (both sums, 32 columns x up to 512 partial rows a program) reads that count on
          the device. (4) Rows of 8,192 and up may, past 8,192 must, stream in chunks of
          2,048-8,192: pass 1 mean(g*xhat) and mean(g) (DRAM), pass 2 the chunks again, last
          first (L1, else L2), for dx, dweight and dbias, each chunk's sums added into the
          program's own partial rows in memory (read and written by that program only, in tile
          order). Forward: step 1's program per row (the hardware keeps the SMs full), ROWS and
          warps autotuned around step 1's config; past 65,536 columns, chunks (three passes:
          mean, variance of x - mean, y).
Why:      step 2's program loads a tile, reduces it three times (two row sums, then dweight and
          dbias across warps: barriers) and stores, and only then loads again; at 2 programs an
          SM that is too few loads in flight for short rows (262,144 x 256: 652 GB/s), 4,096 x
          4,096 pays 8.6 MB of partials and two more launches, and at 32k columns its register
          row spills (402). Column strips were tried first (each program re-reading a strip of
          every wave's rows for dweight and dbias, no partials, expecting L2 hits) and measured
          on H100, bf16 backward vs step 2: layer 4,096^2 1,392 vs 2,092, 16,384 x 8,192 1,821
          vs 2,602, 32,768 x 4,096 1,676 vs 2,645, 4,096 x 32,768 1,399 vs 402, fp32 4,096^2
          1,909 vs 2,707, 262,144 x 256 386 vs 652: the strips' narrow re-reads cost DRAM-like
          time, so that idea is gone. Here bytes stay 3·n to DRAM plus the partials (<= 3% by
          construction, mostly L2 hits), and each SM keeps 16-64 KB of loads outstanding
          through its reductions (Little's law at ~3 TB/s and ~1 us: ~23 KB an SM). Long rows
          trade DRAM for L2: pass 2 re-reads 4 B and read-modify-writes 16 B of partials an
          element, L2 hits.
Still:    long rows are bound by that L2 traffic (~26 B an element through L2 against 6 from
          DRAM), not by DRAM: CUDA step 3 splits the row across a cluster instead, which Triton
          does not expose; step 4 splits it across programs that meet through L2. The partials and their second launch remain (~1-3 us). The grid's
          size is a config, so the bits of dweight and dbias are fixed per (shape, chosen
          config), as in step 2. Nothing pipelines the chunked passes beyond the other programs.
          The backward ran 48.7 us at bf16 4096^2 against rms_norm's 37.1 (run c27de173e145)
          while it loaded each tile's mean and rstd in the tile's own iteration: xhat needs
          them before either row sum, so every tile waited a DRAM round trip (~1.5 us, 31 tiles
          a program at one an SM) that rms_norm's dot, which needs no statistic, hides. Loaded a
          tile ahead (predicted ~39 us): 39.7 us, 16,384 x 8,192 306.8 -> 277.2, fp32 4096^2
          79.0 -> 71.2 (run a6434ea31418). The first suspect, the two row sums (10 bar.sync a
          tile at 16 warps against rms_norm's 5), taken by one tl.reduce over the pair (7):
          48.7 us against 48.4 in turns, and step 4 slower with it
          (results/<gpu>/ablation_norm_triton_pair_reduce.txt).
Limits:   no row limit (step 2's 65,536 is gone). ptxas -v, sm_90a: all 154 backward configs
          (both ops, bf16 and fp32, 256 to 65,536 columns) spill-free, bf16 80-150 registers,
          fp32 80-186, each under maxnreg = 64K / (32 x PER_SM x WARPS); fp32 takes 16 values a
          thread only at <= 8 warps an SM (at a 128 cap they spilled 16-144 B). The forward
          keeps step 1's register row up to 65,536 (step 1's spill at 32,768 and up: ~288 B at
          32,768, ~1.3 KB at 65,536; the chunked candidate is spill-free). Workspace: 2 x SMs x
          PER_SM(max) x cols fp32 and one int32. The first call for each (cols, row class,
          dtype) runs the autotuners, forward and backward (per bound on PER_SM); the row class
          (rows.bit_length()) joined cols in their key after a suite run (3f83a679664a) timed
          bf16 8,192 x 1,000 at 18.5 us against 15.4 the run before: keyed on cols alone, the
          first row count seen had picked the config for all.
Layout:   rows
Mirrors:  CUDA step 3 (the next row loaded before the current one is reduced; per-group
          dweight/dbias partials summed by a second kernel), without its clusters for long rows
"""
import functools

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import cdiv, next_power_of_2, sm_count, tuned
from rosetta.triton_kernels.norm_common import empty_partials, forward_pairs, partial_configs, partial_per_sm, \
    register_cap, sum_counted_partials


@triton.jit
def layer_norm_forward_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    b_ptr,  # bias, (cols,)
    y_ptr,  # output, contiguous rows x cols
    mean_ptr,  # fp32 (rows,), saved for the backward
    rstd_ptr,  # fp32 (rows,), saved for the backward
    rows,
    cols,  # the autotune key, with row_class
    row_class,  # rows.bit_length(), unused here: a config tuned on 8 rows does not serve 8,192
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
    partial_ptr,  # fp32 (2, groups >= programs, cols): program p's sums of dy*xhat and of dy, rows p
    count_ptr,  # int32 (1,): partial rows written, for the reduction
    rows,
    cols,  # the autotune key, with row_class
    row_class,  # rows.bit_length(), unused here: a config tuned on 8 rows does not serve 8,192
    x_row_stride,
    dy_row_stride,
    groups,  # partial rows allocated a sum (the stride between the two sums)
    BLOCK: tl.constexpr,  # next_power_of_2(cols)
    CHUNK: tl.constexpr,  # BLOCK: the tile ROWS x BLOCK in registers; less: a long row in chunks
    ROWS: tl.constexpr,  # rows a tile
    WARPS: tl.constexpr,
    PER_SM: tl.constexpr,  # programs an SM, read by the grid function
):
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    tiles = tl.cdiv(rows, ROWS)
    if pid == 0:
        tl.store(count_ptr, tl.minimum(progs, tiles))  # programs past the last tile write no row
    r_offs = tl.arange(0, ROWS)
    c_offs = tl.arange(0, CHUNK)
    pw_row = partial_ptr + pid.to(tl.int64) * cols
    pb_row = partial_ptr + (groups + pid).to(tl.int64) * cols
    if CHUNK >= BLOCK:
        c_mask = c_offs < cols
        w = tl.load(w_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)
        # dy*xhat and dy summed elementwise over this program's tiles (in tile order), reduced over
        # the tile's rows once at the end: no cross-warp reduction (barrier) a tile for them.
        acc_w = tl.zeros([ROWS, CHUNK], tl.float32)
        acc_b = tl.zeros([ROWS, CHUNK], tl.float32)
        # Tiles pid, pid + G, ...: the first tile's loads here, every later tile's loads issued
        # one iteration early (below), so each program has two tiles' loads in flight while it
        # reduces and stores: step 2's load, reduce, store, then load again is gone.
        r = pid.to(tl.int64) * ROWS + r_offs
        r_mask = r < rows
        mask = r_mask[:, None] & c_mask[None, :]
        x = tl.load(x_ptr + r[:, None] * x_row_stride + c_offs[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c_offs[None, :], mask=mask, other=0.0)
        mean = tl.load(mean_ptr + r, mask=r_mask, other=0.0)
        rstd = tl.load(rstd_ptr + r, mask=r_mask, other=0.0)
        for tile in range(pid.to(tl.int64), tiles, progs):
            r = tile * ROWS + r_offs
            r_mask = r < rows
            mask = r_mask[:, None] & c_mask[None, :]
            # The next tile (all masked past the last): kept in the input dtype (bf16: packed, half
            # the registers) until its own iteration converts it; its mean and rstd with it: xhat
            # needs them before either row sum, so loaded here they would put a memory round trip
            # on every tile's critical path (rms_norm's dot needs no statistic first).
            rn = r + progs * ROWS
            rn_mask = rn < rows
            mask_n = rn_mask[:, None] & c_mask[None, :]
            x_next = tl.load(x_ptr + rn[:, None] * x_row_stride + c_offs[None, :], mask=mask_n, other=0.0)
            dy_next = tl.load(dy_ptr + rn[:, None] * dy_row_stride + c_offs[None, :], mask=mask_n, other=0.0)
            mean_next = tl.load(mean_ptr + rn, mask=rn_mask, other=0.0)
            rstd_next = tl.load(rstd_ptr + rn, mask=rn_mask, other=0.0)
            # other=0: padding has dy = 0 (so g = 0) and xhat = 0: it adds nothing.
            dyf = dy.to(tl.float32)
            xhat = tl.where(mask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
            g = dyf * w[None, :]
            c_hat = tl.sum(g * xhat, axis=1)[:, None] / cols
            c_one = tl.sum(g, axis=1)[:, None] / cols
            dx = rstd[:, None] * (g - c_one - xhat * c_hat)
            tl.store(dx_ptr + r[:, None] * cols + c_offs[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
            acc_w += dyf * xhat
            acc_b += dyf
            x = x_next
            dy = dy_next
            mean = mean_next
            rstd = rstd_next
        if pid < tiles:
            tl.store(pw_row + c_offs, tl.sum(acc_w, axis=0), mask=c_mask)
            tl.store(pb_row + c_offs, tl.sum(acc_b, axis=0), mask=c_mask)
    else:
        # A long row in chunks, two passes: pass 1 mean(g*xhat) and mean(g) (DRAM), pass 2 the
        # chunks again, last first (the most recently loaded: L1, else L2 hits) for dx, dweight
        # and dbias. The partial rows are too wide for registers, so pass 2 adds each chunk's sums
        # into this program's own partial rows in memory (first tile: stores them): one program
        # reads and writes them, in tile order, so the sums are still fixed.
        chunks = tl.cdiv(cols, CHUNK)
        for tile in range(pid.to(tl.int64), tiles, progs):
            r = tile * ROWS + r_offs
            r_mask = r < rows
            mean = tl.load(mean_ptr + r, mask=r_mask, other=0.0)[:, None]
            rstd = tl.load(rstd_ptr + r, mask=r_mask, other=0.0)[:, None]
            acc_hat = tl.zeros([ROWS, CHUNK], tl.float32)
            acc_one = tl.zeros([ROWS, CHUNK], tl.float32)
            for c0 in range(0, cols, CHUNK):
                c = c0 + c_offs
                mask = r_mask[:, None] & (c < cols)[None, :]
                x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
                g = dy * w[None, :]
                acc_hat += g * tl.where(mask, (x - mean) * rstd, 0.0)
                acc_one += g
            c_hat = tl.sum(acc_hat, axis=1)[:, None] / cols
            c_one = tl.sum(acc_one, axis=1)[:, None] / cols
            tl.debug_barrier()  # the last tile's partial stores, by any thread, before this tile's loads
            for k in range(0, chunks):
                c = (chunks - 1 - k) * CHUNK + c_offs
                c_mask = c < cols
                mask = r_mask[:, None] & c_mask[None, :]
                x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
                xhat = tl.where(mask, (x - mean) * rstd, 0.0)
                dx = rstd * (dy * w[None, :] - c_one - xhat * c_hat)
                tl.store(dx_ptr + r[:, None] * cols + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
                later = tile > pid  # not this program's first tile: add to what it stored
                part_w = tl.load(pw_row + c, mask=c_mask & later, other=0.0)
                tl.store(pw_row + c, part_w + tl.sum(dy * xhat, axis=0), mask=c_mask)
                part_b = tl.load(pb_row + c, mask=c_mask & later, other=0.0)
                tl.store(pb_row + c, part_b + tl.sum(dy, axis=0), mask=c_mask)


def _interpret_chunk(block):
    """Under the interpreter: chunks of 256, so the small CPU shapes run the long-row path too."""
    return min(block, 256)


# One autotuner per BLOCK (and per backward grid bound): every config it times is valid for the
# rows it sees (no pruner: torch's wrap_triton would rebuild an autotuner with one on every call).
# Built on first use.
@functools.cache
def forward_kernel(block):
    configs = [triton.Config({"ROWS": rows, "CHUNK": chunk, "WARPS": warps}, num_warps=warps)
               for rows, chunk, warps in forward_pairs(block)]
    interpret = triton.Config({"ROWS": 2, "CHUNK": _interpret_chunk(block), "WARPS": 4}, num_warps=4)
    return triton.autotune(configs=tuned(configs, interpret), key=["cols", "row_class"])(layer_norm_forward_kernel)


def backward_configs(block, max_per_sm, wide=False):
    """wide: 4-byte data (norm_common.partial_configs: fewer 16-value tiles)."""
    def config(rows, chunk, warps, per_sm):
        return triton.Config({"ROWS": rows, "CHUNK": chunk, "WARPS": warps, "PER_SM": per_sm}, num_warps=warps,
                             maxnreg=register_cap(per_sm, warps))
    found = partial_configs(block, max_per_sm, wide)
    return tuned([config(*c) for c in found], config(2, _interpret_chunk(block), 4, max_per_sm))


@functools.cache
def backward_kernel(block, max_per_sm, wide):
    return triton.autotune(configs=backward_configs(block, max_per_sm, wide), key=["cols", "row_class"])(
        layer_norm_backward_kernel)


def launch(x, weight, bias, y, mean, rstd, eps):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    block = next_power_of_2(int(cols))  # int: a traced (symbolic) cols keys the cache too

    def grid(meta):
        return (cdiv(rows, meta["ROWS"]),)

    row_class = int(rows).bit_length()  # with cols, the autotuners' key
    wrap_triton(forward_kernel(block))[grid](x, weight, bias, y, mean, rstd, rows, cols, row_class, x.stride(0), eps,
                                             BLOCK=block)


def launch_backward(x, weight, mean, rstd, dy, dx, dweight, dbias):
    rows, cols = x.shape
    if cols == 0:
        return
    if rows == 0:
        dweight.zero_()  # sums over no rows
        dbias.zero_()
        return
    block = next_power_of_2(int(cols))  # int: a traced (symbolic) cols keys the caches too
    max_per_sm = partial_per_sm(x.device, int(rows), x.element_size())
    # Partials for the largest grid any config launches; the kernel writes how many it used.
    groups = sm_count(x.device) * max_per_sm
    partial = empty_partials(2, groups, cols, x.device)
    count = torch.empty(1, dtype=torch.int32, device=x.device)

    def grid(meta):
        return (sm_count(x.device) * meta["PER_SM"],)

    kernel = backward_kernel(block, max_per_sm, x.element_size() >= 4)
    row_class = int(rows).bit_length()  # with cols, the autotuners' key
    wrap_triton(kernel)[grid](x, weight, mean, rstd, dy, dx, partial, count, rows, cols, row_class, x.stride(0),
                              dy.stride(0), groups, BLOCK=block)
    sum_counted_partials(partial, count, dweight, dbias)
