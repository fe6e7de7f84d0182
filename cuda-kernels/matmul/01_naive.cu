/*
Step 1 — one thread per output, threadIdx.x walking M
Changed:  the starting point: thread (m, n) computes out[m][n] = sum_k a[m][k] * b[k][n] straight
          from global memory; 32 x 32 threads per block, threadIdx.x walking the rows M
          (siboehm's step 1).
Why:      the simplest correct kernel, and a lesson in what a warp's addresses cost. The 32 lanes
          of a warp hold 32 consecutive m and one n: each k reads 32 different rows of a (32
          sectors of 32 B for 128 useful bytes), one broadcast b, and the final stores hit 32 rows
          of out. Arithmetic intensity against L1/L2 is ~1 KB of sectors per 64 flops (1/16
          flop/B) and every FFMA waits on two dependent loads.
Still:    uncoalesced: neighbouring lanes touch addresses lda floats apart. Step 2 swaps the roles
          of the thread indices so a warp reads one row of b contiguously.
Roofline: TFLOP/s each level allows (H100: L2 6.5 TB/s and FFMA 65.3 TFLOP/s as surveyed;
          L1/shared 128 B/clk x 132 SMs x 1.98 GHz = 33.5 TB/s). Global, via L1: a warp pulls
          ~1 KB of sectors per 64 flops, 1/16 flop/B: <= 2.1. Registers: 16 FFMA in the SASS
          loop's 110 instructions (2 LDG per FFMA plus addresses): <= 0.15 x 65.3 = 9.5. Bound
          2.1, and each FFMA waits on its two loads, which the warps cannot hide: well below.
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

constexpr int kTile = 32;  // 32 x 32 threads per block, one output each

__global__ void matmul_naive(rosetta::MatmulProblem p) {
  const int tiles_m = (p.M + kTile - 1) / kTile;
  // A 1-D grid (x may reach 2^31 - 1 blocks; y only 65535): tile rows fastest.
  const int m = (blockIdx.x % tiles_m) * kTile + threadIdx.x;  // lanes differ in m: uncoalesced
  const int n = (blockIdx.x / tiles_m) * kTile + threadIdx.y;
  if (m >= p.M || n >= p.N) return;
  const float* a = p.a + m * p.lda;  // int64 row offsets
  float acc = 0.f;
  for (int k = 0; k < p.K; ++k) acc = fmaf(a[k], p.b[k * p.ldb + n], acc);
  p.out[int64_t(m) * p.N + n] = acc;
}

}  // namespace

cudaError_t matmul_01_naive(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](const rosetta::MatmulProblem& p) {
    const int64_t blocks = rosetta::ceil_div(p.M, kTile) * rosetta::ceil_div(p.N, kTile);
    matmul_naive<<<blocks, dim3(kTile, kTile), 0, stream>>>(p);
  });
}
