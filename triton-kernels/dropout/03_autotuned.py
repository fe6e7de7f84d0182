"""
Step 3 — BLOCK and num_warps autotuned per size
Changed:  step 2's kernel under @triton.autotune: BLOCK in {1024 .. 16384} x num_warps in
          {4, 8, 16}, keyed on n. The mask is step 1's, bit for bit.
Why:      at 2^28 elements step 2 runs 2^18 programs of 1024 elements, 8 per thread: 32 bytes of
          fp32 (16 of fp16) in flight per thread, and each program's Philox calls sit between its
          loads and its stores. Bigger blocks give each thread more independent loads to issue
          before the generator's ~15 integer instructions per element, as CUDA step 3 does by
          hand with four 16-byte vectors per thread.
Still:    the first call for each new n pays the tuning runs, and the choice is made per distinct
          size (a real library buckets the key). The autotuner times forward and backward alike.
Limits:   none (int64 counters and offsets, as step 1).
Layout:   contiguous
Roofline: ~15 integer ops per element vs 8 B (fp32) / 4 B (16-bit): memory-bound, <= 3.35 TB/s
Mirrors:  CUDA steps 03 (several 16-byte vectors per thread, Philox under the loads) and 04 (the
          loads kept ahead of the generator, which Triton's own schedule does here)
"""
import math

import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import cdiv, tuned

CONFIGS = tuned([triton.Config({"BLOCK": block}, num_warps=warps)
                 for block in (1024, 2048, 4096, 8192, 16384) for warps in (4, 8, 16)],
                triton.Config({"BLOCK": 1024}, num_warps=4))


@triton.jit
def draw_uniform4(seed, offset, group):
    """u for the 4 x len(group) elements of `group`, in element order: word k goes to 4g + k."""
    u0, u1, u2, u3 = tl.rand4x(seed, offset + group)
    # interleave(a, b) = a[0], b[0], a[1], b[1], ...; twice gives u0[g], u1[g], u2[g], u3[g].
    return tl.interleave(tl.interleave(u0, u2), tl.interleave(u1, u3))


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit(do_not_specialize=["seed", "offset"])
def dropout_kernel(
    x_ptr,  # input (dy in the backward), contiguous
    y_ptr,  # output (dx in the backward), contiguous, same dtype
    n,  # number of elements; the autotune key
    p,  # drop probability, fp32
    scale,  # fp32(1 / (1 - p)): what a kept element is multiplied by
    seed,  # Philox key: low 32 bits k0, high 32 bits k1
    offset,  # Philox counter of element 0's group; element i uses offset + i // 4
    BLOCK: tl.constexpr,  # elements per program, chosen by the autotuner (a multiple of 4)
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


def launch(x, y, p, seed, offset):
    n = x.numel()
    if n == 0:
        return
    grid = lambda meta: (cdiv(n, meta["BLOCK"]),)  # noqa: E731 -- BLOCK is the tuner's
    wrap_triton(dropout_kernel)[grid](x, y, n, p, keep_scale(p), seed, offset)


def launch_backward(dy, dx, p, seed, offset):
    launch(dy, dx, p, seed, offset)  # the same mask and scale, regenerated from (seed, offset)
