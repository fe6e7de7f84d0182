"""
Step 4 — autotuned tile shape, group size, warps and pipeline depth
Changed:  the kernel is step 3's; @triton.autotune picks BLOCK_M/N, num_warps and num_stages per
          (M, N, K) and dtype from two short lists: one for fp32 (ieee FFMA, BLOCK_K 32) and one
          for 16-bit inputs (wgmma, BLOCK_K 64); GROUP_M stays 8 (step 3 measured the grouping).
          The first call for a shape times each config.
Why:      the two paths want opposite things. fp32 ieee lowers tl.dot to FFMA from shared memory:
          the limit is registers (a 128 x 128 tile on 256 threads is 64 accumulators + operand
          fragments per thread) and the FFMA issue rate (~60-67 TFLOP/s peak): BLOCK_K 32,
          8 warps, 3-4 stages. 16-bit wgmma does 16x the flops per cycle, so the limit moves to
          feeding it: wider tiles (128 x 256 x 64: 2·128·256·64 flops per 48 KB staged = 85 flops
          per byte of shared memory) and deeper pipelines (3-4 stages x 48 KB <= 227 KB).
Still:    every load goes through registers or cp.async issued by all warps, and each program
          pays its own prologue/epilogue; on Hopper the tensor cores wait on address arithmetic.
          Step 5 (16-bit) moves loads to TMA and makes the grid persistent.
Limits:   none.
Dtypes:   float32, float16, bfloat16
Layout:   any
Mirrors:  CUDA steps 07-08 (tile and pipeline tuning) and 09-11 for 16-bit inputs
"""
import torch
import triton
from torch.library import wrap_triton

from rosetta.registry import select
from rosetta.torch_ops import triton_module
from rosetta.triton_kernels.common import cdiv, tuned

# The kernel is step 3's, imported rather than copied: this step changes only how it is launched.
matmul_grouped_kernel = triton_module(select("matmul", "triton", 3)).matmul_grouped_kernel


def config(bm, bn, bk, group, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                         num_warps=warps, num_stages=stages)


INTERPRET_CONFIG = config(64, 64, 32, 8, 4, 1)
# fp32 ieee = FFMA: register-bound. 64 accumulators per thread is the most that does not spill
# (128 x 256 on 8 warps or 128 x 128 on 4 warps spill ~100 bytes for < 1% gain at 4096^3)
FP32_CONFIGS = tuned([config(*c) for c in [
    (128, 128, 32, 8, 8, 3),
    (64, 256, 32, 8, 8, 3),
    (256, 64, 32, 8, 8, 3),
    (64, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4),
    (64, 64, 32, 8, 4, 4),
]], INTERPRET_CONFIG)
# fp16/bf16 = wgmma: bandwidth-bound, wide tiles and deep pipelines
HALF_CONFIGS = tuned([config(*c) for c in [
    (128, 256, 64, 8, 8, 3),
    (256, 128, 64, 8, 8, 3),
    (128, 128, 64, 8, 8, 4),
    (128, 128, 64, 8, 4, 4),
    (128, 64, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 4),
    (64, 64, 64, 8, 4, 4),
]], INTERPRET_CONFIG)


# step 3's kernel under two tuners; the tuner's cache key is (M, N, K) plus the dtypes of the
# tensor arguments, so fp16 and bf16 get their own choices from HALF_CONFIGS
matmul_fp32_tuned = triton.autotune(configs=FP32_CONFIGS, key=["M", "N", "K"])(matmul_grouped_kernel)
matmul_half_tuned = triton.autotune(configs=HALF_CONFIGS, key=["M", "N", "K"])(matmul_grouped_kernel)


def launch(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    kernel = matmul_fp32_tuned if a.dtype == torch.float32 else matmul_half_tuned
    grid = lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    wrap_triton(kernel)[grid](
        a, b, out, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0))
