"""
Step 2 — one Philox call per four elements
Changed:  the program draws tl.rand4x(seed, offset + g) once per group g of four elements
          (BLOCK / 4 calls instead of BLOCK) and interleaves the four result blocks so that
          element 4g + k gets word k: interleave(interleave(u0, u2), interleave(u1, u3)) is
          u0[0], u1[0], u2[0], u3[0], u0[1], ... The mask is step 1's, bit for bit.
Why:      step 1 computes four words per element and keeps one. Using all four divides the
          generator's ~60 integer instructions per call by four: ~15 per element, ~0.16
          SM-clocks, ~1.5 T elements/s of Philox over the chip -- 4x the 419 G elements/s that
          3.35 TB/s can feed at fp32 (8 B per element) and 2x at 16 bits (838 G/s). The kernel
          is now memory-bound: the loads and stores, not the multiplies, set the time.
Still:    BLOCK = 1024 and num_warps = 4 (step 1's) are a guess: 8 elements per thread, 32 bytes
          of fp32 in flight; step 3 tunes them per size.
Limits:   none (int64 counters and offsets, as step 1).
Layout:   contiguous
Roofline: ~15 integer ops per element vs 8 B (fp32) / 4 B (16-bit): memory-bound, <= 3.35 TB/s
Mirrors:  CUDA step 02 (one Philox call per four-element vector)
"""
import math

import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import cdiv

BLOCK = 1024


@triton.jit
def draw_uniform4(seed, offset, group):
    """u for the 4 x len(group) elements of `group`, in element order: word k goes to 4g + k."""
    u0, u1, u2, u3 = tl.rand4x(seed, offset + group)
    # interleave(a, b) = a[0], b[0], a[1], b[1], ...; twice gives u0[g], u1[g], u2[g], u3[g].
    return tl.interleave(tl.interleave(u0, u2), tl.interleave(u1, u3))


@triton.jit(do_not_specialize=["seed", "offset"])
def dropout_kernel(
    x_ptr,  # input (dy in the backward), contiguous
    y_ptr,  # output (dx in the backward), contiguous, same dtype
    n,  # number of elements
    p,  # drop probability, fp32
    scale,  # fp32(1 / (1 - p)): what a kept element is multiplied by
    seed,  # Philox key: low 32 bits k0, high 32 bits k1
    offset,  # Philox counter of element 0's group; element i uses offset + i // 4
    BLOCK: tl.constexpr,  # elements per program, a multiple of 4
):
    pid = tl.program_id(0).to(tl.int64)  # 64-bit offsets past 2^31 elements
    idx = pid * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    x = tl.load(x_ptr + idx, mask=mask)
    u = draw_uniform4(seed, offset, pid * (BLOCK // 4) + tl.arange(0, BLOCK // 4))
    # where, not x * (u > p) * scale: at p = 1, scale is inf and 0 * inf would be NaN.
    y = tl.where(u > p, x.to(tl.float32) * scale, 0.0)
    tl.store(y_ptr + idx, y.to(y_ptr.dtype.element_ty), mask=mask)


def keep_scale(p):
    """fp32 rounding happens at the launch; the division in double, once (p = 1: never used)."""
    return 1.0 / (1.0 - p) if p < 1.0 else math.inf


def launch(x, y, p, seed, offset, block=BLOCK, num_warps=4):
    n = x.numel()
    if n == 0:
        return
    wrap_triton(dropout_kernel)[(cdiv(n, block),)](
        x, y, n, p, keep_scale(p), seed, offset, BLOCK=block, num_warps=num_warps)


def launch_backward(dy, dx, p, seed, offset):
    launch(dy, dx, p, seed, offset)  # the same mask and scale, regenerated from (seed, offset)
