"""
Step 11 — M = 1: a GEMV over 2-D tiles of B, each program's column sums reduced once at its end
Changed:  step 8's stream of B's rows, rewritten for one row of A. A program owns a strip of
          BLOCK_N columns (256 bytes of a row: 16 threads x 16 bytes) and a slice of K, and loads
          B in tiles of 64 rows x BLOCK_N (16 KB, 8 vector loads a thread in flight) beside the
          tile's 64 values of a (8 a thread, L1 hits after the first strip). acc, a
          64 x BLOCK_N fp32 tile laid out as the loaded tile is, takes a[k] x b[k, n] by
          elementwise FMAs: no shuffle, no shared memory inside the loop. Only after the slice
          does one tl.sum over acc's rows (a cross-warp reduction, once) give the strip's sums.
          The split aims at 4 programs an SM (528: at 4096 columns 32 strips x 16 slices);
          slices are whole tiles. Split strips meet as in step 9: each slice stores its fp32
          partial row, takes a ticket (acq_rel, after a barrier), and the last adds the partials
          in the order 0, 1, 2, ... (8 loads in flight, from L2), stores, and resets the ticket
          (triton_launch.tickets: zero counters kept per stream, no memset launch).
Why:      step 8 walks B a row at a time, each row an (M_PAD, 1) column of A built from scalar
          loads and a rank-1 update; its wide strips (1,024 columns at bf16) leave 4 strips at
          N = 4096, so K is split 128 ways and 4 programs add 128 partials each, one after
          another: 31.5 us at 1 x 4096 x 4096 bf16 against step 9's 17.8 (shape suite). Here a
          strip is 128 columns (32 at 4096), the split is 16, and each last program adds 16
          partials of 512 bytes. The tile form keeps Triton's natural 2-D layout: the loads come
          out as ld.global.v4 (PTX, sm_90) and the multiply as one FMA an element.
          M = 1 only: with M rows the tile would be (M, 64, BLOCK_N), and for that 3-D product
          Triton 3.6 chose a layout of one element a thread: B's 16-byte rows then load 2 bytes
          at a time (ld.global.b16 in the PTX). M = 2-8 stay with steps 7-9's tl.dot.
Still:    slower than the best earlier step on all six M = 1 cases of the bf16 suite (run
          ffa3211c19e4): 1-4% behind on the four long products (N or K of 14,336 and up, where each
          program streams a long slice), 8% behind step 9's split tl.dot at 1 x 4096 x 4096 and 20%
          at 1 x 768 x 3072, the shapes it was written for. Those are short slices, a few tiles a
          program: the inner loop is the same bytes either way, so what is left is each program's
          fixed cost (its first DRAM round trip, then the last slice's round trip for the partials),
          not measured apart here. Its one lead is an odd row: 1 x 997 x 1013 bf16 in turns
          (bench/ablations/matmul_triton_gemv.py) 8.6 us against step 7's 14.1, step 9's 14.8 and
          cuBLAS's 8.0; B's 2,026-byte rows cost the tl.dot steps their vector loads and pipeline,
          while this loop keeps 64 rows in flight even at 2 bytes a load. The suite has no odd
          one-row case, so step=None never sees it. One row only; a column-major B (a weight (out,
          in) used as W.t()) would need the dot-product form and is refused, left to steps 4-7.
Limits:   M = 1 (`m_rows`), B row-major (`b_column_major`): others are refused before launch.
          A and B need their last stride 1 (the dispatcher copies A otherwise). Workspace: the
          partials, slices x N fp32 (at most 64 x N), where K is split.
Dtypes:   float32, float16, bfloat16
Layout:   rows
Max:      m_rows <= 1; b_column_major <= 0
Mirrors:  CUDA step 15 (GEMV-style small M, the in-kernel fix-up behind a ticket)
Slower:   than the best earlier step on the six one-row bf16 suite cases measured on the H100,
          two of them within 1.5% (a lesson, not a default)
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_launch import tickets  # counters the kernel leaves at zero: one buffer per stream
from rosetta.triton_kernels.common import INTERPRET, cdiv, sm_count

NUM_WARPS = 4
ROW_BYTES = 256  # bytes of a B row a program owns: 16 threads x 16 bytes
BLOCK_K = 64  # rows of a tile: 64 x 256 bytes = 16 KB of loads in flight a program
PROGRAMS_PER_SM = 4
MAX_SPLIT = 64  # partials a strip adds at most (8 rounds of 8 loads)
INTERPRET_SPLIT = 3  # under the interpreter: split whenever K allows, so the CPU tests run the fix-up


@triton.jit
def gemv_tiles_kernel(
    a_ptr,  # A, 1 x K, unit stride
    b_ptr,  # B, K x N, unit column stride
    out_ptr,  # out, 1 x N
    part_ptr,  # float32[slices, N]: slice z's partial row (unused with one slice)
    ticket_ptr,  # int32[strips]: per strip, the slices done so far; zero at the start, left zero
    N, K,
    stride_bk,  # B's row stride in elements
    SLICE,  # rows of K a program takes (the last slice may have fewer)
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    strip = tl.program_id(0)
    z = tl.program_id(1)
    splits = tl.num_programs(1)
    cols = strip * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    k_begin = z * SLICE
    k_end = tl.minimum(K, k_begin + SLICE)
    acc = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_end
        b = tl.load(b_ptr + k.to(tl.int64)[:, None] * stride_bk + cols[None, :],
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0, eviction_policy="evict_first")
        a = tl.load(a_ptr + k, mask=k_ok, other=0.0)
        acc += a.to(tl.float32)[:, None] * b.to(tl.float32)  # padded rows add 0 x 0
    sums = tl.sum(acc, axis=0)  # the slice's column sums: the one cross-warp reduction
    if splits == 1:
        tl.store(out_ptr + cols, sums.to(out_ptr.dtype.element_ty), mask=col_ok)
    else:
        parts = part_ptr + cols
        tl.store(parts + z.to(tl.int64) * N, sums, mask=col_ok)
        tl.debug_barrier()  # every thread's partial is stored before the ticket below releases them
        ticket = tl.atomic_add(ticket_ptr + strip, 1, sem="acq_rel", scope="gpu")
        if ticket == splits - 1:  # the last slice of this strip: every other partial is in L2
            total = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for s0 in range(0, splits, 8):  # eight slices' loads in flight, added in order
                for u in tl.static_range(8):
                    s = s0 + u
                    total += tl.load(parts + s.to(tl.int64) * N, mask=col_ok & (s < splits), other=0.0,
                                     cache_modifier=".cg")
            tl.store(out_ptr + cols, total.to(out_ptr.dtype.element_ty), mask=col_ok)
            tl.store(ticket_ptr + strip, 0)  # every slice has drawn its ticket: zero for the next launch


def split_rows(strips: int, K: int, sms: int) -> int:
    """Rows of K a slice takes: whole tiles, ~PROGRAMS_PER_SM programs an SM, <= MAX_SPLIT slices."""
    k_tiles = cdiv(K, BLOCK_K)
    if INTERPRET:
        return max(1, cdiv(K, INTERPRET_SPLIT))
    split = max(1, min(PROGRAMS_PER_SM * sms // strips, k_tiles, MAX_SPLIT))
    return max(1, cdiv(k_tiles, split)) * BLOCK_K


def launch(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    block_n = ROW_BYTES // a.element_size()
    strips = cdiv(N, block_n)
    slice_rows = split_rows(strips, K, sm_count(a.device))
    split = max(1, cdiv(K, slice_rows))  # no empty slice; K = 0: one, which stores zeros
    part = torch.empty((split, N) if split > 1 else (1,), dtype=torch.float32, device=a.device)
    counters = tickets(a, strips)
    wrap_triton(gemv_tiles_kernel)[(strips, split)](a, b, out, part, counters, N, K, b.stride(0), slice_rows,
                                                    BLOCK_K=BLOCK_K, BLOCK_N=block_n, num_warps=NUM_WARPS)
