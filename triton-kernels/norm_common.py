"""What the rms_norm and layer_norm ladders share: the deterministic sum of dweight (and dbias)
partials, and the persistent grid's size.

The backward's parameter gradients are sums over rows. Atomics would add the rows' terms in
whatever order programs arrive, so the bits would change from run to run; instead every backward
program writes one fp32 partial row (the sum over the rows it did), and `sum_partials` adds those
partial rows in a fixed order: the same shape gives the same bits every run."""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import sm_count

PARTIAL_TILE = 4096  # elements per tile of the partial sum: 16 fp32 per thread at 8 warps
REGISTERS_PER_SM = 65536
WARPS_PER_SM = 64


@triton.jit
def partial_sum_kernel(
    partial_ptr,  # fp32 partials, contiguous (sums, groups, cols): one row per backward program
    out0_ptr,  # sums[0]'s result, (cols,), the weight's dtype
    out1_ptr,  # sums[1]'s result (layer_norm's dbias); unused when there is one sum
    groups,  # partial rows per sum (the backward's grid)
    cols,
    BLOCK_G: tl.constexpr,  # partial rows per tile
    BLOCK_C: tl.constexpr,  # columns per program
):
    c_offs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    which = tl.program_id(1)
    g_offs = tl.arange(0, BLOCK_G)
    base = partial_ptr + which.to(tl.int64) * groups * cols  # 64-bit: sums x groups x cols
    acc = tl.zeros([BLOCK_G, BLOCK_C], tl.float32)
    # A fixed order: tile by tile over the groups, then one tree over the tile's rows (the
    # compiled tl.sum is the same every run), so the result depends on the shape, not the timing.
    for g0 in range(0, groups, BLOCK_G):
        g = g0 + g_offs
        mask = (g < groups)[:, None] & (c_offs < cols)[None, :]
        acc += tl.load(base + g[:, None].to(tl.int64) * cols + c_offs[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    if which == 0:
        tl.store(out0_ptr + c_offs, total.to(out0_ptr.dtype.element_ty), mask=c_offs < cols)
    else:
        tl.store(out1_ptr + c_offs, total.to(out1_ptr.dtype.element_ty), mask=c_offs < cols)


def empty_partials(sums, groups, cols, device):
    """Scratch for the backward's partial rows: every row is written by its program, so no zeroing."""
    return torch.empty((sums, groups, cols), dtype=torch.float32, device=device)


def sum_partials(partial, *outs):
    """outs[k][j] = sum over g of partial[k, g, j], in a fixed order, stored in outs[k]'s dtype.
    The partials are small next to x (groups ~ 2 x SMs rows, and just written: mostly L2 hits), so
    the tile is shaped for many programs: all groups in one tile where they fit, a narrow strip of
    columns each (>= 16 fp32 = 64 bytes: two whole 32-byte sectors per partial row)."""
    sums, groups, cols = partial.shape
    block_g = min(triton.next_power_of_2(groups), 256)
    block_c = min(max(16, PARTIAL_TILE // block_g), triton.next_power_of_2(cols))
    grid = (triton.cdiv(cols, block_c), sums)
    wrap_triton(partial_sum_kernel)[grid](partial, outs[0], outs[-1], groups, cols, BLOCK_G=block_g,
                                          BLOCK_C=block_c, num_warps=8 if block_g * block_c >= 4096 else 4)


def programs(device, tiles, num_warps, values_per_thread, max_per_sm=None):
    """A persistent grid: SMs x the programs one SM holds (warp slots, and registers at an estimated
    32 + values_per_thread per thread), at most `max_per_sm`, never more than there are tiles."""
    registers = 32 * num_warps * min(255, 32 + values_per_thread)
    per_sm = max(1, min(WARPS_PER_SM // num_warps, REGISTERS_PER_SM // registers))
    if max_per_sm is not None:
        per_sm = min(per_sm, max_per_sm)
    return max(1, min(tiles, sm_count(device) * per_sm))
