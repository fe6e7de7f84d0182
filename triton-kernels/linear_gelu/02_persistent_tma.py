"""
Step 2 — persistent TMA kernel with the fused epilogues
Changed:  matmul step 5's kernel (one program per SM walking tiles in grouped order, loop over
          tiles flattened with the K loop, operands by device-side tensor descriptors, a
          transposed operand described as it lies in memory and flipped with .T) with step 1's
          epilogues: bias + GELU then a TMA store of the tile; backward, the dy tile also
          arrives by TMA, dz leaves by TMA into 16-byte rows of scratch, and its fp32 column
          sums go to the partials. da = dz W^T and dweight = a^T dz are this kernel with no
          epilogue (W^T, a^T: descriptors of what lies in memory). Autotuned; the backward's
          dz GEMM has its own list (its epilogue stages dy in shared memory too).
Why:      step 1 moves a 128 x 256 x 64 K-step's 48 KB as 3,072 16-byte cp.async, each with its
          own address and mask, from the warps that issue wgmma (4.2 MFLOP, ~0.56 us per SM);
          one TMA instruction per operand does it here, and the edge fill is hardware's. A
          persistent program pays the pipeline fill once per SM, and flattened, the next tile's
          first loads are in flight during this tile's epilogue (~2.2 us of MUFU per 128 x 256
          tile, a third of the MMA time at GPT-2's K = 768). The dz epilogue's 64 KB of dy is
          one TMA load instead of 4,096 masked 16-byte loads.
Still:    the epilogue runs on the warps that issue wgmma, so the tensor cores idle while the
          tile's GELU runs and its dy arrives (loaded after the K loop, not prefetched); the
          backward still writes dz and reads it twice (da, dweight GEMMs).
Limits:   a and weight (and dy) as TMA reads them (Layout tma: the dispatcher copies others
          into 16-byte rows; a direct call with such a matrix raises ValueError). out, da or
          dweight rows that are not 16-byte multiples (N or K not a multiple of 8) are stored
          with masked pointer stores (constexpr OUT_TMA) instead of TMA.
Dtypes:   bfloat16, float16
Layout:   tma
Mirrors:  CUDA step 2 (the fused epilogue in matmul step 13's persistent TMA + wgmma GEMM),
          without its clusters and warp-specialized producer; CUDA step 1's separate pass has no
          Triton counterpart
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from rosetta.ops.matmul import address, is_column_major
from rosetta.triton_kernels.common import cdiv, sm_count, tuned
from rosetta.triton_kernels.gemm_epilogue import (GELU, GELU_GRAD, NONE, bias_partials, gelu, gelu_grad,
                                                  load_bias, store_column_partials, sum_bias)
from rosetta.triton_kernels.tma import load_operands, operand_descriptors, set_descriptor_allocator, tile_coords


def config(bm, bn, bk, warps, stages):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                         num_warps=warps, num_stages=stages)


INTERPRET_CONFIG = config(64, 64, 32, 4, 1)
# Forward (and the backward's plain GEMMs): matmul step 5's tiles. Shared memory at 128 x 256 x 64:
# 3 stages x 48 KB + the 64 KB output tile = 208 KB of the 227 KB an SM gives a block.
CONFIGS = tuned([config(*c) for c in [
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
]], INTERPRET_CONFIG)
# The dz GEMM stages the dy tile too: 128 x 256 fits only 2 stages (2 x 48 + 64 dy + 64 dz = 224 KB);
# 128 x 128 x 4 stages is 128 + 32 + 32 = 192 KB. Every BLOCK_M a multiple of PARTIAL_M (64).
GRAD_CONFIGS = tuned([config(*c) for c in [
    (128, 256, 64, 8, 2),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 3),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
]], INTERPRET_CONFIG)
KEY = ["M", "N", "K", "A_COLS", "B_COLS", "DY_COLS", "OUT_TMA", "EPILOGUE"]


@triton.jit
def linear_gelu_persistent_kernel(
    a_ptr,  # A, M x K, row- or column-major, leading stride 16-byte aligned
    b_ptr,  # B, K x N, row- or column-major, leading stride 16-byte aligned
    bias_ptr,  # (N,), read by the GELU epilogues
    dy_ptr,  # M x N, row- or column-major, 16-byte aligned rows (GELU_GRAD)
    out_ptr,  # M x N, unit column stride: out, dz, da or dweight
    partial_ptr,  # fp32 (num_partials, N): dbias's column partials (GELU_GRAD)
    M, N, K,
    lda, ldb, lddy, stride_om, stride_bias,  # leading strides in elements (the other stride is 1)
    num_partials,
    A_COLS: tl.constexpr,  # A is column-major: memory holds A^T, K x M row-major
    B_COLS: tl.constexpr,  # B is column-major: memory holds B^T, N x K row-major
    DY_COLS: tl.constexpr,  # dy is column-major
    OUT_TMA: tl.constexpr,  # out's rows are 16-byte multiples: TMA store, else masked stores
    HAS_K: tl.constexpr,  # K > 0 (TMA cannot describe an empty K extent: z = bias)
    EPILOGUE: tl.constexpr,  # NONE, GELU or GELU_GRAD (gemm_epilogue.py)
    NUM_SMS: tl.constexpr,  # grid size: one program per SM
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    dtype = out_ptr.dtype.element_ty
    if HAS_K:
        a_desc, b_desc = operand_descriptors(a_ptr, b_ptr, M, N, K, lda, ldb, A_COLS, B_COLS,
                                             BLOCK_M, BLOCK_N, BLOCK_K)
    if EPILOGUE == GELU_GRAD:  # dy described as it lies in memory, like the operands
        if DY_COLS:
            dy_desc = tl.make_tensor_descriptor(dy_ptr, shape=[N, M], strides=[lddy, 1],
                                                block_shape=[BLOCK_N, BLOCK_M])
        else:
            dy_desc = tl.make_tensor_descriptor(dy_ptr, shape=[M, N], strides=[lddy, 1],
                                                block_shape=[BLOCK_M, BLOCK_N])
    if OUT_TMA:
        c_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[stride_om, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if HAS_K:
            for ki in range(k_tiles):
                a, b = load_operands(a_desc, b_desc, ki, off_m, off_n, A_COLS, B_COLS, BLOCK_K)
                acc = tl.dot(a, b, acc)
        cols = off_n + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        if EPILOGUE == GELU:
            acc = gelu(acc + load_bias(bias_ptr, cols, col_ok, stride_bias)[None, :])
        elif EPILOGUE == GELU_GRAD:
            z = acc + load_bias(bias_ptr, cols, col_ok, stride_bias)[None, :]
            # rows past M and columns past N arrive as dy = 0 (TMA's fill): dz = 0 there
            if DY_COLS:
                dy = dy_desc.load([off_n, off_m]).T
            else:
                dy = dy_desc.load([off_m, off_n])
            acc = dy.to(tl.float32) * gelu_grad(z)
            store_column_partials(acc, partial_ptr, pid_m, cols, col_ok, N, num_partials, BLOCK_M, BLOCK_N)
        if OUT_TMA:
            c_desc.store([off_m, off_n], acc.to(dtype))  # out-of-bounds parts are clipped
        else:
            rows = off_m.to(tl.int64) + tl.arange(0, BLOCK_M)  # int64: rows x stride > 2^31
            tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(dtype),
                     mask=(rows < M)[:, None] & col_ok[None, :])


# one kernel under two tuners (matmul step 4's way); the key holds every layout flag
tuned_kernel = triton.autotune(configs=CONFIGS, key=KEY)(linear_gelu_persistent_kernel)
grad_tuned_kernel = triton.autotune(configs=GRAD_CONFIGS, key=KEY)(linear_gelu_persistent_kernel)


def tma_matrix(name, t):
    """(column_major, leading stride) of a 2-D matrix as its TMA descriptor describes it, or
    ValueError when TMA cannot read it. A single row (column) never steps its leading stride, so
    any 16-byte multiple stands in for it there (a (1, K) view may have stride K or 1)."""
    cols = is_column_major(t)
    lead = 1 if cols else 0
    per = 16 // t.element_size()
    ld = t.stride(lead)
    if t.shape[lead] <= 1:
        ld = max(per, cdiv(t.shape[1 - lead], per) * per)
    if (t.shape[1 - lead] > 1 and t.stride(1 - lead) != 1) or (ld * t.element_size()) % 16 or address(t) % 16:
        raise ValueError(
            f"linear_gelu step 2 loads {name} through TMA: it needs a row- or column-major matrix "
            f"with a 16-byte aligned base and a leading stride that is a multiple of 16 bytes; got "
            f"shape {tuple(t.shape)}, strides {t.stride()}, address % 16 = {address(t) % 16}. "
            f"Step 1 takes any strides.")
    return cols, ld


def out_tma(out):
    """Whether out's rows can be stored by TMA (16-byte multiples, aligned base)."""
    return out.stride(1) == 1 and (out.stride(0) * out.element_size()) % 16 == 0 and address(out) % 16 == 0


