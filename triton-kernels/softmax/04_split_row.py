"""
Step 4 — split rows: a long row spread over programs, partials exchanged through L2
Changed:  a row longer than a register tile is cut into chunks, one program each, and the chunk
          stays in that program's registers. Each program publishes its chunk's (max, sum) (the
          backward: its partial dot) to a workspace, bumps the row's arrival counter, spins until
          all of the row's chunks have arrived, combines the partials (fixed order: deterministic)
          and writes its chunk from registers. Short rows: step 1's single load (several rows
          per program below 1,024 elements); the backward's loads are evict-last when dx
          overflows the L2, evict-first when only y and dy do (CUDA step 5's L2 hints). Tiles,
          warps and rows per program: a host table. The counters are triton_launch.tickets,
          zeroed once per stream: the last of a row's programs to arrive sets the row's back to
          zero and the last claim the ticket counter (since run f5c6fd60df7a; before, a zeroed
          buffer a call, whose fill launch was a third of an eager call's host time).
Why:      4,096 rows of 262,144 fp32 are 1 MB each: too big for one SM's registers, so steps
          2-3 read every row twice (8 GB of traffic for 4 GB out, <= 2,000 GB/s). Chunks of
          16 KB fit, and the whole machine works on a few rows at a time: 1 read +
          1 write forward (2·n bytes), 2 + 1 backward (3·n), plus 8 bytes per chunk of
          partials.
Still:    the chunks of a row wait for each other; a row longer than SMs x the chunk tile
          (540 K elements: fp32 forward and every backward; 1.08 M bf16 forward, on 132 SMs) takes each chunk in several tiles and reads it
          twice (the second read right after the first, usually from L2). Under
          TRITON_INTERPRET=1 programs run one after another and cannot wait for each other:
          sm_count is 1 there, so a split row is one chunk (of one or several tiles), and only a
          GPU exercises the exchange between chunks.
Limits:   none (any row length; 64-bit offsets) while the launch has the GPU to itself. The
          spin-wait needs all of a row's chunks (<= SMs: one program per SM) resident at once
          (work is ticketed in start order, so only the newest row waits on unstarted programs);
          other streams' or processes' kernels, or an MPS / green-context SM cap, can hold those
          slots: the row then spins until that work ends, and hangs if it never does.
Layout:   rows
Mirrors:  CUDA step 6 (a long row spread over a cluster), with L2 in place of DSMEM; short
          rows as CUDA step 5
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import INTERPRET, cdiv, next_power_of_2, sm_count
from rosetta.triton_kernels.row_split import claim, meet  # counters left at zero
from rosetta.triton_launch import tickets  # counters the kernel leaves at zero: one buffer per stream

# Register tiles: the longest row one program holds (forward x; backward y and dy): 64 fp32
# values per thread at 16 warps, ~125 of the 128 registers a thread may have at 512 threads.
MAX_TILE = {1: 32768, 2: 16384}
SPLIT_BYTES = 16384  # a forward chunk: 16 KB of input (4,096 fp32, 8,192 bf16/fp16)
SPLIT_TILE_BACKWARD = 4096  # a backward chunk: 4,096 elements of y and of dy
# 16 values per thread and tensor (~90 registers): 2-3 programs per SM overlap each other's waits.


@triton.jit
def softmax_split_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    out_ptr,  # output, contiguous rows x cols
    part_ptr,  # float32[2, rows, chunks]: each chunk's max, then its sum of exp(x - max)
    sync_ptr,  # int32[rows + 1] at zero, left at zero: per-row arrival counters, then the ticket counter
    rows,
    cols,
    x_row_stride,
    chunks,  # chunks per row (1: rows fit a tile)
    chunk_len,  # elements per chunk: a multiple of BLOCK
    BLOCK: tl.constexpr,  # elements per tile
    ROWS: tl.constexpr,  # rows per program (1 when split)
    SPLIT: tl.constexpr,  # exchange partials between the chunks of a row
    ONE_TILE: tl.constexpr,  # chunk_len == BLOCK: the chunk stays in registers
    CHUNKS_P2: tl.constexpr,  # next_power_of_2(chunks)
):
    row, chunk = claim(sync_ptr, rows, chunks, SPLIT)
    r = row * ROWS + tl.arange(0, ROWS)  # 64-bit: r * stride passes 2^31 on big inputs
    c = chunk * chunk_len + tl.arange(0, BLOCK)
    x_rows = x_ptr + r[:, None] * x_row_stride
    out_rows = out_ptr + r[:, None] * cols
    end = tl.minimum(chunk * chunk_len + chunk_len, cols)
    if ONE_TILE:
        mask = (r < rows)[:, None] & (c < end)[None, :]
        # other=-inf: padding loses the max, adds exp(-inf) = 0; padding rows are never stored.
        x = tl.load(x_rows + c[None, :], mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=1)
        # An all -inf chunk of a row with finite values elsewhere must publish sum 0, not
        # exp(-inf - -inf) = NaN: shift it by 0. (An all -inf row ends NaN below, as torch.)
        shift = tl.where(m == -float("inf"), 0.0, m)
        e = tl.exp(x - shift[:, None])
        d = tl.sum(e, axis=1)
    else:
        # A chunk of several tiles (rows past SMs x BLOCK): step 2's per-lane online loop.
        m_lane = tl.full([ROWS, BLOCK], -float("inf"), tl.float32)
        d_lane = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, chunk_len, BLOCK):
            mask = (r < rows)[:, None] & (c + start < end)[None, :]
            x = tl.load(x_rows + c[None, :] + start, mask=mask, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m_lane, x)
            lane_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            d_lane = d_lane * tl.exp(m_lane - lane_shift) + tl.exp(x - lane_shift)
            m_lane = m_new
        m = tl.max(m_lane, axis=1)
        shift = tl.where(m == -float("inf"), 0.0, m)
        d = tl.sum(d_lane * tl.exp(m_lane - shift[:, None]), axis=1)
    if SPLIT:  # ROWS == 1: combine the row's partials into the row's (max, sum)
        k = tl.arange(0, CHUNKS_P2)
        m_part = part_ptr + row * chunks
        d_part = part_ptr + (rows + row) * chunks
        tl.store(m_part + chunk, tl.max(m, axis=0))
        tl.store(d_part + chunk, tl.sum(d, axis=0))
        meet(sync_ptr + row, chunks)
        # .cg: read the partials from L2, where the other SMs' stores are, never from this L1.
        ms = tl.load(m_part + k, mask=k < chunks, other=-float("inf"), cache_modifier=".cg")
        ds = tl.load(d_part + k, mask=k < chunks, other=0.0, cache_modifier=".cg")
        m_row = tl.max(ms, axis=0)
        # exp(-inf - m_row) = 0 drops empty chunks; m_row = -inf (all -inf row) or a NaN/+inf
        # partial sum (+inf or NaN in the row) makes the row's sum NaN: the whole row NaN.
        d_row = tl.sum(ds * tl.exp(ms - m_row), axis=0)
        scale = tl.exp(shift - m_row) / d_row  # [ROWS]: e = exp(x - shift) rescaled to m_row
    else:
        scale = 1.0 / d
    if ONE_TILE:
        tl.store(out_rows + c[None, :], (e * scale[:, None]).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        for start in range(0, chunk_len, BLOCK):  # the second read of the chunk, just after the first
            mask = (r < rows)[:, None] & (c + start < end)[None, :]
            x = tl.load(x_rows + c[None, :] + start, mask=mask, other=0.0).to(tl.float32)
            y = tl.exp(x - shift[:, None]) * scale[:, None]
            tl.store(out_rows + c[None, :] + start, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_split_backward_kernel(
    y_ptr,  # forward output, rows x cols, unit column stride
    dy_ptr,  # gradient of the output, rows x cols, unit column stride
    dx_ptr,  # gradient of the input, contiguous rows x cols
    part_ptr,  # float32[rows, chunks]: each chunk's partial dot
    sync_ptr,  # int32[rows + 1] at zero, left at zero
    rows,
    cols,
    y_row_stride,
    dy_row_stride,
    chunks,
    chunk_len,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    SPLIT: tl.constexpr,
    ONE_TILE: tl.constexpr,
    CHUNKS_P2: tl.constexpr,
    EVICT: tl.constexpr,  # "evict_first", "evict_last" or "": the L2 policy of y's and dy's lines (l2_policy())
):
    row, chunk = claim(sync_ptr, rows, chunks, SPLIT)
    r = row * ROWS + tl.arange(0, ROWS)
    c = chunk * chunk_len + tl.arange(0, BLOCK)
    y_rows = y_ptr + r[:, None] * y_row_stride
    dy_rows = dy_ptr + r[:, None] * dy_row_stride
    dx_rows = dx_ptr + r[:, None] * cols
    end = tl.minimum(chunk * chunk_len + chunk_len, cols)
    if ONE_TILE:
        mask = (r < rows)[:, None] & (c < end)[None, :]
        # other=0: adds 0 to the dot
        y = tl.load(y_rows + c[None, :], mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        dy = tl.load(dy_rows + c[None, :], mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        dot = tl.sum(y * dy, axis=1)
    else:
        acc = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, chunk_len, BLOCK):
            mask = (r < rows)[:, None] & (c + start < end)[None, :]
            acc += (tl.load(y_rows + c[None, :] + start, mask=mask, other=0.0).to(tl.float32)
                    * tl.load(dy_rows + c[None, :] + start, mask=mask, other=0.0).to(tl.float32))
        dot = tl.sum(acc, axis=1)
    if SPLIT:
        k = tl.arange(0, CHUNKS_P2)
        tl.store(part_ptr + row * chunks + chunk, tl.sum(dot, axis=0))
        meet(sync_ptr + row, chunks)
        parts = tl.load(part_ptr + row * chunks + k, mask=k < chunks, other=0.0, cache_modifier=".cg")
        dot = tl.zeros([ROWS], tl.float32) + tl.sum(parts, axis=0)
    if ONE_TILE:
        tl.store(dx_rows + c[None, :], (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        for start in range(0, chunk_len, BLOCK):
            mask = (r < rows)[:, None] & (c + start < end)[None, :]
            y = tl.load(y_rows + c[None, :] + start, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_rows + c[None, :] + start, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_rows + c[None, :] + start, (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=mask)


def l2_policy(rows, cols, x):
    """Backward: the eviction policy of the single-tile path's y and dy loads (CUDA step 5's
    pick_load_hint says why, with its measurements). Evict-last when dx overflows the L2: more of
    dx's dirty lines are still in L2 when the kernel ends. Evict-first when y and dy together
    overflow the L2 but dx fits in 3/4 of it: the inputs, read once, are what the L2 gives up, and
    dx stays in it. Else none."""
    if x.device.type != "cuda":
        return ""
    l2, out_bytes = torch.cuda.get_device_properties(x.device).L2_cache_size, rows * cols * x.element_size()
    if out_bytes > l2:
        return "evict_last"
    return "evict_first" if 2 * out_bytes > l2 and 4 * out_bytes <= 3 * l2 else ""


def plan(rows, cols, tensors, x):
    """(grid, chunks, chunk_len, meta): the host table. `tensors` is 1 forward, 2 backward."""
    # The interpreter splits rows from 1,025 elements on, so CPU tests reach the split path.
    if cols <= (1024 if INTERPRET else MAX_TILE[tensors]):
        block = next_power_of_2(cols)
        # Short rows: one per program as step 1 (measured faster than multi-row tiles), rows
        # under 1,024 elements packed into tiles of 2,048; <= 16 warps (32 caps at 64 registers).
        # Backward tiles of <= 2,048 take 8 warps (two tensors: fp32 4096 x 1024 ran 17.7 us at 8
        # warps, 18.1 at 4, and 18.4 as 2-row tiles of 4 warps, in development).
        row_tile = 1 if block >= 1024 else min(2048 // block, next_power_of_2(rows))
        tile = row_tile * block
        warps = (4 if tensors == 1 else 8) if tile <= 2048 else 8 if tile <= 8192 else 16
        meta = dict(BLOCK=block, ROWS=row_tile, SPLIT=False, ONE_TILE=True, CHUNKS_P2=1, num_warps=warps)
        if tensors == 2:
            meta["EVICT"] = l2_policy(rows, cols, x)
        return (cdiv(rows, row_tile),), 1, block, meta
    block = SPLIT_BYTES // x.element_size() if tensors == 1 else SPLIT_TILE_BACKWARD
    # At most one chunk per SM (deadlock freedom, see Why): longer rows get chunks of several tiles.
    tiles = cdiv(cdiv(cols, block), sm_count(x.device))
    chunk_len = tiles * block
    chunks = cdiv(cols, chunk_len)
    meta = dict(BLOCK=block, ROWS=1, SPLIT=True, ONE_TILE=tiles == 1,
                CHUNKS_P2=next_power_of_2(chunks), num_warps=block // 512)
    if tensors == 2:
        meta["EVICT"] = ""
    return (rows * chunks,), chunks, chunk_len, meta


def launch(x, out):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    grid, chunks, chunk_len, meta = plan(rows, cols, 1, x)
    # unread one-element placeholders for short rows (distinct tensors: torch.compile's analysis
    # of a user kernel's mutations does not take one tensor passed as several arguments)
    part, sync = torch.empty(1, dtype=torch.float32, device=x.device), torch.empty(1, dtype=torch.int32, device=x.device)
    if meta["SPLIT"]:
        part = torch.empty(2 * rows * chunks, dtype=torch.float32, device=x.device)
        sync = tickets(x, rows + 1)
    wrap_triton(softmax_split_kernel)[grid](x, out, part, sync, rows, cols, x.stride(0), chunks, chunk_len, **meta)


def launch_backward(y, dy, dx):
    rows, cols = y.shape
    if rows == 0 or cols == 0:
        return
    grid, chunks, chunk_len, meta = plan(rows, cols, 2, y)
    part, sync = torch.empty(1, dtype=torch.float32, device=y.device), torch.empty(1, dtype=torch.int32, device=y.device)
    if meta["SPLIT"]:
        part = torch.empty(rows * chunks, dtype=torch.float32, device=y.device)
        sync = tickets(y, rows + 1)
    wrap_triton(softmax_split_backward_kernel)[grid](y, dy, dx, part, sync, rows, cols, y.stride(0), dy.stride(0),
                                                     chunks, chunk_len, **meta)
