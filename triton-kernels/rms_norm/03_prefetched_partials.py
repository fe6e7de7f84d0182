"""
Step 3 — backward: prefetched tiles into partial rows, long rows in chunks; forward tuned per row
Changed:  backward: step 2's persistent programs, each with one fp32 partial row of dy*x*rstd
          summed in a fixed order by a second kernel, with four changes. (1) The next tile's x
          and dy are loaded (kept bf16, packed) before the current tile is reduced and stored:
          two tiles in flight a program. (2) dweight is summed elementwise into a ROWS x BLOCK
          fp32 tile and reduced over its rows once, at the end: no cross-warp reduction a tile.
          (3) The grid is autotuned with the tile: PER_SM = 1, 2 or 4 programs an SM (8-16
          warps an SM, maxnreg keeps them all resident), at most the count whose partials stay
          within 3% of the 3·n bytes (4,096 rows: one an SM, 2.1 MB at 4,096 columns; 16,384:
          two; 32,768 and up: four); program 0 writes how many partial rows exist and the sum
          kernel (32 columns x up to 512 partial rows a program, one pass) reads that count on
          the device. (4) Rows of 8,192 and up may, past 8,192 must, stream in chunks of
          2,048-8,192: pass 1 the row's dot (DRAM), pass 2 the chunks again, last first (L1,
          else L2), for dx and dweight, each chunk's sum added into the program's own partial row
          in memory (read and written by that program only, in tile order). Forward: step 1's
          program per row (the hardware keeps the SMs full), with ROWS and warps autotuned around
          step 1's own config; past 65,536 columns, chunks.
Why:      step 2's program loads a tile, reduces it twice (the row's dot, then dweight across
          warps: a barrier) and stores, and only then loads again; at 2 programs an SM that is
          too few loads in flight for short rows (262,144 x 256: 1,221 GB/s) and 4,096 x 4,096
          pays 4.3 MB of partials; at 32k columns its register row spills (476). Column strips
          were tried first (each program re-reading a strip of every wave's rows for dweight,
          no partials, expecting L2 hits) and measured on H100, bf16 backward vs step 2:
          rms 4,096^2 1,712 vs 2,409, 16,384 x 8,192 2,138 vs 2,598, 32,768 x 4,096 2,025 vs
          2,809, 4,096 x 32,768 1,699 vs 476, fp32 4,096^2 2,252 vs 2,897, 262,144 x 256 570
          vs 1,221: the strips' narrow re-reads cost DRAM-like time, so that idea is gone. Here
          bytes stay 3·n to DRAM plus the partials (<= 3% by construction, mostly L2 hits), and
          each SM keeps 16-64 KB of loads outstanding through its reductions (Little's law at
          ~3 TB/s and ~1 us: ~23 KB an SM). Long rows trade DRAM for L2: pass 2 re-reads 4 B
          and read-modify-writes 8 B of partial an element, L2 hits (132 x 128 KB rows and as
          much partial: ~34 MB).
Still:    long rows are bound by that L2 traffic (~18 B an element through L2 against 6 from
          DRAM), not by DRAM: CUDA step 3 splits the row across a cluster instead, which Triton
          does not expose; step 4 splits it across programs that meet through L2. The partials and their second launch remain (~1-3 us). The grid's
          size is a config, so the bits of dweight are fixed per (shape, chosen config), as in
          step 2. Nothing pipelines the chunked passes beyond what the other programs hide.
Limits:   no row limit (step 2's 65,536 is gone). ptxas -v, sm_90a: all 154 backward configs
          (both ops, bf16 and fp32, 256 to 65,536 columns) spill-free, bf16 72-150 registers,
          fp32 70-187, each under maxnreg = 64K / (32 x PER_SM x WARPS); fp32 takes 16 values a
          thread only at <= 8 warps an SM (at a 128 cap they spilled 4-236 B). The forward keeps
          step 1's register row up to 65,536 (its spill too: 44 B at 32,768, ~840 B at 65,536;
          the chunked candidate is spill-free). Workspace: SMs x PER_SM(max) x cols fp32 and one
          int32. The first call for each (cols, row class, dtype) runs the autotuners, forward
          and backward (per bound on PER_SM); the row class (rows.bit_length()) joined cols in
          their key after a suite run (3f83a679664a) timed bf16 8,192 x 1,000 at 18.5 us against
          15.4 the run before: keyed on cols alone, the first row count seen had picked the
          config for all.
Layout:   rows
Mirrors:  CUDA step 3 (the next row loaded before the current one is reduced; per-group dweight
          partials summed by a second kernel), without its clusters for long rows
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
def rms_norm_forward_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    w_ptr,  # weight, (cols,)
    y_ptr,  # output, contiguous rows x cols
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
    partial_ptr,  # fp32 (1, >= programs, cols): row p is program p's sum of dy*x*rstd
    count_ptr,  # int32 (1,): partial rows written, for the reduction
    rows,
    cols,  # the autotune key, with row_class
    row_class,  # rows.bit_length(), unused here: a config tuned on 8 rows does not serve 8,192
    x_row_stride,
    dy_row_stride,
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
    p_row = partial_ptr + pid.to(tl.int64) * cols
    if CHUNK >= BLOCK:
        c_mask = c_offs < cols
        w = tl.load(w_ptr + c_offs, mask=c_mask, other=0.0).to(tl.float32)
        # dy*x*rstd summed elementwise over this program's tiles (in tile order), reduced over the
        # tile's rows once at the end: no cross-warp reduction (barrier) a tile for dweight.
        acc = tl.zeros([ROWS, CHUNK], tl.float32)
        # Tiles pid, pid + G, ...: the first tile's loads here, every later tile's loads issued
        # one iteration early (below), so each program has two tiles' loads in flight while it
        # reduces and stores: step 2's load, reduce, store, then load again is gone.
        r = pid.to(tl.int64) * ROWS + r_offs
        mask = (r < rows)[:, None] & c_mask[None, :]
        x = tl.load(x_ptr + r[:, None] * x_row_stride + c_offs[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c_offs[None, :], mask=mask, other=0.0)
        for tile in range(pid.to(tl.int64), tiles, progs):
            r = tile * ROWS + r_offs
            r_mask = r < rows
            mask = r_mask[:, None] & c_mask[None, :]
            # The next tile (all masked past the last): kept in the input dtype (bf16: packed, half
            # the registers) until its own iteration converts it.
            rn = r + progs * ROWS
            mask_n = (rn < rows)[:, None] & c_mask[None, :]
            x_next = tl.load(x_ptr + rn[:, None] * x_row_stride + c_offs[None, :], mask=mask_n, other=0.0)
            dy_next = tl.load(dy_ptr + rn[:, None] * dy_row_stride + c_offs[None, :], mask=mask_n, other=0.0)
            # other=0 (and rstd 0 on padding rows): padding adds nothing to the dots or to dw.
            rstd = tl.load(rstd_ptr + r, mask=r_mask, other=0.0)[:, None]
            xf = x.to(tl.float32)
            dyf = dy.to(tl.float32)
            g = dyf * w[None, :]
            dot = tl.sum(g * xf, axis=1)[:, None] / cols
            dx = rstd * (g - xf * (rstd * rstd * dot))
            tl.store(dx_ptr + r[:, None] * cols + c_offs[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
            acc += dyf * xf * rstd
            x = x_next
            dy = dy_next
        if pid < tiles:
            tl.store(p_row + c_offs, tl.sum(acc, axis=0), mask=c_mask)
    else:
        # A long row in chunks, two passes: pass 1 the row's dot (DRAM), pass 2 the chunks again,
        # last first (the most recently loaded: L1, else L2 hits) for dx and dweight. The
        # partial row is too wide for registers, so pass 2 adds each chunk's sum into this
        # program's own partial row in memory (first tile: stores it): one program reads and
        # writes it, in tile order, so the sum is still fixed.
        chunks = tl.cdiv(cols, CHUNK)
        for tile in range(pid.to(tl.int64), tiles, progs):
            r = tile * ROWS + r_offs
            r_mask = r < rows
            rstd = tl.load(rstd_ptr + r, mask=r_mask, other=0.0)[:, None]
            acc_dot = tl.zeros([ROWS, CHUNK], tl.float32)
            for c0 in range(0, cols, CHUNK):
                c = c0 + c_offs
                mask = r_mask[:, None] & (c < cols)[None, :]
                x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c < cols, other=0.0).to(tl.float32)
                acc_dot += dy * w[None, :] * x
            dot = tl.sum(acc_dot, axis=1)[:, None] / cols
            tl.debug_barrier()  # the last tile's partial stores, by any thread, before this tile's loads
            for k in range(0, chunks):
                c = (chunks - 1 - k) * CHUNK + c_offs
                c_mask = c < cols
                mask = r_mask[:, None] & c_mask[None, :]
                x = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=c_mask, other=0.0).to(tl.float32)
                g = dy * w[None, :]
                dx = rstd * (g - x * (rstd * rstd * dot))
                tl.store(dx_ptr + r[:, None] * cols + c[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
                part = tl.load(p_row + c, mask=c_mask & (tile > pid), other=0.0)
                tl.store(p_row + c, part + tl.sum(dy * x * rstd, axis=0), mask=c_mask)


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
    return triton.autotune(configs=tuned(configs, interpret), key=["cols", "row_class"])(rms_norm_forward_kernel)


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
        rms_norm_backward_kernel)


def launch(x, weight, y, rstd, eps):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    block = next_power_of_2(int(cols))  # int: a traced (symbolic) cols keys the cache too

    def grid(meta):
        return (cdiv(rows, meta["ROWS"]),)

    row_class = int(rows).bit_length()  # with cols, the autotuners' key
    wrap_triton(forward_kernel(block))[grid](x, weight, y, rstd, rows, cols, row_class, x.stride(0), eps, BLOCK=block)


def launch_backward(x, weight, rstd, dy, dx, dweight):
    rows, cols = x.shape
    if cols == 0:
        return
    if rows == 0:
        dweight.zero_()  # a sum over no rows
        return
    block = next_power_of_2(int(cols))  # int: a traced (symbolic) cols keys the caches too
    max_per_sm = partial_per_sm(x.device, int(rows), x.element_size())
    # Partials for the largest grid any config launches; the kernel writes how many it used.
    partial = empty_partials(1, sm_count(x.device) * max_per_sm, cols, x.device)
    count = torch.empty(1, dtype=torch.int32, device=x.device)

    def grid(meta):
        return (sm_count(x.device) * meta["PER_SM"],)

    kernel = backward_kernel(block, max_per_sm, x.element_size() >= 4)
    row_class = int(rows).bit_length()  # with cols, the autotuners' key
    wrap_triton(kernel)[grid](x, weight, rstd, dy, dx, partial, count, rows, cols, row_class, x.stride(0), dy.stride(0),
                              BLOCK=block)
    sum_counted_partials(partial, count, dweight)
