"""
Step 3 — full blocks unmasked: 16-byte vectors at any n
Changed:  a program whose block lies wholly inside [0, n) loads and stores with no mask; only the
          last, partial block keeps step 2's mask. BLOCK and num_warps autotuned as in step 2.
Why:      Triton vectorizes an access only where it can prove the 16-byte group is all in or all
          out. The mask `offsets < n` is constant over 8 bf16 lanes only if n is a multiple of 8,
          and Triton knows that only when the launch specializes n as divisible by 16. At an odd
          n (12,345,679 bf16) step 2 compiles to 2-byte loads: offline SASS for sm_90, BLOCK 4096
          at 4 warps, has 64 LDG.E.U16 + 32 STG.E.U16 a thread where n % 16 == 0 gives 8 LDG.E.128
          + 4 STG.E.128 (and 148 registers against 34). Without the mask, the offsets
          (BLOCK * pid + arange) and torch's 16-byte aligned pointers are all it needs. Predicted:
          odd bf16 sizes from 0.68x torch (step 2) to ~1.0x, the copy ceiling; even sizes as step 2.
Still:    the branch is per program, so the last block still runs the scalar path: one block in
          thousands. A pointer torch did not align (a view at an odd offset) still loses the
          vectors; CUDA step 4 checks the pointers at run time, a Triton kernel can only be
          specialized on them.
Limits:   none.
Mirrors:  CUDA step 04 (full tiles take the vector path, the partial tile a scalar one)
"""
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import cdiv, tuned

CONFIGS = tuned([triton.Config({"BLOCK": block}, num_warps=warps)
                 for block in (1024, 2048, 4096, 8192, 16384) for warps in (4, 8, 16)],
                triton.Config({"BLOCK": 1024}, num_warps=4))


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def add_kernel(
    x_ptr,  # first operand, contiguous
    y_ptr,  # second operand, contiguous, same dtype
    out_ptr,  # result, contiguous
    n,  # number of elements; the autotune key
    BLOCK: tl.constexpr,  # elements per program, chosen by the autotuner
):
    start = tl.program_id(0).to(tl.int64) * BLOCK  # 64-bit offsets past 2^31 elements
    offsets = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:  # the whole block is inside: no mask, so nothing to prove about n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))
    else:
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)


def launch(x, y, out):
    n = out.numel()
    if n == 0:
        return
    grid = lambda meta: (cdiv(n, meta["BLOCK"]),)  # noqa: E731 -- BLOCK is the tuner's
    wrap_triton(add_kernel)[grid](x, y, out, n)
