"""
Step 1 — tl.dot GEMM with bias + GELU fused into its epilogue
Changed:  matmul step 4's grouped, autotuned tl.dot kernel (pointer loads with masks, any
          strides) with a constexpr epilogue applied to the fp32 accumulator before the one
          rounding: forward z = acc + bias, out = gelu(z) (tanh form through one exp2, see
          gemm_epilogue.py). Backward: the same kernel recomputes z with an epilogue that loads
          the dy tile and stores dz = dy gelu'(z) plus the tile's fp32 column sums of dz; then
          the plain kernel (epilogue none) on strided views runs da = dz W^T, dweight = a^T dz,
          and a fixed-order sum of the partials gives dbias (the same bits every run).
Why:      unfused, z = a W goes to DRAM and comes back for bias + GELU: per 128 x 256 bf16
          tile 64 KB written, 64 KB read and 64 KB written again, where fused writes 64 KB once
          (4096^3: 64 MB less traffic, ~20 us at 3.3 TB/s next to a ~140 us GEMM; GPT-2's
          2048 x 768 x 3072: 25 MB, ~8 us next to ~12 us). The epilogue's arithmetic is ~8
          instructions and 2 MUFU (EX2, RCP) per element: 65,536 MUFU ops per tile at 16/clk/SM
          = 4,096 clk ~ 2.2 us, against the tile's MMA: 2·128·256·K flops, at K = 4096 268
          MFLOP = ~36 us at 7.5 TFLOP/s per SM (6%), at K = 768 ~6.7 us (a third: the epilogue
          is not overlapped with the next tile's loads). Backward: the dz epilogue adds a 64 KB
          dy read and replaces z's write + read and dz's re-read by the sum (3 M N bytes x 2).
Still:    cp.async pointer loads issued by the warps that run wgmma, and one program per tile
          pays its own pipeline fill and epilogue: step 2 moves loads and stores to TMA in a
          persistent loop. The backward runs 3 GEMMs and stores dz (M x N) between them.
Limits:   none: pointer loads take any strides (Layout any), so no input is copied; CUDA
          step 1 (GEMM, then bias + GELU as a separate kernel) has no Triton counterpart.
Dtypes:   bfloat16, float16
Layout:   any
Mirrors:  CUDA step 2 (the fused epilogue) on a pointer-based tl.dot kernel; CUDA step 1 is the
          unfused baseline, which exists only in CUDA
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import cdiv, tuned
from rosetta.triton_kernels.gemm_epilogue import (GELU, GELU_GRAD, NONE, bias_partials, gelu, gelu_grad,
                                                  load_bias, store_column_partials, sum_bias)


def config(bm, bn, bk, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                         num_warps=warps, num_stages=stages)


# matmul step 4's 16-bit list; every BLOCK_M is a multiple of gemm_epilogue.PARTIAL_M (64)
CONFIGS = tuned([config(*c) for c in [
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 4),
]], config(64, 64, 32, 4, 1))


@triton.autotune(configs=CONFIGS, key=["M", "N", "K", "EPILOGUE"])
@triton.jit
def linear_gelu_kernel(
    a_ptr,  # A, M x K, any strides
    b_ptr,  # B, K x N, any strides
    bias_ptr,  # (N,), read by the GELU epilogues
    dy_ptr,  # M x N, any strides, read by the GELU_GRAD epilogue
    out_ptr,  # M x N, unit column stride: out, dz, da or dweight
    partial_ptr,  # fp32 (num_partials, N): dbias's column partials (GELU_GRAD)
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_bias, stride_dym, stride_dyn, stride_om,
    num_partials,
    EPILOGUE: tl.constexpr,  # NONE, GELU or GELU_GRAD (gemm_epilogue.py)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n  # matmul step 3's grouped order
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: rows x stride > 2^31
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K == 0: no iteration, z = bias
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = ks < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    mask = row_ok[:, None] & col_ok[None, :]
    # the epilogue, in fp32 on the accumulator's registers: nothing of z leaves the SM
    if EPILOGUE == GELU:
        acc = gelu(acc + load_bias(bias_ptr, cols, col_ok, stride_bias)[None, :])
    elif EPILOGUE == GELU_GRAD:
        z = acc + load_bias(bias_ptr, cols, col_ok, stride_bias)[None, :]
        # padded rows and columns read dy = 0: their dz is 0 and adds nothing to the partials
        dy = tl.load(dy_ptr + rows[:, None] * stride_dym + cols[None, :] * stride_dyn, mask=mask, other=0.0)
        acc = dy.to(tl.float32) * gelu_grad(z)
        # dbias from dz before its rounding to the input type (da, dweight use the rounded dz)
        store_column_partials(acc, partial_ptr, pid_m, cols, col_ok, N, num_partials, BLOCK_M, BLOCK_N)
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def gemm(x, y, out, epilogue, bias=None, dy=None, partial=None):
    """out = epilogue(x @ y): x (M x K) and y (K x N) any strides (transposes are views), out
    with a unit column stride. Arguments an epilogue does not read get x, an input (never an
    output: the kernel must not look like it writes into a tensor twice)."""
    M, K = x.shape
    N = y.shape[1]
    if M == 0 or N == 0:
        return
    bias = x if bias is None else bias
    dy = x if dy is None else dy
    partial = x if partial is None else partial
    num_partials = partial.shape[1] if epilogue == GELU_GRAD else 0
    grid = lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    wrap_triton(linear_gelu_kernel)[grid](
        x, y, bias, dy, out, partial, M, N, K,
        x.stride(0), x.stride(1), y.stride(0), y.stride(1), bias.stride(0), dy.stride(0), dy.stride(1),
        out.stride(0), num_partials, EPILOGUE=epilogue)


def launch(a, weight, bias, out):
    gemm(a, weight, out, GELU, bias=bias)


def launch_backward(a, weight, bias, dy, da, dweight, dbias):
    M, K = a.shape
    N = weight.shape[1]
    if M == 0:  # sums over no rows
        dweight.zero_()
        dbias.zero_()
        return
    if N == 0:  # da = dz W^T sums over no columns
        da.zero_()
        return
    dz = torch.empty((M, N), dtype=a.dtype, device=a.device)
    partial = bias_partials(M, N, a.device)
    gemm(a, weight, dz, GELU_GRAD, bias=bias, dy=dy, partial=partial)  # z recomputed, dz stored
    gemm(dz, weight.t(), da, NONE)  # M x K (nothing when K = 0)
    gemm(a.t(), dz, dweight, NONE)  # K x N
    sum_bias(partial, dbias)
