"""
Step 2 — causal tile skipping, mask only where needed, tiles tuned per head_dim
Changed:  each program splits its loop in two: the blocks that need no mask (inside the sequence
          and, if causal, entirely at or below the diagonal for every row of the tile) run
          without the compare-and-select, and only the diagonal blocks and the ragged tail pay
          for it (the tutorial's STAGE split); causal loops stop at the diagonal in all three
          kernels (forward, dK/dV, dQ). Causal query blocks are issued last-first within a
          head, so the longest key loops start first and the grid ends on short programs.
          BLOCK_M/BLOCK_N, num_warps and num_stages are autotuned per (Sq, Sk, causal), one
          config list per head_dim (BLOCK_M up to 128, 8 warps for D = 128). A forward tile may
          fold the softmax scale into the exponent (FOLD: max on raw scores, then P = exp2(k s -
          m), one FFMA a score, as CUDA step 4 does), where that tile measured faster. Tiles
          inside a head are addressed with 32-bit row offsets where the host finds that they fit
          (ROWS32, as Flex's loads are; 64-bit otherwise).
Why:      step 1 skips the blocks above the diagonal but masks every block it visits: an
          iota, 2 compares and a select per score on the CUDA cores, whose softmax work (scale,
          max, exp2, sum, convert) already bounds FA2 beside 4·D = 512 tensor-core FLOPs per
          score. Split, a 128-query tile at Sk = 4096 and BLOCK_N = 64 masks 3 of its <= 64 key
          blocks. A 128-row query tile halves K/V traffic per FLOP against 64 rows (4·128·128
          FLOP per 512 B of K/V per key at D = 128) and fills a whole wgmma per warpgroup; the
          backward's tuned key blocks (128 keys x 64 queries) double step 1's reuse of q, dO.
          Measured (H200, bf16, 4 x 16 x 4096^2, D = 128, TFLOP/s, step 1 -> 2): forward
          404 -> 464, causal 350 -> 368; backward 187 -> 369, causal 174 -> 312 (SDPA's flash:
          343 / 306 forward, 523 / 455 backward). 64-bit row offsets cost ~50 integer
          instructions of the ~400 in the D = 128 forward loop (SASS: 405 -> 383 with ROWS32).
Still:    q, k and v tiles are loaded with pointer arithmetic by all warps; every program pays
          its own prologue and the grid is sized by the work, not the machine. Step 3 loads
          through TMA descriptors with a persistent schedule. The backward stays ~30% behind
          FA2's CUDA kernels (dK/dV holds k, v, dk, dv: 255 registers, spills at 64 x 128).
Limits:   none (as step 1). The first call per (Sq, Sk, causal, head_dim, dtype) runs the
          autotuner over the configs, forward and backward.
Dtypes:   bfloat16, float16
Layout:   rows
Mirrors:  CUDA step 03 (FA2 on mma.sync) with its causal early exit and tile choice; the
          WGMMA steps' 128-row tiles
"""
import functools

import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.attention_common import (LOG2E, attend_keys, backward_delta, check_inputs,
                                                     dkdv_over_queries, dq_over_keys, head_base, head_strides,
                                                     load_lse2, load_rows, row_offsets_fit_32)
from rosetta.triton_kernels.common import cdiv, quick_bench, tuned


def config(bm, bn, warps, stages, fold=None):
    """A tile; a forward tile also says whether it folds the scale into the exponent (FOLD)."""
    flags = {} if fold is None else {"FOLD": bool(fold)}
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, **flags}, num_warps=warps, num_stages=stages)


