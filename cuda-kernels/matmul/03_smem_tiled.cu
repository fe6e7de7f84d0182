/*
Step 3 — 32 x 32 shared-memory tiles
Changed:  the block (32 x 32 threads, one output each, as in step 2) walks K in 32-wide steps:
          each thread loads one element of a 32 x 32 tile of a and one of b into shared memory,
          a barrier, then 32 FMAs read both operands from shared memory.
Why:      each element fetched from global memory is now used 32 times: global intensity rises
          from 1/4 to 32 x 2 flops / (2 x 4 B) = 8 flop/B, so L2 traffic stops being the
          limit. Shared memory becomes it: every FFMA still needs two 4-byte shared loads (one
          broadcast As[m][k], one conflict-free Bs[k][n]): 2 LDS per FFMA, 0.5 flop per smem
          byte.
Still:    one output per thread: every FMA pays two shared loads. Step 4 computes a column of
          outputs per thread so one loaded b value feeds several FMAs.
Roofline: global 8 flop/B x 6.5 TB/s (L2) <= 52; shared: the SASS loop issues 40 LDS
          (8 of them LDS.128 broadcasts of a) per 32 FFMA, one 128-byte wavefront each: a warp
          gets 32 x 64 / 40 = 51 flop per wavefront x 132 SMs x 1.98 GHz <= 13.4; registers:
          32 FFMA of 103 instructions <= 20. Bound ~13 TFLOP/s (shared wavefronts).
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

constexpr int kTile = 32;  // 32 x 32 threads, one output each; tiles of a and b are 32 x 32

__global__ void matmul_smem_tiled(rosetta::MatmulProblem p) {
  __shared__ float as[kTile][kTile];
  __shared__ float bs[kTile][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tiles_n = (p.N + kTile - 1) / kTile;
  const int m0 = (blockIdx.x / tiles_n) * kTile, n0 = (blockIdx.x % tiles_n) * kTile;
  const int m = m0 + ty, n = n0 + tx;

  float acc = 0.f;
  for (int k0 = 0; k0 < p.K; k0 += kTile) {
    // Out-of-range elements load as 0 so the tail tile adds nothing; threads whose own output
    // is outside still load: their neighbours need the tile.
    as[ty][tx] = (m < p.M && k0 + tx < p.K) ? p.a[m * p.lda + k0 + tx] : 0.f;
    bs[ty][tx] = (k0 + ty < p.K && n < p.N) ? p.b[(k0 + ty) * p.ldb + n] : 0.f;
    __syncthreads();  // the tile is complete before anyone reads it
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc = fmaf(as[ty][k], bs[k][tx], acc);
    __syncthreads();  // everyone is done reading before the next tile overwrites it
  }
  if (m < p.M && n < p.N) p.out[int64_t(m) * p.N + n] = acc;
}

}  // namespace

cudaError_t matmul_03_smem_tiled(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](const rosetta::MatmulProblem& p) {
    const int64_t blocks = rosetta::ceil_div(p.M, kTile) * rosetta::ceil_div(p.N, kTile);
    matmul_smem_tiled<<<blocks, dim3(kTile, kTile), 0, stream>>>(p);
  });
}