def gemm(x, y, out, epilogue, bias=None, dy=None, partial=None):
    """out = epilogue(x @ y) on one program per SM. Arguments an epilogue does not read get x, an
    input (never an output: the kernel must not look like it writes into a tensor twice)."""
    M, K = x.shape
    N = y.shape[1]
    if M == 0 or N == 0:
        return
    x_cols, ldx = tma_matrix("a", x) if K else (False, 0)
    y_cols, ldy = tma_matrix("weight", y) if K else (False, 0)
    dy_cols, lddy = tma_matrix("dy", dy) if epilogue == GELU_GRAD else (False, 0)
    bias = x if bias is None else bias
    dy = x if dy is None else dy
    partial = x if partial is None else partial
    num_partials = partial.shape[1] if epilogue == GELU_GRAD else 0
    set_descriptor_allocator(x.device)
    num_sms = sm_count(x.device)
    kernel = grad_tuned_kernel if epilogue == GELU_GRAD else tuned_kernel
    grid = lambda meta: (min(num_sms, cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])),)  # noqa: E731
    wrap_triton(kernel)[grid](
        x, y, bias, dy, out, partial, M, N, K, ldx, ldy, lddy, out.stride(0), bias.stride(0), num_partials,
        A_COLS=x_cols, B_COLS=y_cols, DY_COLS=dy_cols, OUT_TMA=out_tma(out), HAS_K=K > 0,
        EPILOGUE=epilogue, NUM_SMS=num_sms)


def launch(a, weight, bias, out):
    gemm(a, weight, out, GELU, bias=bias)


def launch_backward(a, weight, bias, dy, da, dweight, dbias):
    M, K = a.shape
    N = weight.shape[1]
    if M == 0:  # sums over no rows
        dweight.zero_()
        dbias.zero_()
        return
    if N == 0:  # da = dz W^T sums over no columns
        da.zero_()
        return
    # dz in rows padded to 16 bytes: stored by TMA here, read by TMA as the next GEMMs' operand
    per = 16 // a.element_size()
    dz = torch.empty((M, cdiv(N, per) * per), dtype=a.dtype, device=a.device)[:, :N]
    partial = bias_partials(M, N, a.device)
    gemm(a, weight, dz, GELU_GRAD, bias=bias, dy=dy, partial=partial)  # z recomputed, dz stored
    gemm(dz, weight.t(), da, NONE)  # M x K (nothing when K = 0)
    gemm(a.t(), dz, dweight, NONE)  # K x N
    sum_bias(partial, dbias)
