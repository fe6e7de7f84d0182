"""
Step 7 — split-K for small M and K-heavy shapes
Changed:  the K loop of a tile is cut into SPLIT_K slices that run as programs of their own: the
          grid is (tiles, SPLIT_K), and program (t, s) multiplies tile t over K-steps
          [s·k_steps / SPLIT_K, (s+1)·k_steps / SPLIT_K) with step 3's masked pointer loads and
          tl.dot. With one slice it stores the tile as step 4 does; with several, each slice
          stores its fp32 partial tile into a workspace (SPLIT_K x M x N) and a second kernel adds
          the slices in the order 0, 1, 2, ... and converts: the same bits on every run, no
          atomics. Tiles start at BLOCK_M = 16 (tl.dot's least), then 32, 64, 128; the tuner times
          only the tiles whose BLOCK_M fits M's power-of-two bucket and keys on buckets of M, N
          and K (one tuning serves M = 9..16). SPLIT_K is not tuned: the grid computes it from
          the tile the tuner hands it (split_count: the fewest K-steps the busiest SM walks,
          the partials' bytes counted), the kernel reads it back as tl.num_programs(1) and
          leaves it in a 4-byte note for the reduction, so tile, split and reduction always agree.
          The reduction is launched only where a grid the launch evaluated splits; its grid is
          sized to the output (1,024 outputs a program while that gives two programs an SM, down
          to 128), four slices' loads in flight before they are added. Under TRITON_INTERPRET=1
          every shape with two or more K-steps splits into min(k_steps, 4) slices, so the CPU
          tests run the reduction.
Why:      M = 16 against a 4096 x 4096 bf16 weight is 2·16·4096·4096 = 0.54 GFLOP over 33.6 MB
          of B (A and out: 0.13 MB each): 16 flop/byte, where the H100 turns compute-bound at
          ~300 (990 TFLOP/s / 3.35 TB/s). The time is one read of B: 11 us at 3 TB/s, if all
          132 SMs stream it. Steps 4-6 give M = 16 one row of tiles, N / 64 = 64 at most (32 at
          128 wide): half the SMs or more idle and each busy one walks all of K alone (measured
          0.62-0.74x cuBLAS against 4096 x 4096, 4096 x 14336, 14336 x 4096 and 8192 x 28672
          weights). Here, 16 x 128 x 128 tiles: 32 tiles x 4 slices = 128 programs, each
          streaming 8 K-steps (256 KB of B); the fp32 partials, 4·16·4096·4 = 1 MB, are written
          once and read once: 2 MB, 6% of B's bytes. K-heavy fp32, 300 x 8192 x 300:
          2·300·300·8192 = 1.47 GFLOP, FFMA-bound (22 us at 67 TFLOP/s), but 64 x 64 tiles are
          25 programs (128 x 128: 9) for 132 SMs, each walking 256 K-steps (measured 0.22x);
          split 5 ways, 125 programs walk 52 each. Where tiles fill the machine (4096^3: 1,024
          tiles) the rule says 1 and nothing is added. The reduction is a chain of dependent
          adds per output, one L2 round trip (~0.5 us) a slice: with a fixed 1,024 outputs a
          program, 64 x 16384 x 64 (one 64 x 64 tile, 32 slices) gave it 4 programs, 4 SMs each
          walking 32 slices, ~10 us of a 21.5 us call; 32 programs with 4 loads in flight cut
          the chain to 8 round trips. fp32 there (512 K-steps of 32) now takes up to 64 slices,
          not 32: half the walk per GEMM program.
Still:    the reduction is a second launch, ~2-3 us with its kernel boundary: a fifth of an
          11 us call (step 9's in-kernel fix-up, the last slice to finish adding the others,
          saves it), and the tuner times the GEMM kernel without it; the rule counts one program
          per SM at a time (co-resident programs share the SM, roughly); loads are masked
          pointer loads by cp.async, not TMA, and a 16-bit K that is not a multiple of 16 breaks
          their 16-byte vectors and the pipeline (as in steps 2-4); below M = 16 the 16-row
          tile is mostly padding (mma.sync: wgmma's least M is 64), harmless while B's bytes
          set the time.
Limits:   the step is meant for problems of at most two waves of 128 x 128 output tiles on 132
          SMs (`output_tiles <= 264`): larger ones are refused before launch and left to steps
          4-5. The workspace, (most slices any tile could take) x M x N fp32, is allocated
          per call from torch's caching allocator: 2 MB at 16 x 4096 x 4096, 59 MB at
          128 x 8192 x 28672.
Dtypes:   float32, float16, bfloat16
Layout:   any
Max:      output_tiles <= 264
Mirrors:  CUDA step 14 (split-K on WGMMA)
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.ops.matmul import is_column_major
from rosetta.triton_kernels.common import cdiv, next_power_of_2, sm_count
from rosetta.triton_kernels.split_k import (FP32_CONFIGS, HALF_CONFIGS, KEY, m_bucket, partials, slice_product,
                                             slice_rule, tiles_fitting_m)

REDUCE_MOST, REDUCE_LEAST = 1024, 128  # outputs per reduction program: 8 to 1 per thread on 4 warps
REDUCE_PROGRAMS_PER_SM = 2  # the reduction's grid fills the machine before a program takes more outputs


@triton.jit
def matmul_split_k_kernel(
    a_ptr,  # A, M x K, any strides
    b_ptr,  # B, K x N, any strides
    out_ptr,  # out, M x N, unit column stride, same dtype as A: written here when the grid has one slice
    part_ptr,  # float32[slices, M, N] workspace: slice s's partial product (unread with one slice)
    note_ptr,  # int32[1]: the slice count of this launch, for the reduction kernel
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
    s = tl.program_id(1)
    slices = tl.num_programs(1)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    if slices == 1:  # the whole K range: nothing to add up, store as step 4
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=mask)
    else:  # a partial sum, kept in fp32 until the reduction has added every slice
        tl.store(part_ptr + s.to(tl.int64) * stride_ps + rows[:, None] * N + cols[None, :], acc, mask=mask)
    if (tl.program_id(0) == 0) & (s == 0):
        tl.store(note_ptr, slices)


@triton.jit
def split_k_reduce_kernel(
    part_ptr,  # float32[slices, M, N]: the GEMM's partial products
    note_ptr,  # int32[1]: slices the GEMM used; 1 means it wrote out itself and there is nothing to do
    out_ptr,  # out, M x N, unit column stride
    M, N,
    stride_ps,  # the workspace's slice stride, M·N
    stride_om,  # out's row stride
    BLOCK_R: tl.constexpr,  # rows per program: min(8, M), so M = 1 wastes no lanes
    BLOCK_C: tl.constexpr,  # columns per program: BLOCK_R x BLOCK_C outputs (reduce_tile)
):
    slices = tl.load(note_ptr)
    if slices > 1:
        pid = tl.program_id(0)
        num_c = tl.cdiv(N, BLOCK_C)
        rows = (pid // num_c).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = (pid % num_c).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        parts = part_ptr + rows[:, None] * N + cols[None, :]
        acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        # four slices' loads in flight, then added in the order 0, 1, 2, ...: a fixed order of
        # fp32 adds, so every run gives the same bits (a slice past the last adds +0.0)
        for first in range(0, slices, 4):
            p0 = tl.load(parts, mask=mask, other=0.0)
            p1 = tl.load(parts + stride_ps, mask=mask & (first + 1 < slices), other=0.0)
            p2 = tl.load(parts + 2 * stride_ps, mask=mask & (first + 2 < slices), other=0.0)
            p3 = tl.load(parts + 3 * stride_ps, mask=mask & (first + 3 < slices), other=0.0)
            acc += p0
            acc += p1
            acc += p2
            acc += p3
            parts += 4 * stride_ps
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=mask)


# one kernel under two tuners (as step 4): fp32 and 16-bit want different tiles; the tuner's key
# adds the tensor arguments' dtypes, so fp16 and bf16 are tuned apart
PRUNE = {"early_config_prune": tiles_fitting_m}
matmul_split_k_fp32 = triton.autotune(configs=FP32_CONFIGS, key=KEY, prune_configs_by=PRUNE)(matmul_split_k_kernel)
matmul_split_k_half = triton.autotune(configs=HALF_CONFIGS, key=KEY, prune_configs_by=PRUNE)(matmul_split_k_kernel)


def launch(a, b, out, split_k=None):
    """split_k: that many slices (at most one per K-step) for every tile, instead of the rule:
    an ablation (split_k=1 is this step without the split) and a way to force the reduction."""
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    kernel = matmul_split_k_fp32 if a.dtype == torch.float32 else matmul_split_k_half
    sms = sm_count(a.device)
    slices = slice_rule(M, N, K, a.element_size(), sms, split_k)

    part = partials(kernel, a, N, slices)
    most = part.shape[0]  # the most slices any config the tuner may pick could take
    note = torch.empty(1, dtype=torch.int32, device=a.device)
    launched = []  # the split of every grid the launch evaluates (one, on a cached launch)

    def grid(meta):
        split = slices(meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"])
        launched.append(split)
        return cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]), split

    wrap_triton(kernel)[grid](
        a, b, out, part, note, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), part.stride(0),
        m_bucket(M), next_power_of_2(N), next_power_of_2(K), int(is_column_major(b)))
    # The reduction runs where a grid this launch evaluated split K: the launched config's, plus the
    # tuner's candidates on a first launch or every config while torch traces (none evaluated yet:
    # all the configs may). Where the launched tile did not split, it returns at once (the note).
    if max(launched, default=most) > 1:
        block_r, block_c = reduce_tile(M, N, sms)
        wrap_triton(split_k_reduce_kernel)[(cdiv(M, block_r) * cdiv(N, block_c),)](
            part, note, out, M, N, part.stride(0), out.stride(0), BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)


def reduce_tile(M, N, sms):
    """(rows, columns) of out a reduction program adds: min(8, M) rows (M = 1 wastes no lanes),
    and 1,024 outputs in all where that still gives REDUCE_PROGRAMS_PER_SM programs an SM, fewer
    (down to 128) where out is small. Each output's slices are a chain of dependent adds, so a
    small out wants many programs, not few long ones: 64 x 64 in 4 programs of 1,024 left 128 SMs
    idle while 4 walked every slice."""
    block_r = min(8, next_power_of_2(M))
    elements = REDUCE_MOST
    while elements > REDUCE_LEAST and M * N < elements * REDUCE_PROGRAMS_PER_SM * sms:
        elements //= 2
    return block_r, max(elements // block_r, 1)
