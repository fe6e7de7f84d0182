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


# ---- step 3: the dweight (and dbias) sums in column strips, no partials ------------------------
# Step 3's backward gives every program a strip of columns for the parameter gradients: after its
# own rows of a wave (the grid's rows of one sweep), a program reads its strip of that wave's rows
# (x, dy and the statistics, just loaded by the other programs: L2 hits) and adds dy * xhat into
# fp32 registers. Each column is summed by one program in a fixed order: deterministic, no
# workspace, no second kernel.
MAX_STRIP = 512  # columns per strip at most: past SMs x 512 columns, more programs
STRIP_ALIGN = 16  # strip starts on 16 elements: 32-byte sectors for 16-bit types, 64 for fp32
STRIP_VALUES = 8  # strip tile per thread and tensor: one 16-byte vector of bf16 (rms_norm)
FORWARD_CHUNK = 8192  # the forward's chunk where a row streams (past 65,536 columns; a candidate from 32k)
BACKWARD_CHUNKS = (4096, 8192)  # long rows: the backward's chunk widths (two passes, one from L2)
BACKWARD_WARPS_PER_SM = 16  # ~128 registers a thread: 16 warps fill an SM's 64K registers


def strip_programs(device, cols, per_sm):
    """The backward grid: per_sm programs an SM, more where cols would give a strip > MAX_STRIP."""
    return max(sm_count(device) * per_sm, triton.cdiv(cols, MAX_STRIP))


def strip_width(cols, programs):
    """Columns of each program's strip (the kernel computes the same from num_programs)."""
    return triton.cdiv(triton.cdiv(cols, programs), STRIP_ALIGN) * STRIP_ALIGN


def strip_block(device, cols, min_per_sm):
    """The strip's register tile: a power of two >= the widest strip any config's grid gives."""
    return triton.next_power_of_2(strip_width(cols, strip_programs(device, cols, min_per_sm)))


def backward_pairs(block, chunk_warps=(8, 16), shared_sm=True):
    """(ROWS, CHUNK, WARPS, PER_SM) candidates for rows of next_power_of_2 = block. Up to 8,192
    columns the row tile sits whole in registers (CHUNK = block) at 8-16 values a thread and
    tensor; from 8,192 up rows may stream in chunks of 4,096-8,192 (two passes). ptxas -v, sm_90a:
    these kernels take 100-128 registers a thread at 4-16 warps, and 32 warps (64 allowed) spill,
    so WARPS <= 16 and PER_SM x WARPS <= BACKWARD_WARPS_PER_SM: every program of the grid is
    resident at once (the strips count on the wave being in L2 together). chunk_warps: the warps
    the chunked kernel may take (layer_norm's two pass-1 sums take 170 registers at 8 warps).
    shared_sm=False (fp32 data: up to 194 registers at 8 warps) leaves one program an SM, the
    only count whose residency holds whatever ptxas allocates."""
    lo, hi = ELEMENTS_PER_THREAD
    found = []
    if block <= 8192:
        for tile in TILES:
            for warps in (4, 8, 16):
                if tile >= block and lo <= tile // (32 * warps) <= hi:
                    found += [(tile // block, block, warps, per_sm) for per_sm in (1, 2, 4)
                              if per_sm * warps <= BACKWARD_WARPS_PER_SM and (shared_sm or per_sm == 1)]
    if block >= 8192:
        for chunk in BACKWARD_CHUNKS:
            for warps in chunk_warps:
                if chunk < block and lo <= chunk // (32 * warps) <= hi:
                    found += [(1, chunk, warps, per_sm) for per_sm in (1, 2)
                              if per_sm * warps <= BACKWARD_WARPS_PER_SM and (shared_sm or per_sm == 1)]
    return found


def forward_pairs(block):
    """(ROWS, CHUNK, WARPS) candidates of the forward (a program per ROWS rows, not persistent):
    step 1's own (one row, warps_for(block)) first, then half and twice its warps and, for rows
    of <= 2,048, two and four rows a program, all within 4-32 values a thread. Past 65,536
    columns: chunks of FORWARD_CHUNK, two passes."""
    if block > MAX_COLS:
        return [(1, FORWARD_CHUNK, 16)]
    base = warps_for(block)
    chunked = [(1, FORWARD_CHUNK, 16)] if block >= 4 * FORWARD_CHUNK else []  # a hedge against spills
    found = [(1, block, base)]
    for rows, warps in ((1, base // 2), (1, base * 2), (2, base), (4, base), (2, base * 2)):
        per_thread = rows * block // (32 * max(warps, 1))
        if 4 <= warps <= 32 and 4 <= per_thread <= 32 and (rows == 1 or block <= 2048) \
                and (rows, block, warps) not in found:
            found.append((rows, block, warps))
    return found + chunked
