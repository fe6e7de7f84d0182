"""
Step 3 — persistent programs, tuned per row length: the row in registers when it fits
Changed:  a machine-sized grid (SMs x the programs that fit on one) whose programs walk the rows
          in strides of the grid. Rows up to 32,768 (16,384 backward) take step 1's single load,
          in tiles of ROWS rows x next_power_of_2(cols) (several short rows per tile); longer
          rows take step 2's online loop. The online loop's num_warps is autotuned (keyed on cols
          and the dtypes); the single-load tiles come from a host table (tiles of >= 2,048
          elements: torch's wrap_triton rebuilds an autotuner that has a config pruner on every call, and
          the tile's valid configs depend on cols).
Why:      short rows: a 64-element row is too little for one program; tiles of >= 2,048
          elements give every thread >= 16 loads in flight, and the persistent loop pays the
          program start-up once per SM slot instead of once per row. Rows that fit are
          moved with minimal bytes (1 read + 1 write forward, 2 + 1 backward), so the prediction
          is the copy ceiling's neighbourhood, ~2,600-2,900 GB/s from 4096 x 4096 up, and above
          step 1 on 1,024-wide rows. Long rows: the grid holds only ~1 row per program, so the
          second read of a row hits L2 when (programs x row bytes) fits in its 50 MB: bf16
          131,072 (256 KB rows) partly does; fp32 262,144 (1 MB rows) does not (~2,000 GB/s).
Still:    a row longer than a register tile is still read twice from DRAM when it misses L2, and
          4,096 rows of 1 MB give each program 1 MB of serial work. Step 4 splits such rows
          across programs, each holding its chunk in registers. Measured since (H100, results/
          <gpu>/ablation_softmax_triton_long_rows.txt): L2 hints (evict_last on the first read,
          evict_first on the second) and 2 programs an SM take 4,096 x 65,536 bf16 from 553 to
          422 us and fp32 4,096 x 50,257 from 904 to 741 us; no variant reaches torch's kernel at
          bf16 x 50,257 (541 against 388 us: torch keeps the 100 KB row in shared memory).
Limits:   none (any row length; 64-bit offsets). The first call for each long-row (cols,
          dtype) runs the autotuner.
Layout:   rows
Mirrors:  CUDA step 5 (warp per short row, block per long row, row in registers); the online
          path is CUDA step 4's
"""
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.triton_kernels.common import cdiv, next_power_of_2, sm_count, tuned

# Longest row held in registers, forward (x) and backward (y, dy): 32 fp32 values per thread and
# tensor at 32 warps, where a thread may have 64 registers.
MAX_TILE_COLS = {1: 32768, 2: 16384}
ONLINE_BLOCK = 8192  # elements per step of the online loop
REGISTERS_PER_SM = 65536
WARPS_PER_SM = 64


# Online path: autotuned (keyed on cols and the dtypes). WARPS repeats num_warps as a kernel
# argument: the grid function sees only kernel arguments.
ONLINE_CONFIGS = tuned([triton.Config({"WARPS": warps}, num_warps=warps) for warps in (8, 16)],
                       triton.Config({"WARPS": 4}, num_warps=4))


