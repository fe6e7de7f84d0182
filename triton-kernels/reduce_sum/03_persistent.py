"""
Step 3 — persistent programs: a machine-sized grid, each looping, one atomic per program
Changed:  the grid is 4 programs per SM; each walks the input in strides of grid x BLOCK,
          accumulating into a BLOCK-wide fp32 register vector, and issues a single atomic at the
          end. BLOCK and num_warps are autotuned (keyed on n).
Why:      Triton's version of CUDA step 7/8: O(n/p) sequential work per program, the reduction
          tree paid once per program instead of once per block, and ~500 atomics instead of 16 Ki.
          The vector accumulator keeps BLOCK independent fp32 chains, so accuracy improves too.
Still:    NON-DETERMINISTIC like step 2 (fewer atomics, so a smaller spread). The autotuner runs
          the kernel several times on the first call for each n (reset_to_zero keeps the output
          right). Step 4 trades the atomics for a tiny second pass to become deterministic.
Limits:   none.
Mirrors:  CUDA step 10 (a machine-sized grid, many loads in flight per thread), finished by atomics
"""
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import cdiv, sm_count, tuned

PROGRAMS_PER_SM = 4

CONFIGS = tuned([triton.Config({"BLOCK": b}, num_warps=w) for b in (1024, 2048, 4096) for w in (4, 8)],
                triton.Config({"BLOCK": 1024}, num_warps=4))


@triton.autotune(configs=CONFIGS, key=["n"], reset_to_zero=["out_ptr"])
@triton.jit
def sum_persistent_kernel(
    x_ptr,  # input, contiguous
    out_ptr,  # float32 scalar, zeroed before the launch
    n,  # number of elements; the autotune key
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK, n, step):
        offsets = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr, tl.sum(acc, axis=0))


def programs_for(x):
    sms = sm_count(x.device)
    return PROGRAMS_PER_SM * sms


def launch(x, out):
    out.zero_()
    n = x.numel()
    if n == 0:
        return
    grid = lambda meta: (min(programs_for(x), cdiv(n, meta["BLOCK"])),)  # noqa: E731
    wrap_triton(sum_persistent_kernel)[grid](x, out, n)
