"""
Step 5 — single pass: the last program to finish sums the partials
Changed:  step 4's persistent programs and partials, but one kernel: each program stores its
          partial, then draws a ticket from an atomic counter (acq_rel: its partial is published,
          and the last to draw sees every other); the program with the last ticket reads all the
          partials (a fixed tree over them, in program order) and stores the total. The counter
          is one of triton_launch.tickets, zeroed once per stream: the last program sets it back
          to zero, so no launch clears it first (CUDA step 9 still pays a 4-byte memset).
Why:      a second launch costs host time on every call (~5 us of Python and driver work on the
          H100's host) and a kernel boundary on the GPU. Up to 10^7 elements that launch is most
          of an eager call: step 4 took 26-36 us a call on 10^4-10^7 elements where torch's own
          took 10-24. Predicted: the kernel as step 4 minus its boundary (~1-2 us from 10^4 to
          10^7 elements, nothing at 2^28), and one launch of host time less per call.
Still:    the block size is re-tuned for every new n, as in step 4. One program (n <= 1,024)
          still draws its ticket and reads its own partial back: 6.6 us against step 4's 5.2,
          which stores its one sum directly (step=None takes step 4 there). The last program's
          read of the partials (up to 528 floats from L2) is a serial tail.
Limits:   none. The counter must not be shared by two launches at once: launches on one stream
          run in order, and each stream has its own buffer (triton_launch.tickets says more).
Mirrors:  CUDA step 09 (the last block to finish sums the partials), its memset replaced by a
          counter the kernel leaves at zero
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import cdiv, next_power_of_2, sm_count, tuned
from rosetta.triton_launch import tickets  # counters the kernel leaves at zero: one buffer per stream

PROGRAMS_PER_SM = 4

MIN_BLOCK = 1024  # the smallest BLOCK a config may pick
CONFIGS = tuned([triton.Config({"BLOCK": b}, num_warps=w) for b in (MIN_BLOCK, 2048, 4096) for w in (4, 8)],
                triton.Config({"BLOCK": MIN_BLOCK}, num_warps=4))


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def sum_single_pass_kernel(
    x_ptr,  # input, contiguous
    partials_ptr,  # float32[programs]
    ticket_ptr,  # int32 at zero, left at zero (triton_launch.tickets)
    out_ptr,  # float32 scalar
    n,  # number of elements; the autotune key
    PROGRAMS_P2: tl.constexpr,  # >= the grid: the last program's one masked load of the partials
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    programs = tl.num_programs(0)
    step = programs.to(tl.int64) * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK, n, step):
        offsets = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(partials_ptr + pid, tl.sum(acc, axis=0))
    tl.debug_barrier()  # the partial's store is ordered before the ticket's release, whichever thread made it
    if tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == programs - 1:
        k = tl.arange(0, PROGRAMS_P2)
        # .cg: the other programs' partials from L2, never a stale line of this SM's L1
        partials = tl.load(partials_ptr + k, mask=k < programs, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr, tl.sum(partials, axis=0))
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed")  # every program has drawn: back to zero


def launch(x, out):
    n = x.numel()
    if n == 0:
        out.zero_()
        return
    # step 4's grid: no more programs than the smallest block has work for, at most
    # PROGRAMS_PER_SM an SM; fixed per n, so the order of the adds, and the bits, are too.
    programs = min(PROGRAMS_PER_SM * sm_count(x.device), cdiv(n, MIN_BLOCK))
    partials = torch.empty(programs, dtype=torch.float32, device=x.device)
    wrap_triton(sum_single_pass_kernel)[(programs,)](x, partials, tickets(x, 1), out, n,
                                                      PROGRAMS_P2=next_power_of_2(programs))
