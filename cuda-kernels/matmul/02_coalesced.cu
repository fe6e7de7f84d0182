/*
Step 2 — coalesced: threadIdx.x walking N
Changed:  step 1 with the thread indices swapped: the 32 lanes of a warp now hold one m and 32
          consecutive n.
Why:      per k a warp now reads one broadcast a[m][k] and 128 contiguous bytes of row k of b
          (4 full sectors, not 32 part-used ones), and its stores are one 128-byte line. Bytes
          requested from L1 per 64 flops drop from ~1 KB to ~132 B: ~8x less traffic.
Still:    no reuse on chip: each a element is loaded by N threads and each b element by M
          threads. Step 3 stages 32 x 32 tiles in shared memory so each is read from global
          once per block.
Roofline: global, via L1: ~132 B per warp per 64 flops, 0.48 flop/B x 33.5 TB/s <= 16;
          registers: the SASS loop is step 1's, 16 FFMA of 110 instructions: <= 0.15 x 65.3
          = 9.5 TFLOP/s. Bound ~9.5: issue slots spent on loads and addresses.
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

constexpr int kTile = 32;  // 32 x 32 threads per block, one output each

__global__ void matmul_coalesced(rosetta::MatmulProblem p) {
  const int tiles_n = (p.N + kTile - 1) / kTile;
  const int n = (blockIdx.x % tiles_n) * kTile + threadIdx.x;  // lanes differ in n: coalesced
  const int m = (blockIdx.x / tiles_n) * kTile + threadIdx.y;
  if (m >= p.M || n >= p.N) return;
  const float* a = p.a + m * p.lda;
  float acc = 0.f;
  for (int k = 0; k < p.K; ++k) acc = fmaf(a[k], p.b[k * p.ldb + n], acc);  // a[k]: one broadcast
  p.out[int64_t(m) * p.N + n] = acc;
}

}  // namespace

cudaError_t matmul_02_coalesced(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](const rosetta::MatmulProblem& p) {
    const int64_t blocks = rosetta::ceil_div(p.M, kTile) * rosetta::ceil_div(p.N, kTile);
    matmul_coalesced<<<blocks, dim3(kTile, kTile), 0, stream>>>(p);
  });
}
