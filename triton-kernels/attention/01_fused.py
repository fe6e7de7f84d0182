"""
Step 1 — fused attention: online softmax over key blocks, S and P never leave the chip
Changed:  the starting point (the Triton tutorial's shape): one program per (query block of 64,
          batch x head) keeps its q tile, a running max m, sum l and a 64 x D fp32 accumulator in
          registers and loops over 64-key blocks: S = q k^T and acc += P v on tensor cores
          (tl.dot), acc rescaled by exp2(m_old - m_new) when m grows; out = acc / l and
          lse = ln(l) + m at the end. Every block pays the mask (ragged Sk tail, causal j > i);
          causal programs stop their key loop at their last query. Backward (FA2): delta =
          rowsum(dO O) per row, then one program per 64-key block loops over query blocks
          (P^T recomputed from lse, dV += P^T dO, dK += dS^T q) and a second kernel per 64-query
          block loops over key blocks (dQ += dS k): no atomics, deterministic.
Why:      unfused, S and P are Sq x Sk per head (4,096^2 x 4 B = 64 MB written and read back per
          head); fused, a query block of 64 x D=128 reads the Sk x 128 K and V tiles once
          (2 x Sk x 128 x 2 B = 512 B per key) for 4 x 64 x 128 = 32 KFLOP per key: 64 FLOP/B,
          served by L2 (a head's Sq/64 query blocks are neighbours in program order), so HBM
          moves about the minimal q, k, v, out (+lse); the tensor cores and the softmax's exp2
          bound the kernel.
Still:    fixed 64 x 64 tiles for every D and causal flag; causal programs run the mask on
          every block below the diagonal (most need none), and the query blocks near Sq (the
          longest causal loops) start last. H200, bf16, 4 x 16 x 4096^2, D = 128: forward ~400
          TFLOP/s (causal 350), backward 187 (causal 174): a 64-key program reuses each q, dO
          tile it loads for 64 keys only. Step 2 tunes the tiles, masks only the diagonal and
          the Sk tail, and starts the long programs first.
Limits:   none (any Sq, Sk >= 1, any batch/head/row strides; 64-bit offsets).
Dtypes:   bfloat16, float16
Layout:   rows
Mirrors:  CUDA steps 02 (online softmax, the FA1 fusion) and 03 (FA2 loop order on tensor cores:
          mma.sync from shared memory); Triton's tl.dot stands for the mma.sync/ldmatrix code
"""
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.attention_common import (LOG2E, attend_keys, backward_delta, check_inputs,
                                                     dkdv_over_queries, dq_over_keys, head_base, head_strides,
                                                     load_lse2, load_rows)
from rosetta.triton_kernels.common import cdiv

BLOCK_M = 64  # queries per program
BLOCK_N = 64  # keys per loop step
NUM_WARPS = 4  # forward; the backward holds twice the tiles (k, v, dk, dv) and takes 8


