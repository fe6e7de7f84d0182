/*
Step 4 — 1-D register blocking: a column of TM = 8 outputs per thread
Changed:  64 x 64 output tiles, K in steps of 8, 512 threads; each thread owns 8 outputs of one
          column and keeps their sums in registers. Per k it loads one b value once into a
          register and reuses it for its 8 FMAs.
Why:      step 3 issued 2 shared loads per FFMA. Now per k a thread issues 1 LDS of b plus 8
          broadcast LDS of a for 8 FFMAs: 1.1 LDS per FFMA instead of 2, and a block moves
          (64 + 64) x 8 x 4 B = 4 KB from global per 64 x 64 x 8 x 2 = 64 Kflop: 16 flop/B
          (2x step 3). Tiles: siboehm's 64 x 64 x 8, kept so that one idea changes at a time;
          on the H100 its 52 registers x 512 threads allow 2 blocks (32 warps) per SM.
Still:    the a operand is still one 4-byte LDS per FFMA; a 2-D tile of TM x TN outputs reuses
          both a and b from registers (step 5).
Roofline: global 16 flop/B x 6.5 TB/s <= 104; shared: 24 LDS (16 of them LDS.128) per
          64 FFMA, ~1 wavefront each: 171 flop per wavefront <= 45; registers: 64 FFMA of the
          loop's 126 instructions <= 0.51 x 65.3 = 33. Bound ~33 TFLOP/s (issue), before the
          barriers: 2 per tile of 8 k with nothing else to run in them.
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

constexpr int kBM = 64, kBN = 64, kBK = 8, kTM = 8;
constexpr int kThreads = kBM * kBN / kTM;  // 512: one thread per column strip of 8 outputs
static_assert(kThreads == kBM * kBK && kThreads == kBN * kBK,
              "each thread loads exactly one element of the a tile and one of the b tile");

__global__ void __launch_bounds__(kThreads) matmul_blocktile_1d(rosetta::MatmulProblem p) {
  __shared__ float as[kBM][kBK];
  __shared__ float bs[kBK][kBN];
  const int t = threadIdx.x;
  const int tiles_n = (p.N + kBN - 1) / kBN;
  const int m0 = (blockIdx.x / tiles_n) * kBM, n0 = (blockIdx.x % tiles_n) * kBN;
  // Compute: the 32 lanes of a warp share one row strip (broadcast as reads) and hold 32
  // consecutive columns (conflict-free bs reads).
  const int col = t % kBN, row = (t / kBN) * kTM;
  // Loads: lanes walk k for a (8 consecutive floats of a row) and n for b (one row of b).
  const int a_row = t / kBK, a_k = t % kBK;
  const int b_k = t / kBN, b_col = t % kBN;

  float acc[kTM] = {};
  for (int k0 = 0; k0 < p.K; k0 += kBK) {
    const int am = m0 + a_row, ak = k0 + a_k, bk = k0 + b_k, bn = n0 + b_col;
    as[a_row][a_k] = (am < p.M && ak < p.K) ? p.a[am * p.lda + ak] : 0.f;  // zero-filled edges
    bs[b_k][b_col] = (bk < p.K && bn < p.N) ? p.b[bk * p.ldb + bn] : 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      const float b = bs[k][col];  // one load, kTM uses
#pragma unroll
      for (int i = 0; i < kTM; ++i) acc[i] = fmaf(as[row + i][k], b, acc[i]);
    }
    __syncthreads();
  }
  const int n = n0 + col;
  if (n >= p.N) return;
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int m = m0 + row + i;
    if (m < p.M) p.out[int64_t(m) * p.N + n] = acc[i];
  }
}

}  // namespace

cudaError_t matmul_04_blocktile_1d(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](const rosetta::MatmulProblem& p) {
    const int64_t blocks = rosetta::ceil_div(p.M, kBM) * rosetta::ceil_div(p.N, kBN);
    matmul_blocktile_1d<<<blocks, kThreads, 0, stream>>>(p);
  });
}