def tile_plan(rows, cols):
    """The single-load path's table (BLOCK, ROWS, num_warps): rows under 2,048 elements packed
    into tiles of 2,048; 4 warps up to 2,048 elements, 8 up to 8,192, else 16 (32 would cap a
    thread at 64 registers)."""
    block = next_power_of_2(cols)
    row_tile = min(max(1, 2048 // block), next_power_of_2(rows))
    tile = row_tile * block
    return block, row_tile, 4 if tile <= 2048 else 8 if tile <= 8192 else 16


@triton.jit
def softmax_tile_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    out_ptr,  # output, contiguous rows x cols
    rows,
    cols,
    x_row_stride,  # elements between rows of x
    BLOCK: tl.constexpr,  # next_power_of_2(cols): a whole row per tile row
    ROWS: tl.constexpr,  # rows per tile
):
    r_offs = tl.arange(0, ROWS)
    c_offs = tl.arange(0, BLOCK)
    c_mask = c_offs < cols
    # A 64-bit loop counter: r * stride passes 2^31 on big inputs.
    for tile in range(tl.program_id(0).to(tl.int64), tl.cdiv(rows, ROWS), tl.num_programs(0)):
        r = tile * ROWS + r_offs
        mask = (r < rows)[:, None] & c_mask[None, :]
        # other=-inf: padding columns lose the max and add 0 to the sum; padding rows (past the
        # last row) are all -inf, give NaN, and are never stored.
        x = tl.load(x_ptr + r[:, None] * x_row_stride + c_offs[None, :], mask=mask,
                    other=-float("inf")).to(tl.float32)
        # Max first (exp(x - max) <= 1); all -inf -> NaN, +inf/NaN -> NaN, as torch.
        e = tl.exp(x - tl.max(x, axis=1)[:, None])
        inv = 1.0 / tl.sum(e, axis=1)
        tl.store(out_ptr + r[:, None] * cols + c_offs[None, :], (e * inv[:, None]).to(out_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def softmax_tile_backward_kernel(
    y_ptr,  # forward output, rows x cols, unit column stride
    dy_ptr,  # gradient of the output, rows x cols, unit column stride
    dx_ptr,  # gradient of the input, contiguous rows x cols
    rows,
    cols,
    y_row_stride,
    dy_row_stride,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
):
    r_offs = tl.arange(0, ROWS)
    c_offs = tl.arange(0, BLOCK)
    c_mask = c_offs < cols
    for tile in range(tl.program_id(0).to(tl.int64), tl.cdiv(rows, ROWS), tl.num_programs(0)):
        r = tile * ROWS + r_offs
        mask = (r < rows)[:, None] & c_mask[None, :]
        # other=0: padding adds y*dy = 0 to the dot.
        y = tl.load(y_ptr + r[:, None] * y_row_stride + c_offs[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + r[:, None] * dy_row_stride + c_offs[None, :], mask=mask, other=0.0).to(tl.float32)
        dot = tl.sum(y * dy, axis=1)
        tl.store(dx_ptr + r[:, None] * cols + c_offs[None, :], (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty),
                 mask=mask)


@triton.autotune(configs=ONLINE_CONFIGS, key=["cols"])
@triton.jit
def softmax_online_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    out_ptr,  # output, contiguous rows x cols
    rows,
    cols,  # > MAX_TILE_COLS[1]; the autotune key
    x_row_stride,
    BLOCK: tl.constexpr,  # elements per loop step
    WARPS: tl.constexpr,  # num_warps, read by the grid function
):
    offs = tl.arange(0, BLOCK)
    for row in range(tl.program_id(0).to(tl.int64), rows, tl.num_programs(0)):  # 64-bit row
        x_row = x_ptr + row * x_row_stride
        out_row = out_ptr + row * cols
        # Step 2's per-lane running (max, sum), with the same guard: a lane that has seen only
        # -inf shifts by 0, so exp(-inf - -inf) = NaN never enters its sum.
        m = tl.full([BLOCK], -float("inf"), tl.float32)
        d = tl.zeros([BLOCK], tl.float32)
        for start in range(0, cols, BLOCK):
            x = tl.load(x_row + start + offs, mask=start + offs < cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, x)
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            d = d * tl.exp(m - shift) + tl.exp(x - shift)
            m = m_new
        m_row = tl.max(m, axis=0)
        shift = tl.where(m_row == -float("inf"), 0.0, m_row)
        inv = 1.0 / tl.sum(d * tl.exp(m - shift), axis=0)
        # Second read: the same row a few microseconds later, an L2 hit when the grid's rows in
        # flight fit in L2.
        for start in range(0, cols, BLOCK):
            mask = start + offs < cols
            x = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_row + start + offs, (tl.exp(x - m_row) * inv).to(out_ptr.dtype.element_ty), mask=mask)


@triton.autotune(configs=ONLINE_CONFIGS, key=["cols"])
@triton.jit
def softmax_online_backward_kernel(
    y_ptr,  # forward output, rows x cols, unit column stride
    dy_ptr,  # gradient of the output, rows x cols, unit column stride
    dx_ptr,  # gradient of the input, contiguous rows x cols
    rows,
    cols,
    y_row_stride,
    dy_row_stride,
    BLOCK: tl.constexpr,
    WARPS: tl.constexpr,
):
    offs = tl.arange(0, BLOCK)
    for row in range(tl.program_id(0).to(tl.int64), rows, tl.num_programs(0)):  # 64-bit row
        y_row = y_ptr + row * y_row_stride
        dy_row = dy_ptr + row * dy_row_stride
        dx_row = dx_ptr + row * cols
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, cols, BLOCK):
            mask = start + offs < cols
            y = tl.load(y_row + start + offs, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + start + offs, mask=mask, other=0.0).to(tl.float32)
            acc += y * dy
        dot = tl.sum(acc, axis=0)
        for start in range(0, cols, BLOCK):
            mask = start + offs < cols
            y = tl.load(y_row + start + offs, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + start + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_row + start + offs, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


def programs(device, tiles, num_warps, values_per_thread):
    """The persistent grid: SMs x the programs one SM holds (warp slots, and registers at an
    estimated 32 + values_per_thread per thread), never more than there are tiles."""
    registers = 32 * num_warps * min(255, 32 + values_per_thread)
    per_sm = max(1, min(WARPS_PER_SM // num_warps, REGISTERS_PER_SM // registers))
    return min(tiles, sm_count(device) * per_sm)


def online_grid(x, rows, tensors):
    # ~1 row per program, so few rows are in flight and their second read can hit L2.
    return lambda meta: (programs(x.device, rows, meta["WARPS"],
                                  3 * tensors * ONLINE_BLOCK // (32 * meta["WARPS"])),)


def launch(x, out):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    if cols <= MAX_TILE_COLS[1]:
        block, row_tile, warps = tile_plan(rows, cols)
        grid = (programs(x.device, cdiv(rows, row_tile), warps, row_tile * block // (32 * warps)),)
        wrap_triton(softmax_tile_kernel)[grid](x, out, rows, cols, x.stride(0), BLOCK=block, ROWS=row_tile,
                                               num_warps=warps)
    else:
        wrap_triton(softmax_online_kernel)[online_grid(x, rows, 1)](
            x, out, rows, cols, x.stride(0), BLOCK=ONLINE_BLOCK)


def launch_backward(y, dy, dx):
    rows, cols = y.shape
    if rows == 0 or cols == 0:
        return
    if cols <= MAX_TILE_COLS[2]:
        block, row_tile, warps = tile_plan(rows, cols)
        grid = (programs(y.device, cdiv(rows, row_tile), warps, 2 * row_tile * block // (32 * warps)),)
        wrap_triton(softmax_tile_backward_kernel)[grid](y, dy, dx, rows, cols, y.stride(0), dy.stride(0),
                                                        BLOCK=block, ROWS=row_tile, num_warps=warps)
    else:
        wrap_triton(softmax_online_backward_kernel)[online_grid(y, rows, 2)](
            y, dy, dx, rows, cols, y.stride(0), dy.stride(0), BLOCK=ONLINE_BLOCK)
