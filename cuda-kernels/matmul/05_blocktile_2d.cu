/*
Step 5 — 2-D register blocking: 8 x 8 outputs per thread
Changed:  128 x 128 output tiles, K in steps of 8, 256 threads; each thread owns an 8 x 8 tile
          of sums. Per k it loads 8 values of a's column and 8 of b's row into registers and
          does their 64 outer-product FMAs.
Why:      step 4 needed 9 shared loads per 8 FFMAs; an outer product needs 8 + 8 loads for
          8 x 8 = 64 FFMAs: 0.25 LDS per FFMA (4.5x fewer), 4 flop per smem byte. Global
          intensity doubles again: (128 + 128) x 8 x 4 B = 8 KB per 128 x 128 x 8 x 2 flops,
          32 flop/B. Tiles: siboehm's 128 x 128 x 8 on 256 threads, kept for the comparison;
          on the H100 the 64 sums need 130 registers, and 130 x 256 > 65,536 / 2 leaves one
          block per SM, with no other block to run during its barriers.
Still:    every global access is 4 bytes wide: 4 scalar loads per operand per thread per tile,
          each with its own bounds check and 64-bit address (the SASS loop is only 76% FFMA).
          ptxas merges the shared reads into LDS.128 (4 k of one row of as, 4 columns of bs),
          but the 16 thread columns of a warp read 512 different bytes of bs and the 2 thread
          rows land on the same banks of as: multi-wavefront loads. Step 6 loads 128 bits at a
          time from global and stores a transposed, so a column of a is contiguous.
Roofline: global 32 flop/B <= 208; shared: 32 LDS.128 per 512 FFMA, up to 4 wavefronts
          each (Still): >= 256 flop per wavefront <= 67; registers: 512 FFMA of the loop's 670
          instructions <= 0.76 x 65.3 = 50. Bound ~50 TFLOP/s (issue), if the one block that
          130 registers x 256 threads leave an SM could hide its own barriers: it cannot.
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8;
constexpr int kThreads = (kBM / kTM) * (kBN / kTN);  // 256
static_assert(kBM * kBK % kThreads == 0 && kBN * kBK % kThreads == 0,
              "the a and b tiles split evenly over the threads");
static_assert(kThreads % kBK == 0 && kThreads % kBN == 0, "whole rows per loading pass");

__global__ void __launch_bounds__(kThreads) matmul_blocktile_2d(rosetta::MatmulProblem p) {
  __shared__ float as[kBM][kBK];
  __shared__ float bs[kBK][kBN];
  const int t = threadIdx.x;
  const int tiles_n = (p.N + kBN - 1) / kBN;
  const int m0 = (blockIdx.x / tiles_n) * kBM, n0 = (blockIdx.x % tiles_n) * kBN;
  const int row = (t / (kBN / kTN)) * kTM, col = (t % (kBN / kTN)) * kTN;
  // Loads: a pass of all threads covers kThreads / kBK rows of a (lanes along k) and
  // kThreads / kBN rows of b (lanes along n).
  const int a_row = t / kBK, a_k = t % kBK;
  const int b_k = t / kBN, b_col = t % kBN;
  constexpr int kRowsA = kThreads / kBK, kRowsB = kThreads / kBN;

  float acc[kTM][kTN] = {};
  for (int k0 = 0; k0 < p.K; k0 += kBK) {
#pragma unroll
    for (int r = 0; r < kBM; r += kRowsA) {
      const int m = m0 + a_row + r, k = k0 + a_k;
      as[a_row + r][a_k] = (m < p.M && k < p.K) ? p.a[m * p.lda + k] : 0.f;  // zero-filled edges
    }
#pragma unroll
    for (int r = 0; r < kBK; r += kRowsB) {
      const int k = k0 + b_k + r, n = n0 + b_col;
      bs[b_k + r][b_col] = (k < p.K && n < p.N) ? p.b[k * p.ldb + n] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      float a[kTM], b[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i) a[i] = as[row + i][k];
#pragma unroll
      for (int j = 0; j < kTN; ++j) b[j] = bs[k][col + j];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int m = m0 + row + i;
    if (m >= p.M) break;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int n = n0 + col + j;
      if (n < p.N) p.out[int64_t(m) * p.N + n] = acc[i][j];
    }
  }
}

}  // namespace

cudaError_t matmul_05_blocktile_2d(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](const rosetta::MatmulProblem& p) {
    const int64_t blocks = rosetta::ceil_div(p.M, kBM) * rosetta::ceil_div(p.N, kBN);
    matmul_blocktile_2d<<<blocks, kThreads, 0, stream>>>(p);
  });
}
