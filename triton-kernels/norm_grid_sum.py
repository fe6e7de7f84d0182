"""The norm ladders' step 4 backward: the dweight (and dbias) partial rows summed by the grid that
wrote them, after it meets once.

Every program of a split grid is resident at once (norm_common.split_kernel's register cap), so
the grid can meet: each program stores its partial rows, arrives, waits for the last to arrive,
then sums a strip of PARTIAL_COLUMNS columns of one sum over all the partial rows, in a fixed
order, and stores it: no second launch. Under the interpreter programs run one after another and
cannot wait: there the host launches norm_common.sum_counted_partials, as step 3 does."""
import triton
import triton.language as tl

from rosetta.triton_kernels.common import INTERPRET, next_power_of_2
from rosetta.triton_kernels.norm_common import PARTIAL_COLUMNS

GRID_SUM = not INTERPRET


@triton.jit
def grid_sum_partials(partial_ptr, sync_ptr, groups, cols, out0_ptr, out1_ptr, SUMS: tl.constexpr,
                      BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    """out_k[j] = sum over g < groups of partial[k, g, j] (k < SUMS), summed by all the programs of
    the grid. sync_ptr: two int32 at zero (triton_launch.tickets), left at zero: the first counts
    arrivals, the second departures; the last to leave resets both (every program has stopped
    polling the first by then)."""
    programs = tl.num_programs(0)
    # the arrival is common.wait_for_peers' (the same four lines, measured as written here)
    tl.debug_barrier()  # every thread's partial stores, before thread 0's release below
    tl.atomic_add(sync_ptr, 1, sem="release")
    while tl.atomic_add(sync_ptr, 0, sem="acquire") < programs:
        pass
    tl.debug_barrier()  # thread 0 has seen them all: so may the others
    strips = tl.cdiv(cols, BLOCK_C)
    g = tl.arange(0, BLOCK_G)
    for task in range(tl.program_id(0), strips * SUMS, programs):
        k = task // strips
        c = (task % strips) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (g < groups)[:, None] & (c < cols)[None, :]
        rows = partial_ptr + (k * groups + g)[:, None].to(tl.int64) * cols + c[None, :]
        # .cg: L2, never this SM's L1, which may hold these lines from an earlier launch
        total = tl.sum(tl.load(rows, mask=mask, other=0.0, cache_modifier=".cg"), axis=0)
        if k == 0:
            tl.store(out0_ptr + c, total.to(out0_ptr.dtype.element_ty), mask=c < cols)
        if SUMS == 2:
            if k == 1:
                tl.store(out1_ptr + c, total.to(out1_ptr.dtype.element_ty), mask=c < cols)
    if tl.atomic_add(sync_ptr + 1, 1, sem="relaxed") == programs - 1:
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed")
        tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed")


def grid_sum_tile(groups, cols):
    """(BLOCK_G, BLOCK_C) of grid_sum_partials: every partial row at once, PARTIAL_COLUMNS columns."""
    return next_power_of_2(groups), min(PARTIAL_COLUMNS, next_power_of_2(cols))
