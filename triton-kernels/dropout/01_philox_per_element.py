"""
Step 1 — one Philox call per element
Changed:  the starting point. The op's mask, the same in every step of both ladders: element i
          (of the flat tensor) takes word i % 4 of tl.randint4x(seed, offset + i // 4), turns it
          into u in [0, 1) with Triton's own tl.uint_to_uniform_float (what tl.rand does), and is
          kept when u > p (strictly: the Triton dropout tutorial's test). Kept elements are
          x * scale, scale = fp32(1 / (1 - p)) (the division in double, on the host), the product
          in fp32, then rounded to y's dtype; dropped ones are 0 (p = 1 drops all; x * inf is
          never stored). Backward: the same kernel on dy -> dx with the same seed and offset, so
          the mask is drawn again rather than stored. Here each program of BLOCK = 1024 elements
          runs tl.randint4x once per element and keeps the one word its element needs.
Why:      no mask tensor: the forward moves 2 x |x| bytes (one read, one write), not 2 x |x| plus
          a mask, and the backward as much again. The price is the generator: Philox4x32-10 is
          10 rounds of two 32x32->64 multiplies (umulhi + mul: one IMAD.WIDE each) and two
          3-way xors, ~60 integer instructions per call. One call per element against 8 bytes
          (fp32) or 4 bytes (fp16/bf16) moved: H100's IMAD pipe does 64 lanes/clk/SM (a WIDE
          costs ~2), so ~0.6 SM-clocks per element, ~370 G elements/s over 132 SMs at 1.75 GHz:
          ~3.0 TB/s at fp32 and ~1.5 TB/s at 16 bits -- compute-bound, as written (see Still).
Still:    in the source, three of every four words are thrown away. In the compiled kernel they
          are not: Triton's axis analysis sees that idx // 4 is constant over the 4 (fp32) or 8
          (16-bit) contiguous elements a thread holds and lowers randint4x once per distinct
          value (PTX for sm_90: 40 mul.hi per thread of 8 elements, as step 2), so this step
          already runs at step 2's cost; the per-element cost shows in CUDA step 1 only. Step 2
          writes the amortisation out, so it no longer depends on the layout the compiler picks.
Limits:   none (64-bit offsets: n may exceed 2^31; the counter is int64, so offset + i // 4 may
          pass 2^32 and carries into Philox's second counter word).
Layout:   contiguous
Roofline: as written ~60 integer ops per element (compiled: ~15) vs 8 B (fp32) / 4 B (16-bit)
Mirrors:  CUDA step 01 (one Philox call per element, one element per thread)
"""
import math

import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import cdiv

BLOCK = 1024


# Not specialised on seed and offset: a new seed (or an offset that happens to be 1 or a multiple
# of 16) would otherwise compile a new kernel.
@triton.jit(do_not_specialize=["seed", "offset"])
def dropout_kernel(
    x_ptr,  # input (dy in the backward), contiguous
    y_ptr,  # output (dx in the backward), contiguous, same dtype
    n,  # number of elements
    p,  # drop probability, fp32
    scale,  # fp32(1 / (1 - p)): what a kept element is multiplied by
    seed,  # Philox key: low 32 bits k0, high 32 bits k1
    offset,  # Philox counter of element 0's group; element i uses offset + i // 4
    BLOCK: tl.constexpr,  # elements per program
):
    start = tl.program_id(0).to(tl.int64) * BLOCK  # 64-bit offsets past 2^31 elements
    idx = start + tl.arange(0, BLOCK)
    mask = idx < n
    x = tl.load(x_ptr + idx, mask=mask)
    # int64 counter: randint4x splits it into (low, high) words; an int32 one would wrap at 2^32.
    r0, r1, r2, r3 = tl.randint4x(seed, offset + idx // 4)
    k = idx % 4
    word = tl.where(k == 0, r0, tl.where(k == 1, r1, tl.where(k == 2, r2, r3)))
    u = tl.uint_to_uniform_float(word)
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
    # wrap_triton lets torch.compile trace the launch; eager calls go straight to the kernel.
    wrap_triton(dropout_kernel)[(cdiv(n, BLOCK),)](
        x, y, n, p, keep_scale(p), seed, offset, BLOCK=BLOCK, num_warps=4)


def launch_backward(dy, dx, p, seed, offset):
    launch(dy, dx, p, seed, offset)  # the same mask and scale, regenerated from (seed, offset)
