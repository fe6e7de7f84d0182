"""
Step 1 — one fixed-size block per program
Changed:  the starting point: program p adds elements [p*BLOCK, (p+1)*BLOCK), masked at the end.
Why:      Triton's unit is a block, not a thread: one program per 1024 elements, and the compiler
          splits the block over num_warps=4 warps, choosing the vector width itself (16-byte
          accesses when it can prove alignment -- which it does for torch's allocations). So
          this step already holds what CUDA steps 1-3 build by hand; 12 bytes per fp32 element,
          one add: bandwidth-bound from the start.
Still:    BLOCK and num_warps are guesses: 1024 elements x 4 warps puts 8 fp32 per thread per
          operand in flight; a different split may keep more bytes in flight per SM.
Limits:   none (the offsets are 64-bit, so n may exceed 2^31).
Mirrors:  CUDA steps 01-03 (naive, grid-stride, vectorized: the compiler picks the vector width)
"""
import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import cdiv

BLOCK = 1024


@triton.jit
def add_kernel(
    x_ptr,  # first operand, contiguous
    y_ptr,  # second operand, contiguous, same dtype
    out_ptr,  # result, contiguous
    n,  # number of elements
    BLOCK: tl.constexpr,  # elements per program
):
    # int64 before the multiply: pid * BLOCK overflows int32 past 2^31 elements.
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offsets = start + tl.arange(0, BLOCK)
    mask = offsets < n  # the last program runs past n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def launch(x, y, out, block=BLOCK):
    """`block`: the bench's ablation tier launches this step at block=4, all else as here."""
    n = out.numel()
    if n == 0:
        return
    # wrap_triton lets torch.compile trace the launch; eager calls go straight to the kernel.
    wrap_triton(add_kernel)[(cdiv(n, block),)](x, y, out, n, BLOCK=block, num_warps=4)
