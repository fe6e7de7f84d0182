/*
Step 6 — 128-bit loads; a stored transposed in shared memory
Changed:  step 5's tiles (128 x 128 x 8, 8 x 8 per thread), but each thread fetches its 4 floats
          of a and its 4 of b per tile as one 16-byte load each, and writes a transposed,
          as[k][m], so a thread's 8 values of a column are contiguous: per k, 2 + 2 LDS.128
          instead of 8 + 8 scalar LDS. An operand whose pointer or row stride is not 16-byte
          aligned takes a scalar path (a template flag the launcher picks).
Why:      step 5's loop spent a quarter of its instructions on 8 scalar, bounds-checked LDG
          per tile and their addresses (SASS: 76% FFMA). Now 2 LDG.128 per tile and 4 LDS.128
          per 64 FFMA (16 FFMA per shared load), with one check per vector: the loop is ~85%
          FFMA in SASS (ncu: 87%). Intensities are unchanged (global 32 flop/B, shared 4 flop
          per smem byte). ptxas fits this loop in 127 registers, under the 128 that 2 blocks
          of 256 threads per SM allow; step 7 is where tiles are sized for the H100.
Still:    the 16 thread columns of a warp read 16 different 32-byte pieces of bs per k: 512
          bytes for one LDS.128, 4 shared-memory wavefronts where 1 would do. The block is
          one flat grid of 8 x 8 thread tiles; step 7 arranges warps and lanes so each warp's
          reads are broadcasts of 128 contiguous bytes, and sizes the tiles for the H100.
Roofline: global 32 flop/B <= 208; shared as step 5 (<= 67); registers: 512 FFMA of
          the loop's 599 instructions <= 0.85 x 65.3 = 56. Bound ~56 TFLOP/s (issue); 127
          registers give 2 blocks per SM (step 5: 1) to fill each other's barriers.
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8;
constexpr int kThreads = (kBM / kTM) * (kBN / kTN);  // 256
// Pad the rows of transposed a by 4 floats: the transposed store (32 lanes: 16 rows x 2 groups of
// 4 k) then hits 32 different banks, and rows stay 16-byte aligned for LDS.128.
constexpr int kPadA = 4;
static_assert(kBM * kBK == 4 * kThreads && kBN * kBK == 4 * kThreads,
              "one 16-byte vector of a and one of b per thread per tile");
static_assert(kTM % 4 == 0 && kTN % 4 == 0 && kBK % 4 == 0, "tiles in whole float4s");

template <bool kVecA, bool kVecB>
__global__ void __launch_bounds__(kThreads) matmul_vectorized(rosetta::MatmulProblem p) {
  __shared__ __align__(16) float as[kBK][kBM + kPadA];  // transposed: as[k][m]
  __shared__ __align__(16) float bs[kBK][kBN];
  const int t = threadIdx.x;
  const int tiles_n = (p.N + kBN - 1) / kBN;
  const int m0 = (blockIdx.x / tiles_n) * kBM, n0 = (blockIdx.x % tiles_n) * kBN;
  const int row = (t / (kBN / kTN)) * kTM, col = (t % (kBN / kTN)) * kTN;
  const int a_row = t / (kBK / 4), a_k = (t % (kBK / 4)) * 4;  // one float4 of a row of a
  const int b_k = t / (kBN / 4), b_col = (t % (kBN / 4)) * 4;  // one float4 of a row of b
  const int am = m0 + a_row, bn = n0 + b_col;
  const float* a_ptr = p.a + am * p.lda + a_k;
  const float* b_ptr = p.b + b_k * p.ldb + bn;

  float acc[kTM][kTN] = {};
  for (int k0 = 0; k0 < p.K; k0 += kBK) {
    // Elements past M, K or N read as 0 (load4's `valid`), so tail tiles add nothing.
    const float4 av = rosetta::load4<kVecA>(a_ptr + k0, am < p.M ? p.K - (k0 + a_k) : 0);
    const float4 bv = rosetta::load4<kVecB>(b_ptr + k0 * p.ldb, k0 + b_k < p.K ? p.N - bn : 0);
    as[a_k + 0][a_row] = av.x;
    as[a_k + 1][a_row] = av.y;
    as[a_k + 2][a_row] = av.z;
    as[a_k + 3][a_row] = av.w;
    *reinterpret_cast<float4*>(&bs[b_k][b_col]) = bv;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      float a[kTM], b[kTN];
#pragma unroll
      for (int i = 0; i < kTM; i += 4) *reinterpret_cast<float4*>(&a[i]) = *reinterpret_cast<const float4*>(&as[k][row + i]);
#pragma unroll
      for (int j = 0; j < kTN; j += 4) *reinterpret_cast<float4*>(&b[j]) = *reinterpret_cast<const float4*>(&bs[k][col + j]);
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
  const bool vec_out = p.N % 4 == 0 && rosetta::aligned16(p.out);
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int m = m0 + row + i;
    if (m >= p.M) break;
    float* out_row = p.out + int64_t(m) * p.N;
#pragma unroll
    for (int j = 0; j < kTN; j += 4) {
      const int n = n0 + col + j;
      if (vec_out && n + 3 < p.N) {
        *reinterpret_cast<float4*>(out_row + n) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
      } else {
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
          if (n + jj < p.N) out_row[n + jj] = acc[i][j + jj];
      }
    }
  }
}

}  // namespace

cudaError_t matmul_06_vectorized(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](const rosetta::MatmulProblem& p) {
    const int64_t blocks = rosetta::ceil_div(p.M, kBM) * rosetta::ceil_div(p.N, kBN);
    rosetta::with_vec4_paths(rosetta::vec4_ok(p.a, p.lda), rosetta::vec4_ok(p.b, p.ldb), [&](auto va, auto vb) {
      matmul_vectorized<va, vb><<<blocks, kThreads, 0, stream>>>(p);
    });
  });
}
