"""
Step 5 — aligned windows: 16-byte vectors on rows that do not start on 16 bytes
Changed:  step 4's kernels (a row in registers, long rows split over programs that meet through
          L2), but every row is read through its aligned window: the row's first element rounded
          down to a 16-byte boundary, h = the elements before it (0..V-1, V = 16 bytes / element).
          Tiles start on window positions that are multiples of BLOCK, so the address of every
          V-element group is written as (p // V) * V, a multiple the compiler can see; loads are
          masked by whole groups (position < the window's length rounded up to V), and the lanes
          outside the row are then set to -inf (0 backward). Stores must not touch a neighbour's
          row: the groups wholly inside the row go out as 16-byte vectors, and the row's two
          partial end groups as a small scalar tile (one lane a thread), loaded beside the main
          tile rather than reloaded after the reduction. Only rows that start or end inside a
          group pay for that tile and the -inf lanes (EDGES, a host decision): aligned shapes
          compile to step 4's SASS. A split row's forward chunks (16 KB of input) run at 4 warps,
          64 values a thread at 16 bits, 32 at fp32 (8 and 16 before run 9802db57df13; bf16 4096
          x 50257: 409 us at 4 warps, 466 at 8, 608 at 16; only few rows lose, 64 x 131072 21.4
          against 20.1). Before EDGES, aligned shapes paid 2-70% for the edge tile.
Why:      Triton vectorizes an access only where it can prove 16-byte alignment and a mask
          constant over each group, and an integer argument carries that proof only when the
          launch specializes it as divisible by 16. A vocabulary of 50,257 (GPT-2) makes the row
          stride odd: step 4's split kernel then compiles to 2-byte loads (offline SASS, sm_90,
          bf16 8,192-element tile at 16 warps: 16 LDG.E.U16 + 16 STG.E.U16 a thread, 84
          registers, against 2 LDG.E.128 + 2 STG.E.128 and 32 registers with the proof), and so
          do rows of 1,000 bf16 (2,000 bytes: aligned, but 1,000 is not a multiple of 16). The
          suite measured bf16 4096 x 50257 at 0.71x torch (step 2; step 4: 861 GB/s bf16 against
          2,375 fp32 at the same shape). Predicted: bf16 x 50257 near fp32 step 4's bytes rate
          (~2,300 GB/s, >= 1.0x torch at every row count), other shapes as step 4.
Still:    bf16 x 50257 forward stays below torch at 4,096 rows (409 us against torch's 389; the
          backward 510 against 949, in development): a split row's programs wait for each other,
          and a 16-bit chunk converted to fp32 fills twice the registers of its bytes, so fewer
          bytes are in flight an SM than at fp32. A row shorter
          than a group, or tensors whose rows sit at different places in their windows (x
          strided one way, the output another), take the element-wise path, as step 4. The
          window reads up to V-1 elements before and after a row: they lie in the same 16-byte
          block as the row's own ends (never across an allocation's end), and are discarded.
          Tried and dropped: no split at all, one program streaming a whole row twice through
          these windows (step 3's online loop, evict_last then evict_first, 2 programs an SM,
          8,192-position tiles at 16 warps; predicted ~325 us from the loop's aligned rate at
          4,096 x 65,536). Measured in development, H100, forward (us, torch / this step /
          streamed): bf16 4,096 x 50,257 390 / 465 / 605, 512 x 50,257 61 / 67 / 79, 4,096 x
          65,536 679 / 442 / 460, fp32 4,096 x 50,257 1,048 / 683 / 904. The vectors loaded
          (the PTX has ld.global.v4 with the L2 hints), so the bytes were not the gap: the online
          pass takes two exponentials an element where a tile in registers takes one, and one row
          a program leaves ~16 KB of loads in flight between its waits.
Limits:   none (any row length and stride; 64-bit offsets) while the launch has the GPU to
          itself: step 4's spin-wait and its residency condition, unchanged.
Layout:   rows
Mirrors:  CUDA step 5 (load_vec: a vector where it is whole and aligned, elements at the ends)
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import INTERPRET, cdiv, next_power_of_2, sm_count
from rosetta.triton_kernels.row_split import claim, meet  # counters left at zero
from rosetta.triton_launch import tickets  # counters the kernel leaves at zero: one buffer per stream

MAX_TILE = {1: 32768, 2: 16384}  # step 4's register tiles (window positions a program holds)
SPLIT_BYTES = 16384  # a forward chunk: 16 KB of input
SPLIT_TILE_BACKWARD = 4096  # a backward chunk: 4,096 positions of y and of dy


@triton.jit
def _window(r, stride, mis, V: tl.constexpr, WINDOW: tl.constexpr):
    """Row r's window in a tensor `mis` elements past a 16-byte boundary: (h, the row's first
    element's position in its window; the window's offset from the tensor's pointer, a multiple
    of V past the boundary). Without WINDOW the row is its own window (h = 0)."""
    if WINDOW:
        p = mis + r * stride  # the row's first element, counted from the boundary
        return p % V, (p // V) * V - mis
    return r * 0, r * stride


@triton.jit
def _bounds(h, cols, V: tl.constexpr, WINDOW: tl.constexpr):
    """Window positions (each [ROWS]): `reach`, the row's end rounded up to a group (what the
    loads may touch); [body_lo, body_hi), the groups wholly inside the row (16-byte stores)."""
    if WINDOW:
        return (h + cols + V - 1) // V * V, (h + V - 1) // V * V, (h + cols) // V * V
    return h + cols, h, h + cols


@triton.jit
def _edges(h, cols, body_lo, body_hi, first, last, live, V: tl.constexpr, LANES: tl.constexpr):
    """The row's two partial groups (the lanes of its ends outside the body) that lie in window
    positions [first, last): [ROWS, LANES] positions and their mask, lanes 2V on masked off
    (LANES: a lane a thread, so the 2V elements are not copied to every warp)."""
    j = tl.arange(0, LANES)[None, :]
    tail = tl.maximum(body_hi, body_lo)[:, None]  # a row inside one group: its head group holds it
    q = tl.where(j < V, body_lo[:, None] - V + j, tail + j - V)
    keep = (q >= h[:, None]) & (q < h[:, None] + cols) & (q >= first) & (q < last) & live[:, None] & (j < 2 * V)
    return q, keep


@triton.jit
def softmax_window_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    out_ptr,  # output, contiguous rows x cols
    part_ptr,  # float32[2, rows, chunks]: each chunk's max, then its sum of exp(x - max)
    sync_ptr,  # int32[rows + 1] at zero, left at zero: per-row arrival counters, then the ticket counter
    rows,
    cols,
    x_row_stride,
    mis,  # elements from the 16-byte boundary below x's (and the output's) pointer
    chunks,  # chunks per row (1: rows fit a tile)
    chunk_len,  # window positions per chunk: a multiple of BLOCK
    BLOCK: tl.constexpr,  # window positions per tile
    ROWS: tl.constexpr,  # rows per program (1 when split)
    SPLIT: tl.constexpr,  # exchange partials between the chunks of a row
    ONE_TILE: tl.constexpr,  # chunk_len == BLOCK: the chunk stays in registers
    CHUNKS_P2: tl.constexpr,  # next_power_of_2(chunks)
    V: tl.constexpr,  # elements per 16 bytes
    WINDOW: tl.constexpr,  # x and the output share each row's window (host check)
    EDGES: tl.constexpr,  # some row has a partial group at an end (window_of)
    EDGE_LANES: tl.constexpr,  # lanes of the edge tile: max(2V, threads / ROWS)
):
    row, chunk = claim(sync_ptr, rows, chunks, SPLIT)
    r = row * ROWS + tl.arange(0, ROWS)  # 64-bit: r * stride passes 2^31 on big inputs
    live = r < rows
    h, x_off = _window(r, x_row_stride, mis, V, WINDOW)
    _, out_off = _window(r, cols, mis, V, WINDOW)
    reach, body_lo, body_hi = _bounds(h, cols, V, WINDOW)
    x_rows = x_ptr + x_off[:, None]
    out_rows = out_ptr + out_off[:, None]
    first = chunk * chunk_len
    q = first + tl.arange(0, BLOCK)[None, :]
    lo, hi = h[:, None], h[:, None] + cols
    if EDGES:  # the ends' partial groups, element by element, loaded beside the tile (no later round trip)
        q_edge, edge = _edges(h, cols, body_lo, body_hi, first, first + chunk_len, live, V, EDGE_LANES)
        x_edge = tl.load(x_rows + q_edge, mask=edge, other=0.0).to(tl.float32)
    if ONE_TILE:
        # whole groups in (the mask is constant over each: vector loads), then the row's own lanes
        load = live[:, None] & (q < reach[:, None])
        x = tl.load(x_rows + q, mask=load, other=-float("inf")).to(tl.float32)
        if EDGES:  # without, every row starts a window and ends a group: the load's mask is exact
            x = tl.where((q >= lo) & (q < hi), x, -float("inf"))
        m = tl.max(x, axis=1)
        shift = tl.where(m == -float("inf"), 0.0, m)  # an all -inf chunk publishes sum 0 (step 4)
        e = tl.exp(x - shift[:, None])
        d = tl.sum(e, axis=1)
    else:
        m_lane = tl.full([ROWS, BLOCK], -float("inf"), tl.float32)
        d_lane = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, chunk_len, BLOCK):
            qs = q + start
            x = tl.load(x_rows + qs, mask=live[:, None] & (qs < reach[:, None]), other=-float("inf")).to(tl.float32)
            if EDGES:
                x = tl.where((qs >= lo) & (qs < hi), x, -float("inf"))
            m_new = tl.maximum(m_lane, x)
            lane_shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            d_lane = d_lane * tl.exp(m_lane - lane_shift) + tl.exp(x - lane_shift)
            m_lane = m_new
        m = tl.max(m_lane, axis=1)
        shift = tl.where(m == -float("inf"), 0.0, m)
        d = tl.sum(d_lane * tl.exp(m_lane - shift[:, None]), axis=1)
    if SPLIT:  # ROWS == 1: the row's (max, sum) from every chunk's, in chunk order
        k = tl.arange(0, CHUNKS_P2)
        m_part = part_ptr + row * chunks
        d_part = part_ptr + (rows + row) * chunks
        tl.store(m_part + chunk, tl.max(m, axis=0))
        tl.store(d_part + chunk, tl.sum(d, axis=0))
        meet(sync_ptr + row, chunks)
        ms = tl.load(m_part + k, mask=k < chunks, other=-float("inf"), cache_modifier=".cg")
        ds = tl.load(d_part + k, mask=k < chunks, other=0.0, cache_modifier=".cg")
        m_row = tl.max(ms, axis=0)
        d_row = tl.sum(ds * tl.exp(ms - m_row), axis=0)
        scale = tl.exp(shift - m_row) / d_row
    else:
        scale = 1.0 / d
    body = (q >= body_lo[:, None]) & (q < body_hi[:, None]) & live[:, None]  # whole groups only
    if ONE_TILE:
        tl.store(out_rows + q, (e * scale[:, None]).to(out_ptr.dtype.element_ty), mask=body)
    else:
        for start in range(0, chunk_len, BLOCK):  # the second read of the chunk, just after the first
            qs = q + start
            x = tl.load(x_rows + qs, mask=live[:, None] & (qs < reach[:, None]), other=0.0).to(tl.float32)
            y = tl.exp(x - shift[:, None]) * scale[:, None]
            keep = (qs >= body_lo[:, None]) & (qs < body_hi[:, None]) & live[:, None]
            tl.store(out_rows + qs, y.to(out_ptr.dtype.element_ty), mask=keep)
    if EDGES:
        y_edge = tl.exp(x_edge - shift[:, None]) * scale[:, None]
        tl.store(out_rows + q_edge, y_edge.to(out_ptr.dtype.element_ty), mask=edge)


@triton.jit
def softmax_window_backward_kernel(
    y_ptr,  # forward output, rows x cols, unit column stride
    dy_ptr,  # gradient of the output, rows x cols, unit column stride
    dx_ptr,  # gradient of the input, contiguous rows x cols
    part_ptr,  # float32[rows, chunks]: each chunk's partial dot
    sync_ptr,  # int32[rows + 1] at zero, left at zero
    rows,
    cols,
    y_row_stride,
    dy_row_stride,
    mis,  # elements from the 16-byte boundary below y's, dy's and dx's pointers
    chunks,
    chunk_len,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    SPLIT: tl.constexpr,
    ONE_TILE: tl.constexpr,
    CHUNKS_P2: tl.constexpr,
    V: tl.constexpr,
    WINDOW: tl.constexpr,  # y, dy and dx share each row's window
    EDGES: tl.constexpr,
    EDGE_LANES: tl.constexpr,
    EVICT: tl.constexpr,  # the L2 policy of the single-tile path's y and dy loads (step 4's l2_policy)
):
    row, chunk = claim(sync_ptr, rows, chunks, SPLIT)
    r = row * ROWS + tl.arange(0, ROWS)
    live = r < rows
    h, y_off = _window(r, y_row_stride, mis, V, WINDOW)
    _, dy_off = _window(r, dy_row_stride, mis, V, WINDOW)
    _, dx_off = _window(r, cols, mis, V, WINDOW)
    reach, body_lo, body_hi = _bounds(h, cols, V, WINDOW)
    y_rows = y_ptr + y_off[:, None]
    dy_rows = dy_ptr + dy_off[:, None]
    dx_rows = dx_ptr + dx_off[:, None]
    first = chunk * chunk_len
    q = first + tl.arange(0, BLOCK)[None, :]
    lo, hi = h[:, None], h[:, None] + cols
    if EDGES:
        q_edge, edge = _edges(h, cols, body_lo, body_hi, first, first + chunk_len, live, V, EDGE_LANES)
        y_edge = tl.load(y_rows + q_edge, mask=edge, other=0.0).to(tl.float32)
        dy_edge = tl.load(dy_rows + q_edge, mask=edge, other=0.0).to(tl.float32)
    if ONE_TILE:
        load = live[:, None] & (q < reach[:, None])
        y = tl.load(y_rows + q, mask=load, other=0.0, eviction_policy=EVICT).to(tl.float32)
        dy = tl.load(dy_rows + q, mask=load, other=0.0, eviction_policy=EVICT).to(tl.float32)
        if EDGES:  # lanes of other rows may hold inf: zero both factors
            inside = (q >= lo) & (q < hi)
            y, dy = tl.where(inside, y, 0.0), tl.where(inside, dy, 0.0)
        dot = tl.sum(y * dy, axis=1)
    else:
        acc = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, chunk_len, BLOCK):
            qs = q + start
            load = live[:, None] & (qs < reach[:, None])
            prod = (tl.load(y_rows + qs, mask=load, other=0.0).to(tl.float32)
                    * tl.load(dy_rows + qs, mask=load, other=0.0).to(tl.float32))
            if EDGES:
                prod = tl.where((qs >= lo) & (qs < hi), prod, 0.0)
            acc += prod
        dot = tl.sum(acc, axis=1)
    if SPLIT:
        k = tl.arange(0, CHUNKS_P2)
        tl.store(part_ptr + row * chunks + chunk, tl.sum(dot, axis=0))
        meet(sync_ptr + row, chunks)
        parts = tl.load(part_ptr + row * chunks + k, mask=k < chunks, other=0.0, cache_modifier=".cg")
        dot = tl.zeros([ROWS], tl.float32) + tl.sum(parts, axis=0)
    body = (q >= body_lo[:, None]) & (q < body_hi[:, None]) & live[:, None]
    if ONE_TILE:
        tl.store(dx_rows + q, (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=body)
    else:
        for start in range(0, chunk_len, BLOCK):
            qs = q + start
            load = live[:, None] & (qs < reach[:, None])
            y = tl.load(y_rows + qs, mask=load, other=0.0).to(tl.float32)
            dy = tl.load(dy_rows + qs, mask=load, other=0.0).to(tl.float32)
            keep = (qs >= body_lo[:, None]) & (qs < body_hi[:, None]) & live[:, None]
            tl.store(dx_rows + qs, (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=keep)
    if EDGES:
        tl.store(dx_rows + q_edge, (y_edge * (dy_edge - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=edge)


def window_of(out, *inputs):
    """(mis, WINDOW, EDGES, span): where row 0 starts past a 16-byte boundary (in elements; from
    the storage offset, as torch allocates storage on 16 bytes: the pointer itself is not read,
    so a traced fake tensor is judged the same way); whether every tensor's row r starts at the
    same place in its window (the same offset, row strides equal modulo V; the output's stride
    is cols); whether some row starts or ends inside a group; the window positions a row may take
    (span: cols + V - 1 when some row starts inside a group)."""
    size, rows, cols = out.element_size(), out.shape[0], out.shape[1]
    v = 16 // size
    mis = out.storage_offset() % v
    same = all(t.storage_offset() % v == mis and (rows == 1 or (t.stride(0) - cols) % v == 0) for t in inputs)
    if not same or cols < v:  # no whole group to gain
        return 0, False, False, cols
    shifted = mis != 0 or (rows > 1 and cols % v != 0)
    return mis, True, shifted or cols % v != 0, cols + (v - 1 if shifted else 0)


def l2_policy(rows, cols, x):
    """Backward, single tile: evict-last when dx overflows the L2, evict-first when y and dy
    together overflow it but dx fits in 3/4 of it, else none (step 4's rule, CUDA step 5's
    measurements)."""
    if x.device.type != "cuda":
        return ""
    l2, out_bytes = torch.cuda.get_device_properties(x.device).L2_cache_size, rows * cols * x.element_size()
    if out_bytes > l2:
        return "evict_last"
    return "evict_first" if 2 * out_bytes > l2 and 4 * out_bytes <= 3 * l2 else ""


def plan(rows, span, edges, tensors, x):
    """(grid, chunks, chunk_len, meta): step 4's host table over window positions (span)."""
    if span <= (1024 if INTERPRET else MAX_TILE[tensors]):
        block = next_power_of_2(span)
        row_tile = 1 if block >= 1024 else min(2048 // block, next_power_of_2(rows))
        tile = row_tile * block
        warps = (4 if tensors == 1 else 8) if tile <= 2048 else 8 if tile <= 8192 else 16
        meta = dict(BLOCK=block, ROWS=row_tile, SPLIT=False, ONE_TILE=True, CHUNKS_P2=1, num_warps=warps)
        if tensors == 2:
            meta["EVICT"] = l2_policy(rows, span, x)
        return (cdiv(rows, row_tile),), 1, block, meta
    block = SPLIT_BYTES // x.element_size() if tensors == 1 else SPLIT_TILE_BACKWARD
    tiles = cdiv(cdiv(span, block), sm_count(x.device))  # at most one chunk per SM (step 4)
    chunk_len = tiles * block
    chunks = cdiv(span, chunk_len)
    # A forward chunk (16 KB of input) runs at 4 warps: 64 values a thread at 16 bits, 32 at fp32,
    # all loaded before the first is used. The backward's 4,096-position chunks run at 8.
    warps = 4 if tensors == 1 else 8
    meta = dict(BLOCK=block, ROWS=1, SPLIT=True, ONE_TILE=tiles == 1,
                CHUNKS_P2=next_power_of_2(chunks), num_warps=warps)
    if tensors == 2:
        meta["EVICT"] = ""
    return (rows * chunks,), chunks, chunk_len, meta


def with_edges(meta, edges, v):
    """The launch's constexprs with EDGES and the edge tile's lanes (one a thread)."""
    lanes = max(2 * v, next_power_of_2(32 * meta["num_warps"] // meta["ROWS"]))
    return dict(meta, V=v, EDGES=edges, EDGE_LANES=lanes)


def _workspace(meta, rows, chunks, partials, like):
    """The partials and the counters (tickets: left at zero) of a split launch; unread one-element
    placeholders otherwise (distinct tensors: torch.compile's analysis of a user kernel's mutations
    takes one tensor passed as several arguments badly)."""
    device = like.device
    if not meta["SPLIT"]:
        return torch.empty(1, dtype=torch.float32, device=device), torch.empty(1, dtype=torch.int32, device=device)
    return torch.empty(partials * rows * chunks, dtype=torch.float32, device=device), tickets(like, rows + 1)


def launch(x, out):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    mis, window, edges, span = window_of(out, x)
    grid, chunks, chunk_len, meta = plan(rows, span, edges, 1, x)
    part, sync = _workspace(meta, rows, chunks, 2, x)
    wrap_triton(softmax_window_kernel)[grid](x, out, part, sync, rows, cols, x.stride(0), mis, chunks, chunk_len,
                                             WINDOW=window, **with_edges(meta, edges, 16 // x.element_size()))


def launch_backward(y, dy, dx):
    rows, cols = y.shape
    if rows == 0 or cols == 0:
        return
    mis, window, edges, span = window_of(dx, y, dy)
    grid, chunks, chunk_len, meta = plan(rows, span, edges, 2, y)
    part, sync = _workspace(meta, rows, chunks, 1, y)
    wrap_triton(softmax_window_backward_kernel)[grid](y, dy, dx, part, sync, rows, cols, y.stride(0), dy.stride(0),
                                                      mis, chunks, chunk_len, WINDOW=window,
                                                      **with_edges(meta, edges, 16 // y.element_size()))
