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

from rosetta.triton_kernels.common import sm_count, tuned

MAX_COLS = 65536  # the longest row the steps hold in one tile (past it, the backward spills ~2 KB)
TILES = (2048, 4096, 8192, 16384)  # elements per tile the persistent steps' autotuner tries
ELEMENTS_PER_THREAD = (8, 16)  # per tensor: fewer leaves loads too short; 32 spills backward (ptxas -v)
PARTIAL_TILE = 4096  # elements per tile of the partial sum: 16 fp32 per thread at 8 warps
REGISTERS_PER_SM = 65536
WARPS_PER_SM = 64


@triton.jit
def partial_sum_kernel(
    partial_ptr,  # fp32 partials, contiguous (groups, cols): one row per backward program
    out_ptr,  # the sum over groups, (cols,), in the weight's dtype
    groups,  # partial rows (the backward's grid)
    cols,
    BLOCK_G: tl.constexpr,  # partial rows per tile
    BLOCK_C: tl.constexpr,  # columns per program
):
    c_offs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    g_offs = tl.arange(0, BLOCK_G)
    acc = tl.zeros([BLOCK_G, BLOCK_C], tl.float32)
    for g0 in range(0, groups, BLOCK_G):
        g = g0 + g_offs
        mask = (g < groups)[:, None] & (c_offs < cols)[None, :]
        acc += tl.load(partial_ptr + g[:, None].to(tl.int64) * cols + c_offs[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + c_offs, total.to(out_ptr.dtype.element_ty), mask=c_offs < cols)


def empty_partials(sums, groups, cols, device):
    """Scratch for the backward's partial rows: every row is written by its program, so no zeroing."""
    return torch.empty((sums, groups, cols), dtype=torch.float32, device=device)


def sum_partials(partial, *outs):
    """outs[k][j] = sum over g of partial[k, g, j], in a fixed order, stored in outs[k]'s dtype:
    one launch per output, each kernel writing one tensor (an output passed twice to one launch
    would alias two mutated arguments, which torch.compile's functionalization keeps apart and
    then loses one of). The partials are small next to x (groups ~ 2 x SMs rows, and just written:
    mostly L2 hits), so the tile is shaped for many programs: all groups in one tile where they
    fit, a narrow strip of columns each (>= 16 fp32 = 64 bytes: two whole 32-byte sectors per
    partial row)."""
    _, groups, cols = partial.shape
    block_g = min(triton.next_power_of_2(groups), 256)
    block_c = min(max(16, PARTIAL_TILE // block_g), triton.next_power_of_2(cols))
    for part, out in zip(partial, outs):
        wrap_triton(partial_sum_kernel)[(triton.cdiv(cols, block_c),)](
            part, out, groups, cols, BLOCK_G=block_g, BLOCK_C=block_c, num_warps=8 if block_g * block_c >= 4096 else 4)


def check_cols(cols, step: str):
    """A row longer than one tile is refused before launch (the steps' `Max: cols` line)."""
    if cols > MAX_COLS:
        raise ValueError(f"{step} holds a row in one tile: cols <= {MAX_COLS}, got {cols}")


def warps_for(block):
    """~16 elements per thread up to 32 warps (the tile sizes num_warps, as in the tutorial)."""
    return 4 if block <= 2048 else 8 if block <= 8192 else 16 if block <= 16384 else 32


def configs_for(block):
    """Configs (ROWS, WARPS) for rows of next_power_of_2 = block: every tile in TILES that holds at
    least one row, at 8-16 elements per thread; a row past the largest tile gets 32 warps."""
    lo, hi = ELEMENTS_PER_THREAD
    pairs = [(tile // block, warps) for tile in TILES if tile >= block for warps in (4, 8, 16, 32)
             if lo <= tile // (32 * warps) <= hi]
    pairs = pairs or [(1, 32)]
    configs = [triton.Config({"ROWS": rows, "WARPS": warps}, num_warps=warps) for rows, warps in pairs]
    return tuned(configs, configs[0])


def programs(device, tiles, num_warps, values_per_thread, max_per_sm=None):
    """A persistent grid: SMs x the programs one SM holds (warp slots, and registers at an estimated
    32 + values_per_thread per thread), at most `max_per_sm`, never more than there are tiles."""
    registers = 32 * num_warps * min(255, 32 + values_per_thread)
    per_sm = max(1, min(WARPS_PER_SM // num_warps, REGISTERS_PER_SM // registers))
    if max_per_sm is not None:
        per_sm = min(per_sm, max_per_sm)
    return max(1, min(tiles, sm_count(device) * per_sm))
