"""
Step 2 — BLOCK and num_warps autotuned per size
Changed:  @triton.autotune picks BLOCK in {1024 .. 16384} x num_warps in {4, 8, 16}, keyed on n,
          so each size gets the split that keeps the most bytes in flight per SM.
Why:      at 2^28 elements step 1 launches 2^18 programs of 1024 elements; bigger blocks mean
          fewer, longer programs with more independent loads per thread (16 fp32 per operand at
          BLOCK=4096, 4 warps).
Still:    the first call for each new n pays the tuning runs (tens of milliseconds), and the
          choice is re-made for every distinct size; a real library buckets the key.
Limits:   none.
Mirrors:  CUDA step 04 (more bytes in flight per thread), by tuning BLOCK and num_warps
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