@triton.jit
def attention_fused_kernel(
    q_ptr,  # (B, H, Sq, D), unit last stride, any other strides
    k_ptr,  # (B, H, Sk, D), likewise
    v_ptr,  # (B, H, Sk, D), likewise
    out_ptr,  # (B, H, Sq, D) contiguous, q's dtype
    lse_ptr,  # fp32 (B, H, Sq) contiguous: natural-log log-sum-exp of the scaled scores
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    H, Sq, Sk,
    qk_scale,  # scale * log2(e): scores in base 2
    CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # query blocks of one head are neighbours in program order: they share K and V through L2
    num_m = tl.cdiv(Sq, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // num_m
    offs_m = (pid % num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = load_rows(head_base(q_ptr, bh, H, stride_qb, stride_qh), offs_m, stride_qs, offs_d, Sq, True)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # causal: keys past the block's last query are masked for all its rows; stop there
    hi = tl.minimum(Sk, (pid % num_m + 1) * BLOCK_M) if CAUSAL else Sk
    acc, l_i, m_i = attend_keys(acc, l_i, m_i, q, offs_m, head_base(k_ptr, bh, H, stride_kb, stride_kh),
                                head_base(v_ptr, bh, H, stride_vb, stride_vh), 0, 0, stride_ks, stride_vs, 0, hi, Sk,
                                qk_scale, CAUSAL, True, False, BLOCK_N, HEAD_DIM)
    row = bh.to(tl.int64) * Sq + offs_m  # out and lse are contiguous
    tl.store(out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Sq)
    tl.store(lse_ptr + row, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=offs_m < Sq)  # base 2 -> e


@triton.jit
def attention_dkdv_kernel(
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
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per loop step
    BLOCK_N: tl.constexpr,  # keys per program
):
    num_n = tl.cdiv(Sk, BLOCK_N)
    pid = tl.program_id(0)
    bh = pid // num_n
    start_n = (pid % num_n) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k = load_rows(head_base(k_ptr, bh, H, stride_kb, stride_kh), offs_n, stride_ks, offs_d, Sk, True)
    v = load_rows(head_base(v_ptr, bh, H, stride_vb, stride_vh), offs_n, stride_vs, offs_d, Sk, True)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # causal: queries before the block's first key see none of it; start at the block holding it
    lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
    q_base = head_base(q_ptr, bh, H, stride_qb, stride_qh)
    do_base = head_base(do_ptr, bh, H, stride_dob, stride_doh)
    lse_bh = head_base(lse_ptr, bh, H, stride_lb, stride_lh)
    delta_bh = delta_ptr + bh.to(tl.int64) * Sq
    # (0, 0: descriptor coordinates, unused with pointers; True: mask every block; False: no TMA)
    dk, dv = dkdv_over_queries(dk, dv, k, v, offs_n, q_base, do_base, 0, 0, lse_bh, delta_bh, stride_qs, stride_dos,
                               lo, Sq, Sq, qk_scale, CAUSAL, True, False, BLOCK_M, HEAD_DIM)
    row = bh.to(tl.int64) * Sk + offs_n  # dk and dv are contiguous
    mask = offs_n[:, None] < Sk
    tl.store(dk_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], (dk * scale).to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], dv.to(dv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def attention_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr,  # as attention_dkdv_kernel
    dq_ptr,  # (B, H, Sq, D) contiguous, q's dtype
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos,
    stride_lb, stride_lh,  # lse's batch and head strides
    H, Sq, Sk,
    qk_scale, scale,
    CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per loop step
):
    num_m = tl.cdiv(Sq, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // num_m
    offs_m = (pid % num_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = load_rows(head_base(q_ptr, bh, H, stride_qb, stride_qh), offs_m, stride_qs, offs_d, Sq, True)
    do = load_rows(head_base(do_ptr, bh, H, stride_dob, stride_doh), offs_m, stride_dos, offs_d, Sq, True)
    row = bh.to(tl.int64) * Sq + offs_m  # delta and dq are contiguous
    # padded rows: lse 0 and delta 0 with q = dO = 0 give dS = 0 (and are not stored)
    lse2 = load_lse2(head_base(lse_ptr, bh, H, stride_lb, stride_lh), offs_m, Sq, True)
    delta = tl.load(delta_ptr + row, mask=offs_m < Sq, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = tl.minimum(Sk, (pid % num_m + 1) * BLOCK_M) if CAUSAL else Sk
    dq = dq_over_keys(dq, q, do, lse2, delta, offs_m, head_base(k_ptr, bh, H, stride_kb, stride_kh),
                      head_base(v_ptr, bh, H, stride_vb, stride_vh), 0, 0, stride_ks, stride_vs, 0, hi, Sk, qk_scale,
                      CAUSAL, True, False, BLOCK_N, HEAD_DIM)
    tl.store(dq_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], (dq * scale).to(dq_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Sq)


def launch(q, k, v, out, lse, causal, scale):
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    if B * H * Sq == 0:
        return
    check_inputs("attention step 1", q, k, v)
    grid = (B * H * cdiv(Sq, BLOCK_M),)
    wrap_triton(attention_fused_kernel)[grid](
        q, k, v, out, lse, *head_strides(q), *head_strides(k), *head_strides(v), H, Sq, Sk, scale * LOG2E,
        CAUSAL=bool(causal), HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS)


def launch_backward(q, k, v, out, lse, dout, dq, dk, dv, causal, scale):
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    if B * H * Sk == 0:
        return
    if Sq == 0:
        dk.zero_()  # sums over no queries
        dv.zero_()
        return
    check_inputs("attention step 1", q, k, v, out, lse, dout)
    delta = backward_delta(out, dout)
    strides = (*head_strides(q), *head_strides(k), *head_strides(v), *head_strides(dout), *lse.stride()[:2])
    common = dict(CAUSAL=bool(causal), HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=2 * NUM_WARPS)
    wrap_triton(attention_dkdv_kernel)[(B * H * cdiv(Sk, BLOCK_N),)](
        q, k, v, dout, lse, delta, dk, dv, *strides, H, Sq, Sk, scale * LOG2E, scale, **common)
    wrap_triton(attention_dq_kernel)[(B * H * cdiv(Sq, BLOCK_M),)](
        q, k, v, dout, lse, delta, dq, *strides, H, Sq, Sk, scale * LOG2E, scale, **common)
