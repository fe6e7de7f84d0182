"""What the rms_norm and layer_norm ladders share: the deterministic sum of dweight (and dbias)
partials, and the persistent grid's size.

The backward's parameter gradients are sums over rows. Atomics would add the rows' terms in
whatever order programs arrive, so the bits would change from run to run; instead every backward
program writes one fp32 partial row (the sum over the rows it did), and `sum_partials` adds those
partial rows in a fixed order: the same shape gives the same bits every run."""
import functools

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import INTERPRET, cdiv, next_power_of_2, sm_count, tuned

MAX_COLS = 65536  # the longest row the steps hold in one tile (past it, the backward spills ~2 KB)
TILES = (2048, 4096, 8192, 16384)  # elements per tile the persistent steps' autotuner tries
ELEMENTS_PER_THREAD = (8, 16)  # per tensor: fewer leaves loads too short; 32 spills backward (ptxas -v)
PARTIAL_TILE = 4096  # elements per tile of the partial sum: 16 fp32 per thread at 8 warps
REGISTERS_PER_SM = 65536
WARPS_PER_SM = 64


@triton.jit
def column_sum(partial_ptr, rows, out_ptr, cols, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr):
    """out[j] = sum over g < rows of partial[g, j] (fp32 rows of `cols`), for this program's
    BLOCK_C columns, BLOCK_G rows a tile, in a fixed order: the partials' second pass."""
    c_offs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c_offs < cols
    g_offs = tl.arange(0, BLOCK_G)
    acc = tl.zeros([BLOCK_G, BLOCK_C], tl.float32)
    for g0 in range(0, rows, BLOCK_G):
        g = g0 + g_offs
        mask = (g < rows)[:, None] & c_mask[None, :]
        acc += tl.load(partial_ptr + g[:, None].to(tl.int64) * cols + c_offs[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + c_offs, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def partial_sum_kernel(
    partial_ptr,  # fp32 partials, contiguous (groups, cols): one row per backward program
    out_ptr,  # the sum over groups, (cols,), in the weight's dtype
    groups,  # partial rows (the backward's grid)
    cols,
    BLOCK_G: tl.constexpr,  # partial rows per tile
    BLOCK_C: tl.constexpr,  # columns per program
):
    column_sum(partial_ptr, groups, out_ptr, cols, BLOCK_G, BLOCK_C)


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
    block_g = min(next_power_of_2(groups), 256)
    block_c = min(max(16, PARTIAL_TILE // block_g), next_power_of_2(cols))
    for part, out in zip(partial, outs):
        wrap_triton(partial_sum_kernel)[(cdiv(cols, block_c),)](
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


# ---- step 3's forward: step 1's program per row, tuned around it; long rows in chunks ----------
FORWARD_CHUNK = 8192  # the forward's chunk where a row streams (past 65,536 columns; a candidate from 32k)


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


# ---- step 3's backward: persistent partial rows, prefetched tiles, a counted reduction ----------
# Every backward program owns one fp32 partial row (step 2's structure), but the grid's size is
# autotuned (PER_SM programs an SM), so the partials are allocated for the largest grid a config may
# launch and program 0 writes how many rows were written (min(programs, tiles)) into `count`; the
# reduction reads that count on the device: no host sync, no atomics, a fixed order.
PARTIAL_SHARE = 0.03  # the partials' bytes (written, read) at most this share of the backward's 3·n
PARTIAL_COLUMNS = 32  # columns a program of the reduction: 128 bytes (one line) of every fp32 row
PARTIAL_ROWS = 512  # partial rows a tile of the reduction (one round trip for <= 512 programs)
ROW_CHUNKS = (2048, 4096, 8192)  # rows of next_power_of_2 >= 8,192: chunk widths (two passes)


def partial_per_sm(device, rows, element_size):
    """The most programs an SM the backward may run (1, 2 or 4): the largest whose partials,
    written and read (8 bytes a column a program), stay within PARTIAL_SHARE of 3·n."""
    best = 1
    for per_sm in (2, 4):
        if 8 * sm_count(device) * per_sm <= PARTIAL_SHARE * 3 * rows * element_size:
            best = per_sm
    return best


def partial_configs(block, max_per_sm, wide=False, values=(8, 16), chunk_warps=(8, 16)):
    """(ROWS, CHUNK, WARPS, PER_SM) for rows of next_power_of_2 = block. Up to 8,192 the tile
    ROWS x block sits in registers at `values` a thread and tensor; from 8,192 the row may stream
    in chunks (ROW_CHUNKS, one row a tile), past it it must. PER_SM x WARPS <= 16: every program resident (the
    configs carry maxnreg = 64K / (32 x PER_SM x WARPS), so ptxas cannot break that). wide (4-byte
    data): 16 values a thread only at <= 8 warps an SM (ptxas -v, sm_90a: at a 128-register cap
    the prefetched fp32 tiles spill 4-236 B)."""
    found = []
    for per_sm in (1, 2, 4):
        if per_sm > max_per_sm:
            continue
        for warps in (4, 8, 16):
            if not 8 <= per_sm * warps <= 16:  # 8-16 warps an SM: fewer leave too few loads in flight
                continue
            for v in values:
                if wide and v > 8 and per_sm * warps > 8:
                    continue
                tile = v * 32 * warps
                # at most 64 rows a tile: below 16 columns a tile holds fewer values than threads
                if block <= 8192 and tile >= block and (min(tile // block, 64), block, warps, per_sm) not in found:
                    found.append((min(tile // block, 64), block, warps, per_sm))
            for chunk in ROW_CHUNKS:
                v = chunk // (32 * warps)
                if block >= 8192 and chunk < block and warps in chunk_warps and v in values \
                        and not (wide and v > 8 and per_sm * warps > 8):
                    found.append((1, chunk, warps, per_sm))
    return found


def register_cap(per_sm, warps):
    """maxnreg that keeps PER_SM programs of WARPS resident on one SM (ptxas's 255 at most)."""
    return min(255, REGISTERS_PER_SM // (32 * per_sm * warps)) // 8 * 8


@triton.jit
def counted_sum_kernel(
    partial_ptr,  # fp32 (groups, cols): rows [0, count) written by the backward
    count_ptr,  # int32 (1,): how many partial rows the backward wrote
    out_ptr,  # (cols,), in the parameter's dtype
    cols,
    BLOCK_G: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    column_sum(partial_ptr, tl.load(count_ptr), out_ptr, cols, BLOCK_G, BLOCK_C)


@triton.jit
def counted_sum2_kernel(
    partial_ptr,  # fp32 (2, groups, cols): two sums' partial rows
    count_ptr,  # int32 (1,)
    out0_ptr,  # sum of partial[0], (cols,)
    out1_ptr,  # sum of partial[1], (cols,)
    groups,
    cols,
    BLOCK_G: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # grid axis 1 picks the sum: both in one launch (two outputs, neither passed twice).
    count = tl.load(count_ptr)
    if tl.program_id(1) == 0:
        column_sum(partial_ptr, count, out0_ptr, cols, BLOCK_G, BLOCK_C)
    else:
        column_sum(partial_ptr + groups.to(tl.int64) * cols, count, out1_ptr, cols, BLOCK_G, BLOCK_C)


def sum_counted_partials(partial, count, *outs):
    """outs[k][j] = sum over g < count of partial[k, g, j], in a fixed order, one launch: programs
    of PARTIAL_COLUMNS columns (a 128-byte line of every partial row), all of a program's rows
    loaded at once where there are <= PARTIAL_ROWS (a single round trip to L2)."""
    sums, groups, cols = partial.shape
    block_g = min(next_power_of_2(groups), PARTIAL_ROWS)
    block_c = min(PARTIAL_COLUMNS, next_power_of_2(cols))
    warps = 16 if block_g * block_c >= 16384 else 8 if block_g * block_c >= 4096 else 4  # <= 32 fp32 a thread
    grid = (cdiv(cols, block_c), sums)
    if sums == 1:
        wrap_triton(counted_sum_kernel)[grid](partial, count, outs[0], cols, BLOCK_G=block_g,
                                              BLOCK_C=block_c, num_warps=warps)
    else:
        wrap_triton(counted_sum2_kernel)[grid](partial, count, outs[0], outs[1], groups, cols, BLOCK_G=block_g,
                                               BLOCK_C=block_c, num_warps=warps)


# ---- step 4: a row split across the programs of a group, which meet through L2 -----------------
# A group of `slices` consecutive programs shares each of its rows, program s holding columns
# [s * SLICE, (s + 1) * SLICE) of every row the group does, in registers, for the whole launch (so
# the backward's dweight/dbias sums for those columns stay in registers too). Per row, each
# program posts its slice's partial sums, waits for its peers' (share) and adds all of them in
# slice order: the same bits in every program and every run.
SPLIT_VALUES = {2: 16, 4: 8}  # values a thread and tensor (fp32: 8, registers: ptxas -v, sm_90a)
SPLIT_ROW_BYTES = 16384  # a row up to this stays in one program (one slice: nothing to wait for)
SPLIT_SLICE = 2048  # past it, columns a program: 4 warps (fp32: 8), 4 (2) programs an SM
SPLIT_WARPS_PER_SM = 16
# The long-row table against its neighbours (H100, bf16 backward GB/s at 4096 x 32768, layer_norm /
# rms_norm, development run): slices of 2,048 at 16 values a thread, 4 programs an SM (the table)
# 2,282 / 2,710; 2,048 at 8 values (8 warps, 2 an SM) 1,419 / 1,747; 4,096 at 16 (2 an SM) 2,145 /
# 2,600; 4,096 at 8 (1 an SM) 1,233 / 1,412; 1,024 at 8 (4 an SM) 1,361 / 1,597. At 8192 x 16384 the
# same order. Fewer values a thread leave fewer bytes in flight an SM, and more slices more waits.


def split_plan(device, rows, cols, element_size):
    """(SLICE, warps, programs an SM, slices, groups) of a launch. Measured on H100, bf16: rows
    of 4,096 and 8,192 were fastest whole in one program (16 values a thread, 16 warps an SM),
    32,768 in 16 slices of 2,048 at 4 programs an SM (the most waits overlapped), then 8 slices
    of 4,096 at 2, then 4 of 8,192 at 1. Every program of the grid (groups x slices) is resident
    at once, so the programs of a row can wait for each other. Under the interpreter programs
    run one after another and cannot wait: the slice is the whole row."""
    block = next_power_of_2(cols)
    width = block if INTERPRET or block * element_size <= SPLIT_ROW_BYTES else SPLIT_SLICE
    warps = max(1, min(16, width // (32 * SPLIT_VALUES[element_size])))
    per_sm = SPLIT_WARPS_PER_SM // warps
    slices = cdiv(cols, width)
    resident = sm_count(device) * per_sm
    if slices > resident:
        raise ValueError(f"a row of {cols} columns needs {slices} programs resident at once, this GPU holds "
                         f"{resident}: use step 3, which streams long rows")
    return width, warps, per_sm, slices, min(rows, resident // slices)


@functools.cache
def split_kernel(kernel, warps, per_sm):
    """The kernel as a split grid launches it: `warps` warps, registers capped so that `per_sm`
    programs fit an SM, whatever ptxas would have chosen (a program left waiting for an SM would
    leave its peers spinning). A one-config autotuner carries the cap; it times nothing."""
    config = triton.Config({}, num_warps=warps, maxnreg=register_cap(per_sm, warps))
    return triton.autotune(configs=[config], key=["cols"])(kernel)


@triton.jit
def _word(v):
    """An fp32 partial as a 64-bit word a peer can poll: the bits low, a 1 (posted) high. A peer
    sees the whole word or none of it, so no fence orders the value before a flag."""
    return (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (1 << 32)


@triton.jit
def share(part_ptr, row, rows, s, slices, a, b, SLICES_P2: tl.constexpr, PAIR: tl.constexpr):
    """Posts this program's partial a (and b, if PAIR) of `row`'s slice s, spins until every slice
    of the row has posted, and returns all of them in slice order, [SLICES_P2] each (0 past
    `slices`). part_ptr: int64 [2, rows, slices], zeroed before the launch (0: not posted). The
    flag travels in the value's own word: a counter bumped after the values would need a release
    fence (MEMBAR), which waits for every load the thread has in flight, the next row's too."""
    a_row = part_ptr + row * slices
    b_row = part_ptr + (rows + row) * slices
    tl.atomic_xchg(a_row + s, _word(a), sem="relaxed")  # performed at L2, where the peers poll
    if PAIR:
        tl.atomic_xchg(b_row + s, _word(b), sem="relaxed")
    k = tl.arange(0, SLICES_P2)
    mask = k < slices
    # volatile: every poll reads L2, never this SM's L1; past `slices`, a posted 0
    wa = tl.load(a_row + k, mask=mask, other=1 << 32, volatile=True)
    wb = tl.load(b_row + k, mask=mask & PAIR, other=1 << 32, volatile=True)
    while tl.min((wa & wb) >> 32, axis=0) == 0:
        wa = tl.load(a_row + k, mask=mask, other=1 << 32, volatile=True)
        wb = tl.load(b_row + k, mask=mask & PAIR, other=1 << 32, volatile=True)
    return ((wa & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True),
            (wb & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True))


def split_workspace(rows, slices, device):
    """The exchange's words of one launch: int64 [2, rows, slices], zeroed (one memset) where a row
    is split. A whole row (one slice) exchanges nothing: its words are never read, so no memset (a
    launch of ~1 us beside a 4096^2 backward's ~40)."""
    words = torch.empty((2, rows, slices), dtype=torch.int64, device=device)
    return words if slices == 1 else words.zero_()