INTERPRET_TILE, INTERPRET_FORWARD_TILE = (64, 64, 4, 1), (64, 64, 4, 1, 1)
# forward (BLOCK_M queries per program, BLOCK_N keys per step, FOLD). D = 128: the 128 x 128 fp32
# accumulator is 128 registers a thread on 4 warps, so 128-row tiles take 8 (128 x 64 on 4 warps
# spilled 16-38 B under ptxas and ran 22% slower on H200). FOLD per tile, as measured by
# bench/ablations/attention_triton_fold.py (its log in results/<gpu>/): with 64-bit row offsets the
# fold lost on 128 x 64 at D = 128 (ptxas scheduled that folded loop worse); with ROWS32 it gains
# on every tile, so every tile folds.
FORWARD_CONFIGS = {
    64: [(128, 128, 8, 3, 1), (128, 64, 4, 3, 1), (128, 64, 8, 4, 1), (64, 64, 4, 4, 1), (128, 32, 4, 4, 1)],
    128: [(128, 64, 8, 3, 1), (128, 128, 8, 2, 1), (64, 64, 4, 3, 1), (128, 32, 8, 4, 1)],
}
# dK/dV (BLOCK_M queries per step, BLOCK_N keys per program): k, v, dk, dv are held per program
# (2 x BLOCK_N x D in 16-bit + 2 x BLOCK_N x D in fp32), so the key block is the large side.
DKDV_CONFIGS = {
    64: [(32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3), (16, 128, 4, 4)],
    128: [(32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 8, 3), (16, 64, 4, 4)],
}
# dQ (BLOCK_M queries per program, BLOCK_N keys per step): q, dO and dq are held per program.
DQ_CONFIGS = {
    64: [(128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 4), (128, 16, 4, 4)],
    128: [(128, 32, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 16, 4, 4)],
}
KEY = ["Sq", "Sk", "CAUSAL", "HEAD_DIM"]  # and the tensors' dtypes (the autotuner adds them)


