"""
Step 3 — grouped program order for L2 reuse
Changed:  only the map from program id to tile. Step 2 walks the tile grid row by row; here
          programs are taken in groups of GROUP_M = 8 row blocks: within a group, ids run down the
          8 row blocks of one column block, then move to the next column block (the Triton
          tutorial's "super-grouping"). Tile, warps and stages as step 2.
Why:      at 4096^3 with 128 x 128 tiles the grid is 32 x 32 tiles and ~132 programs run at once.
          Row-major: one wave covers ~4 row blocks x 32 column blocks, i.e. 4 x 2 MB of A (fp32)
          and all of B (64 MB): B does not fit the 50 MB L2, so B blocks fall out between waves
          and come back from DRAM. Grouped: one wave covers 8 row blocks x ~16 column blocks:
          4 MB of A rows + 16 x 2 MB of B columns = 36 MB live, which L2 holds, and the next
          wave reuses the same 8 row blocks. DRAM traffic per wave drops from ~(8 + 64) MB to
          ~(4 + 32) MB.
Still:    one fixed tile shape and pipeline depth for every shape and dtype; the best choice
          differs between fp32 FFMA (register-bound) and 16-bit wgmma (bandwidth-bound): step 4
          autotunes them.
Limits:   none.
Dtypes:   float32, float16, bfloat16
Layout:   any
Mirrors:  CUDA steps 03-11 (as step 2); the grouped order is CUDA step 07's block order (groups
          of 8 tile rows), which step 13's persistent tile scheduler keeps
"""
import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import cdiv

BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES = 128, 128, 32, 8, 3  # as step 2
GROUP_M = 8  # row blocks per group: 8 x 128 rows of A stay in L2 while B's columns stream


@triton.jit
def matmul_grouped_kernel(
    a_ptr,  # A, M x K, any strides
    b_ptr,  # B, K x N, any strides
    out_ptr,  # out, M x N, contiguous, same dtype as A
    M, N, K,
    stride_am, stride_ak,  # A's strides in elements
    stride_bk, stride_bn,  # B's strides in elements
    stride_om,  # out's row stride (its column stride is 1)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # groups of GROUP_M row blocks; inside a group ids go down the rows first, then across
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)  # the last group may be shorter
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # int64: rows x stride > 2^31
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # K == 0: zero iterations, the zero accumulator is stored
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = ks < K - k * BLOCK_K  # the last slice is partial when BLOCK_K does not divide K
        # other=0.0 on both operands: a padded k adds 0 x 0, a padded row/col is never stored
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        # "ieee": fp32 operands stay fp32 (FFMA, no TF32); 16-bit operands still go to wgmma
        acc = tl.dot(a, b, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def launch(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    grid = (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)
    wrap_triton(matmul_grouped_kernel)[grid](
        a, b, out, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=GROUP_M,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
