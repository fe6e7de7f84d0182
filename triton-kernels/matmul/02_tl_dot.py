"""
Step 2 — tl.dot on BLOCK_K slices: one construct for shared memory, pipelining and tensor cores
Changed:  the k-by-k rank-1 loop becomes a loop over BLOCK_K = 32 slices: load a BLOCK_M x BLOCK_K
          tile of A and a BLOCK_K x BLOCK_N tile of B (masked on every edge), acc = tl.dot(a, b,
          acc). Fixed tile 128 x 128 x 32, 8 warps, 3 stages. fp32 inputs use
          input_precision="ieee" (exact fp32 FMAs, no TF32); fp16/bf16 inputs take the same line
          onto the tensor cores. Output cast to the input dtype.
Why:      tl.dot is where the compiler does what the CUDA ladder does by hand: it stages the
          tiles in shared memory (CUDA 03), keeps an 8 x 8 register micro-tile per thread (04-05,
          07), vectorises the loads (06) and, with num_stages = 3, multi-buffers them with
          cp.async / TMA (08). For 16-bit inputs it emits wgmma on sm_90 (09-11: wmma, mma.sync,
          wgmma). One line absorbs CUDA steps 03-08 and the tensor-core steps.
          Arithmetic intensity of a 128 x 128 tile: per BLOCK_K slice 2·128·128·32 flops over
          (128 + 128)·32 values = 64 FMA per value loaded into shared memory (step 1: 64 as
          well, but from L1/L2, re-fetched for every k with no staging). At 4096^3 fp32, A and
          B are each re-read 32 times: 2 x 32 x 64 MB = 4.3 GB through L2, ~0.3 GB of it from
          DRAM when tiles are L2 hits.
Still:    programs run in row-major order over the tile grid: at 4096^3 the 132 resident programs
          cover ~4 row blocks x 32 column blocks, so they share A rows but each needs a different
          B column block (the whole of B passes through L2 every ~wave). Step 3 groups programs.
Limits:   none.
Dtypes:   float32, float16, bfloat16
Layout:   any
Mirrors:  CUDA steps 03-08 (fp32, CUDA cores) and 09-11 (16-bit, tensor cores)
"""
import triton
import triton.language as tl
from torch.library import wrap_triton
from rosetta.triton_kernels.common import cdiv

BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES = 128, 128, 32, 8, 3


@triton.jit
def matmul_tl_dot_kernel(
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
):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n  # row-major program order
    pid_n = pid % num_pid_n
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
    wrap_triton(matmul_tl_dot_kernel)[grid](
        a, b, out, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES)