@triton.jit
def key_ranges(start_m, Sk, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """For the query rows [start_m, start_m + BLOCK_M): key blocks [0, mid) need no mask (whole
    blocks inside Sk and, causal, with every key j <= start_m, the tile's first row); [mid, hi)
    holds the diagonal blocks and the ragged tail. hi stops causal loops at the last row."""
    full_n = (Sk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        mid = tl.minimum((start_m + 1) // BLOCK_N * BLOCK_N, full_n)
        hi = tl.minimum(Sk, start_m + BLOCK_M)
    else:
        mid = full_n
        hi = Sk
    return mid, hi


@triton.jit
def query_block(pid, num_m, CAUSAL: tl.constexpr):
    """(batch x head, query block) of program pid: a head's query blocks are neighbours (they
    share K and V through L2); causal ones run last-first, the longest loops first."""
    bh = pid // num_m
    block = pid % num_m
    if CAUSAL:
        block = num_m - 1 - block
    return bh, block


@triton.jit
def attention_causal_kernel(
    q_ptr,  # (B, H, Sq, D), unit last stride, any other strides
    k_ptr,  # (B, H, Sk, D), likewise
    v_ptr,  # (B, H, Sk, D), likewise
    out_ptr,  # (B, H, Sq, D) contiguous, q's dtype
    lse_ptr,  # fp32 (B, H, Sq) contiguous, natural log
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    H, Sq, Sk,
    qk_scale,  # scale * log2(e)
    CAUSAL: tl.constexpr,
    POSITIVE_SCALE: tl.constexpr,  # qk_scale > 0: FOLD may apply
    FOLD: tl.constexpr,  # the tile folds the scale into exp2's FFMA (attend_keys), where it may
    ROWS32: tl.constexpr,  # row offsets inside a head fit 32 bits (load_tile)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh, block = query_block(tl.program_id(0), tl.cdiv(Sq, BLOCK_M), CAUSAL)
    start_m = block * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = load_rows(head_base(q_ptr, bh, H, stride_qb, stride_qh), offs_m, stride_qs, offs_d, Sq, True)
    k_base = head_base(k_ptr, bh, H, stride_kb, stride_kh)
    v_base = head_base(v_ptr, bh, H, stride_vb, stride_vh)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    mid, hi = key_ranges(start_m, Sk, CAUSAL, BLOCK_M, BLOCK_N)
    # the first block processed holds key 0, visible to every row: m is finite from there on
    acc, l_i, m_i = attend_keys(acc, l_i, m_i, q, offs_m, k_base, v_base, 0, 0, stride_ks, stride_vs, 0, mid, Sk,
                                qk_scale, CAUSAL, False, False, BLOCK_N, HEAD_DIM, FOLD and POSITIVE_SCALE, ROWS32)
    acc, l_i, m_i = attend_keys(acc, l_i, m_i, q, offs_m, k_base, v_base, 0, 0, stride_ks, stride_vs, mid, hi, Sk,
                                qk_scale, CAUSAL, True, False, BLOCK_N, HEAD_DIM, FOLD and POSITIVE_SCALE, ROWS32)
    row = bh.to(tl.int64) * Sq + offs_m  # out and lse are contiguous
    tl.store(out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Sq)
    tl.store(lse_ptr + row, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=offs_m < Sq)  # base 2 -> e


@triton.jit
def attention_causal_dkdv_kernel(
    q_ptr, k_ptr, v_ptr,  # as the forward
    do_ptr,  # dO, (B, H, Sq, D), unit last stride
    lse_ptr,  # fp32 (B, H, Sq), unit last stride, natural log, from the forward
    delta_ptr,  # fp32 (B, H, Sq) contiguous: rowsum(dO O)
    dk_ptr, dv_ptr,  # (B, H, Sk, D) contiguous, q's dtype
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_lb, stride_lh,  # lse's batch and head strides
    H, Sq, Sk,
    qk_scale, scale,
    CAUSAL: tl.constexpr,
    ROWS32: tl.constexpr,  # as the forward's
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per loop step
    BLOCK_N: tl.constexpr,  # keys per program
):
    # natural order: causal key blocks near 0 see the most queries, and they start first
    num_n = tl.cdiv(Sk, BLOCK_N)
    pid = tl.program_id(0)
    bh = pid // num_n
    start_n = (pid % num_n) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k = load_rows(head_base(k_ptr, bh, H, stride_kb, stride_kh), offs_n, stride_ks, offs_d, Sk, True)
    v = load_rows(head_base(v_ptr, bh, H, stride_vb, stride_vh), offs_n, stride_vs, offs_d, Sk, True)
    q_base = head_base(q_ptr, bh, H, stride_qb, stride_qh)
    do_base = head_base(do_ptr, bh, H, stride_dob, stride_doh)
    lse_bh = head_base(lse_ptr, bh, H, stride_lb, stride_lh)
    delta_bh = delta_ptr + bh.to(tl.int64) * Sq
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # Query blocks: [lo, mid) cross the diagonal (masked), [mid, full_m) see every key of the
    # block and lie inside Sq (no mask), [max(mid, full_m), Sq) is the ragged tail (masked).
    full_m = (Sq // BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = start_n // BLOCK_M * BLOCK_M  # the block holding query start_n: earlier rows see no key here
        mid = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, tl.cdiv(Sq, BLOCK_M) * BLOCK_M)
    else:
        lo = 0
        mid = 0
    dk, dv = dkdv_over_queries(dk, dv, k, v, offs_n, q_base, do_base, 0, 0, lse_bh, delta_bh, stride_qs, stride_dos,
                               lo, mid, Sq, qk_scale, CAUSAL, True, False, BLOCK_M, HEAD_DIM, ROWS32)
    dk, dv = dkdv_over_queries(dk, dv, k, v, offs_n, q_base, do_base, 0, 0, lse_bh, delta_bh, stride_qs, stride_dos,
                               mid, full_m, Sq, qk_scale, CAUSAL, False, False, BLOCK_M, HEAD_DIM, ROWS32)
    dk, dv = dkdv_over_queries(dk, dv, k, v, offs_n, q_base, do_base, 0, 0, lse_bh, delta_bh, stride_qs, stride_dos,
                               tl.maximum(mid, full_m), Sq, Sq, qk_scale, CAUSAL, True, False, BLOCK_M, HEAD_DIM, ROWS32)
    row = bh.to(tl.int64) * Sk + offs_n  # dk and dv are contiguous
    mask = offs_n[:, None] < Sk
    tl.store(dk_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], (dk * scale).to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], dv.to(dv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def attention_causal_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,  # as attention_causal_dkdv_kernel
    dq_ptr,  # (B, H, Sq, D) contiguous, q's dtype
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_lb, stride_lh,  # lse's batch and head strides
    H, Sq, Sk,
    qk_scale, scale,
    CAUSAL: tl.constexpr,
    ROWS32: tl.constexpr,  # as the forward's
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per loop step
):
    bh, block = query_block(tl.program_id(0), tl.cdiv(Sq, BLOCK_M), CAUSAL)
    start_m = block * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = load_rows(head_base(q_ptr, bh, H, stride_qb, stride_qh), offs_m, stride_qs, offs_d, Sq, True)
    do = load_rows(head_base(do_ptr, bh, H, stride_dob, stride_doh), offs_m, stride_dos, offs_d, Sq, True)
    row = bh.to(tl.int64) * Sq + offs_m  # delta and dq are contiguous
    # padded rows: lse 0 and delta 0 with q = dO = 0 give dS = 0 (and are not stored)
    lse2 = load_lse2(head_base(lse_ptr, bh, H, stride_lb, stride_lh), offs_m, Sq, True)
    delta = tl.load(delta_ptr + row, mask=offs_m < Sq, other=0.0)
    k_base = head_base(k_ptr, bh, H, stride_kb, stride_kh)
    v_base = head_base(v_ptr, bh, H, stride_vb, stride_vh)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    mid, hi = key_ranges(start_m, Sk, CAUSAL, BLOCK_M, BLOCK_N)
    dq = dq_over_keys(dq, q, do, lse2, delta, offs_m, k_base, v_base, 0, 0, stride_ks, stride_vs, 0, mid, Sk, qk_scale,
                      CAUSAL, False, False, BLOCK_N, HEAD_DIM, ROWS32)
    dq = dq_over_keys(dq, q, do, lse2, delta, offs_m, k_base, v_base, 0, 0, stride_ks, stride_vs, mid, hi, Sk, qk_scale,
                      CAUSAL, True, False, BLOCK_N, HEAD_DIM, ROWS32)
    tl.store(dq_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Sq)


# One autotuner per head_dim and kernel, each with that head_dim's configs; built on first use.
@functools.cache
def tuned_kernel(kernel, head_dim):
    table = {attention_causal_kernel: FORWARD_CONFIGS, attention_causal_dkdv_kernel: DKDV_CONFIGS,
             attention_causal_dq_kernel: DQ_CONFIGS}[kernel]
    interpret = INTERPRET_FORWARD_TILE if kernel is attention_causal_kernel else INTERPRET_TILE
    configs = tuned([config(*c) for c in table[head_dim]], config(*interpret))
    return triton.autotune(configs=configs, key=KEY, do_bench=quick_bench)(kernel)


def launch(q, k, v, out, lse, causal, scale):
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    if B * H * Sq == 0:
        return
    check_inputs("attention step 2", q, k, v)
    grid = lambda meta: (B * H * cdiv(Sq, meta["BLOCK_M"]),)  # noqa: E731
    wrap_triton(tuned_kernel(attention_causal_kernel, D))[grid](
        q, k, v, out, lse, *head_strides(q), *head_strides(k), *head_strides(v), H, Sq, Sk, scale * LOG2E,
        CAUSAL=bool(causal), POSITIVE_SCALE=bool(scale > 0), ROWS32=row_offsets_fit_32(q, k, v), HEAD_DIM=D)


def launch_backward(q, k, v, out, lse, dout, dq, dk, dv, causal, scale):
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    if B * H * Sk == 0:
        return
    if Sq == 0:
        dk.zero_()  # sums over no queries
        dv.zero_()
        return
    check_inputs("attention step 2", q, k, v, out, lse, dout)
    delta = backward_delta(out, dout)
    args = (*head_strides(q), *head_strides(k), *head_strides(v), *head_strides(dout), *lse.stride()[:2], H, Sq, Sk, scale * LOG2E, scale)
    rows32 = row_offsets_fit_32(q, k, v, dout)
    grid_n = lambda meta: (B * H * cdiv(Sk, meta["BLOCK_N"]),)  # noqa: E731
    wrap_triton(tuned_kernel(attention_causal_dkdv_kernel, D))[grid_n](
        q, k, v, dout, lse, delta, dk, dv, *args, CAUSAL=bool(causal), ROWS32=rows32, HEAD_DIM=D)
    grid_m = lambda meta: (B * H * cdiv(Sq, meta["BLOCK_M"]),)  # noqa: E731
    wrap_triton(tuned_kernel(attention_causal_dq_kernel, D))[grid_m](
        q, k, v, dout, lse, delta, dq, *args, CAUSAL=bool(causal), ROWS32=rows32, HEAD_DIM=D)
