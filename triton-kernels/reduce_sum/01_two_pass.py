"""
Step 1 — two passes: per-program partial sums, then one program sums the partials
Changed:  the starting point: program p loads 4096 elements, widens them to fp32 and writes their
          tl.sum to partials[p]; a second kernel (a single program) adds the partials up.
          (Mirrors CUDA step 7's two-launch structure; Triton has no shared-memory tree to
          write: tl.sum picks the in-register/shuffle reduction that CUDA steps 1-8 build.)
Why:      each element is read once (the op's minimal bytes), the block reduction is the
          compiler's, and both passes are deterministic. n/4096 partials are 0.1% of the input.
Still:    the second kernel runs one program over n/4096 partials (64 Ki of them at 2^28: a
          serial loop of 16 iterations) while the rest of the GPU idles, and there is a kernel
          boundary between the passes.
Limits:   none (64-bit offsets).
Mirrors:  CUDA steps 01-08 (the block tree and its warp shuffles become tl.sum), two launches as in step 07
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import cdiv

BLOCK = 4096
FINISH_BLOCK = 4096


@triton.jit
def partial_sums_kernel(
    x_ptr,  # input, contiguous
    partials_ptr,  # float32[programs]: one sum per program
    n,  # number of elements
    BLOCK: tl.constexpr,  # elements per program
):
    pid = tl.program_id(0).to(tl.int64)  # 64-bit: pid * BLOCK passes 2^31 on big inputs
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)  # other=0: the sum's identity
    tl.store(partials_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def finish_kernel(
    partials_ptr,  # float32[m]
    out_ptr,  # float32 scalar
    m,  # number of partials
    BLOCK: tl.constexpr,
):
    acc = tl.zeros([BLOCK], dtype=tl.float32)  # BLOCK independent accumulators
    for start in range(0, m, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        acc += tl.load(partials_ptr + offsets, mask=offsets < m, other=0.0)
    tl.store(out_ptr, tl.sum(acc, axis=0))


def launch(x, out):
    n = x.numel()
    if n == 0:
        out.zero_()
        return
    programs = cdiv(n, BLOCK)
    partials = torch.empty(programs, dtype=torch.float32, device=x.device)
    wrap_triton(partial_sums_kernel)[(programs,)](x, partials, n, BLOCK=BLOCK, num_warps=8)
    wrap_triton(finish_kernel)[(1,)](partials, out, programs, BLOCK=FINISH_BLOCK, num_warps=8)
