"""
Step 2 — single pass with tl.atomic_add
Changed:  no partials array and no second kernel: each program adds its block's sum straight
          into the output with one fp32 atomic (after a zero-fill of the output).
Why:      removes step 1's serial finishing kernel and its kernel boundary. Blocks of 16384
          elements keep the atomics to n/16384 (16 Ki at 2^28): the L2 atomic unit absorbs that
          many adds to one address without becoming the bottleneck.
Still:    NON-DETERMINISTIC: programs finish in a different order every run, so the fp32 adds
          happen in a different order and round differently (the spread is measured by a GPU
          test and stays within 1e-5 * sum|x|). And one program per block: many short programs.
Limits:   none.
Mirrors:  CUDA step 09 (one launch), with an fp32 atomic per block in place of its last-block ticket
"""
import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import cdiv

BLOCK = 16384


@triton.jit
def sum_atomic_kernel(
    x_ptr,  # input, contiguous
    out_ptr,  # float32 scalar, zeroed before the launch
    n,  # number of elements
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x.to(tl.float32), axis=0))  # order differs run to run


def launch(x, out):
    out.zero_()  # the atomics accumulate into it
    n = x.numel()
    if n == 0:
        return
    wrap_triton(sum_atomic_kernel)[(cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK, num_warps=8)
