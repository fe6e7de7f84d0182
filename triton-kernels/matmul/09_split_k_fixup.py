"""
Step 9 — split-K with the fix-up in the kernel: the last slice of a tile adds the others
Changed:  step 7's tiles, tuner and split rule (split_k.py), one kernel instead of two. Every
          program (t, s) of a split tile stores its fp32 partial, then takes a ticket on tile t's
          counter (tl.atomic_add, acq_rel at GPU scope, after a barrier, as step 8); the program
          that draws the last ticket reads the S partials back from L2 and adds them in the order
          0, 1, 2, ... (a slice at a time), converts and stores the tile: whichever slice comes last,
          the same adds in the same order, the same bits as step 7. That program then resets the
          counter to zero. The counters (triton_launch.tickets) are one buffer per device and stream,
          zeroed once when made: launches on a stream run one after another, so each finds them
          zero, and no call zeroes them (a memset would be a launch of its own). While torch
          traces, a fresh zeroed buffer stands in, which the traced graph zeroes on every run.
Why:      step 7's reduction is a second launch: ~2-3 us of an 8-20 us call at small M (the kernel
          boundary, then a grid that reads every partial once). Here the adds run where the
          partials already are, in L2, right after the last slice, and only on split tiles. At
          16 x 768 x 3072 (16 x 128 x 128 tiles, 24 tiles x 2-4 slices) the last program of a
          tile reads 2-4 partials of 8 KB: one round trip of four loads in flight, ~1 us, where
          step 7 paid a launch.
Still:    the fix-up runs on one program per tile, after its own slice: with many slices a tile (64
          x 16384 x 64: one tile, 32 slices) one SM adds 32 partials in 8 dependent rounds where
          step 7's reduction spreads them over the machine, as CUDA step 17 found. The split rule is
          step 7's, which charges each split for a second launch it no longer pays. A CUDA graph
          holds the buffer of the stream it was captured on: two replays of graphs captured on one
          stream must not run at the same time on two streams. The tile the tuner picks is not the
          gap to cuBLAS at mid-size M: each candidate timed alone at eight shapes, both steps, the
          tuner's do_bench (a zeroing flush, whose write-back lands in the timed kernel: a median
          2.7 us more a time, up to 54) picked a config within 2.4% of the best by the bench's own
          timing
          (bench/ablations/matmul_triton_tuner.py); at 128 x 4096 x 4096 the three candidates ran
          23.0-23.4 us.
Limits:   as step 7: problems of at most two waves of 128 x 128 output tiles on 132 SMs
          (`output_tiles <= 264`); larger ones are refused before launch. The workspace for the
          partials as step 7's; the counters are one int32 per output tile (at least 4,096).
Dtypes:   float32, float16, bfloat16
Layout:   any
Max:      output_tiles <= 264
Mirrors:  CUDA step 17 (stream-K: shared tiles added in the kernel behind a counter)
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.ops.matmul import is_column_major
from rosetta.triton_launch import tickets  # counters the kernel leaves at zero: one buffer per stream
from rosetta.triton_kernels.common import cdiv, next_power_of_2, sm_count
from rosetta.triton_kernels.split_k import (FP32_CONFIGS, HALF_CONFIGS, KEY, candidate_configs, m_bucket, partials,
                                             slice_product, slice_rule, tiles_fitting_m)


@triton.jit
def matmul_split_k_fixup_kernel(
    a_ptr,  # A, M x K, any strides
    b_ptr,  # B, K x N, any strides
    out_ptr,  # out, M x N, unit column stride, same dtype as A
    part_ptr,  # float32[slices, M, N] workspace: slice s's partial product (unused with one slice)
    ticket_ptr,  # int32[tiles]: per tile, the slices done so far; zero at the start, left zero
    M, N, K,
    stride_am, stride_ak,  # A's strides in elements
    stride_bk, stride_bn,  # B's strides in elements
    stride_om,  # out's row stride (its column stride is 1)
    stride_ps,  # the workspace's slice stride, M·N (its rows are N long)
    M_KEY, N_KEY, K_KEY, B_COLS,  # the autotuner's key only: buckets of M, N, K and B's major-ness
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    acc, rows, cols = slice_product(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                    BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    tile = tl.program_id(0)
    s = tl.program_id(1)
    slices = tl.num_programs(1)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    if slices == 1:  # the whole K range: nothing to add up, store as step 4
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        parts = part_ptr + rows[:, None] * N + cols[None, :]
        tl.store(parts + s.to(tl.int64) * stride_ps, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is stored before the ticket below releases them
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == slices - 1:  # the last slice of this tile: every other partial is in L2
            # Added in the order 0, 1, 2, ... as step 7's reduction does (the same bits), one slice
            # at a time: a whole tile's loads are already several vectors a thread in flight, and
            # a tile per slice in registers at once would spill beside the GEMM's (acc, now dead).
            # From L2 (.cg): other programs wrote them during this launch; no stale L1 line.
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in range(0, slices):
                total += tl.load(parts + j * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            # every slice of the tile has drawn its ticket: reset the counter for the next launch
            tl.store(ticket_ptr + tile, 0)


# one kernel under two tuners (as steps 4 and 7): fp32 and 16-bit want different tiles
PRUNE = {"early_config_prune": tiles_fitting_m}
matmul_fixup_fp32 = triton.autotune(configs=FP32_CONFIGS, key=KEY, prune_configs_by=PRUNE)(matmul_split_k_fixup_kernel)
matmul_fixup_half = triton.autotune(configs=HALF_CONFIGS, key=KEY, prune_configs_by=PRUNE)(matmul_split_k_fixup_kernel)


def launch(a, b, out, split_k=None):
    """split_k: that many slices (at most one per K-step) for every tile, instead of the rule (as
    step 7: an ablation, and a way to force the fix-up)."""
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    kernel = matmul_fixup_fp32 if a.dtype == torch.float32 else matmul_fixup_half
    sms = sm_count(a.device)
    slices = slice_rule(M, N, K, a.element_size(), sms, split_k)

    part = partials(kernel, a, N, slices)  # as step 7's
    # the counters: one a tile of the smallest tile any config the tuner may pick could launch
    tiles = max(cdiv(M, c.kwargs["BLOCK_M"]) * cdiv(N, c.kwargs["BLOCK_N"]) for c in candidate_configs(kernel, M))
    counters = tickets(a, tiles)

    def grid(meta):
        return (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),
                slices(meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]))

    wrap_triton(kernel)[grid](
        a, b, out, part, counters, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), part.stride(0),
        m_bucket(M), next_power_of_2(N), next_power_of_2(K), int(is_column_major(b)))
