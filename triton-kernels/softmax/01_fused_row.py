"""
Step 1 — fused row: one program per row, the whole row in registers
Changed:  the starting point (the Triton tutorial's fused softmax): program r loads row r once into
          a BLOCK = next_power_of_2(cols) register tile, takes its max, exponentiates, sums,
          scales by 1/sum and stores. Backward: loads y and dy once, dot = sum(y*dy), stores
          dx = y*(dy - dot). num_warps grows with BLOCK (4 up to 2,048 elements ... 32 at 32,768).
Why:      the row never leaves the chip, so the op moves its minimal bytes: 1 read + 1 write
          forward (2·n·bytes), 2 reads + 1 write backward (3·n·bytes). The max, the sum and the
          dot are tl.max/tl.sum: the in-register + shuffle + shared-memory trees that CUDA steps
          2-3 write by hand.
Still:    one row per program: a 1,024-element fp32 row gives 4 warps 8 elements per thread,
          too little work per program to hide the launch and DRAM latency; and the tile is the
          whole row, so rows past 32,768 do not fit (step 2 loops over the row).
Limits:   cols <= 32768: at 32 warps (1,024 threads) a thread may have 64 registers, and a
          32,768-element row is 32 fp32 values per thread: 62 registers forward, a ~100-byte
          spill backward (y and dy). 65,536 would spill ~150 B forward, ~550 B backward (ptxas
          -v, sm_90a). Longer rows: steps 2-4.
Max:      cols <= 32768
Layout:   rows
Mirrors:  CUDA step 5 (block per row, row in registers, 1 read + 1 write)
"""
import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import next_power_of_2


@triton.jit
def softmax_row_kernel(
    x_ptr,  # input, rows x cols, unit column stride
    out_ptr,  # output, contiguous rows x cols
    cols,  # row length
    x_row_stride,  # elements between rows of x (>= cols: x may be a slice of a wider tensor)
    BLOCK: tl.constexpr,  # next_power_of_2(cols): the whole row in one tile
):
    row = tl.program_id(0).to(tl.int64)  # 64-bit: row * stride passes 2^31 on big inputs
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    # other=-inf: padding lanes lose the max and add exp(-inf - max) = 0 to the sum.
    x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=-float("inf")).to(tl.float32)
    # Subtract the max first: exp(x) overflows at x = 89; exp(x - max) <= 1. An all -inf row gives
    # max = -inf and exp(NaN) = NaN everywhere, as torch does; a +inf or NaN makes the sum NaN.
    e = tl.exp(x - tl.max(x, axis=0))
    inv = 1.0 / tl.sum(e, axis=0)  # one division per row, a multiply per element
    tl.store(out_ptr + row * cols + offs, (e * inv).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_row_backward_kernel(
    y_ptr,  # forward output, rows x cols, unit column stride
    dy_ptr,  # gradient of the output, rows x cols, unit column stride
    dx_ptr,  # gradient of the input, contiguous rows x cols
    cols,
    y_row_stride,
    dy_row_stride,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    # other=0: padding lanes add y*dy = 0 to the dot.
    y = tl.load(y_ptr + row * y_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * dy_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=0)
    tl.store(dx_ptr + row * cols + offs, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


def warps_for(block):
    """~16 elements per thread up to 32 warps (the tile sizes num_warps, as in the tutorial)."""
    return 4 if block <= 2048 else 8 if block <= 8192 else 16 if block <= 16384 else 32


def launch(x, out):
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return
    block = next_power_of_2(cols)
    wrap_triton(softmax_row_kernel)[(rows,)](x, out, cols, x.stride(0), BLOCK=block,
                                             num_warps=warps_for(block))


def launch_backward(y, dy, dx):
    rows, cols = y.shape
    if rows == 0 or cols == 0:
        return
    block = next_power_of_2(cols)
    wrap_triton(softmax_row_backward_kernel)[(rows,)](y, dy, dx, cols, y.stride(0), dy.stride(0),
                                                      BLOCK=block, num_warps=warps_for(block))
