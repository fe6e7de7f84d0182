/*
Step 7 — warp tiling, sized for the H100
Changed:  block -> warp -> thread tiles: a 128 x 128 block tile (K in steps of 16) is 2 x 2 warp
          tiles of 64 x 64, each an 8 x 4 grid of lanes with 8 x 16 accumulators per lane
          (rosetta::ThreadTile). 4 warps per block, 2 blocks per SM; blocks walk the output in
          groups of 8 tile rows so co-resident blocks share a and b panels in L2.
Why:      step 6's 8 x 8 lanes made a warp read 512 bytes of bs per LDS.128 (4 wavefronts) and
          issued 4 LDS.128 per 64 FFMA. Here a warp's A read is 8 distinct 16-byte pieces (128
          contiguous bytes, each broadcast to 4 lanes) and its B read 4 pieces (broadcast to 8):
          one wavefront each, and 6 LDS.128 per 128 FFMA (FFMA/LDS = 21, vs 16). Shared
          intensity: per k a warp reads 64 + 64 floats for 64 x 64 FMAs: 16 flop per smem byte
          (4x step 6). Global: (128 + 128) x 16 x 4 B per 128 x 128 x 16 x 2 flops = 32 flop/B.
          H100 sizing: 128 accumulators + 24 fragment values + staged loads and addresses need
          ~240 registers (ptxas: 239-253, no spills), so 64K registers per SM hold 2 blocks of
          128 threads: each of the 4 schedulers gets 2 warps, one from each block, and while
          one block waits at its barrier for global loads the other computes. Shared memory is
          small (16.6 KB per block of 228 KB); the tile count at 4096^3 is 1024 = 3.9 waves of
          264 blocks.
Still:    a block loads a tile (global -> registers -> shared), waits at a barrier, computes,
          waits again: its own global latency is never overlapped with its own math, only
          hidden by the other block. Step 8 copies with cp.async into a ring of shared-memory
          stages so tile k+1.. arrive while tile k is computed.
Roofline: global 32 flop/B <= 208 (L2); shared: 96 LDS.128 per 2048 FFMA, one wavefront
          each: 1,365 flop per wavefront <= 356; registers: 2048 FFMA of the loop's 2,346
          instructions <= 0.87 x 65.3 = 57. Bound ~57 TFLOP/s (issue): at last the FFMAs
          themselves, so what remains is how often a scheduler finds one ready.
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

using rosetta::ThreadTile;

// ---- launch configuration --------------------------------------------------------------------
constexpr int kBM = 128, kBN = 128, kBK = 16;
constexpr int kWarpsM = kBM / ThreadTile::kWarpM, kWarpsN = kBN / ThreadTile::kWarpN;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;  // 128
constexpr int kBlocksPerSm = 2;                   // caps registers at 255 (65536 / (2 x 128))
constexpr int kGroupM = 8;                        // tile rows per L2 group
constexpr int kPadA = 4;  // keeps the transposed stores conflict-free and rows 16-byte aligned
// -----------------------------------------------------------------------------------------------
constexpr int kLdA = kBM + kPadA;
constexpr int kVecsA = kBM * kBK / 4 / kThreads, kVecsB = kBK * kBN / 4 / kThreads;
static_assert(kBM % ThreadTile::kWarpM == 0 && kBN % ThreadTile::kWarpN == 0, "whole warp tiles");
static_assert(kBM * kBK % (4 * kThreads) == 0 && kBK * kBN % (4 * kThreads) == 0,
              "the a and b tiles split into whole float4s per thread");
static_assert(kBK % 8 == 0 && kThreads % (kBN / 4) == 0 && (2 * kBM) % kThreads == 0,
              "load passes cover whole rows");

template <bool kVecA, bool kVecB>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) matmul_warptile(rosetta::MatmulProblem p) {
  __shared__ __align__(16) float as[kBK][kLdA];  // transposed: as[k][m]
  __shared__ __align__(16) float bs[kBK][kBN];
  const int t = threadIdx.x, warp = t / 32;
  int tm, tn;
  rosetta::tile_coords<kGroupM>((p.M + kBM - 1) / kBM, (p.N + kBN - 1) / kBN, tm, tn);
  const int m0 = tm * kBM, n0 = tn * kBN;
  const int wm = (warp / kWarpsN) * ThreadTile::kWarpM, wn = (warp % kWarpsN) * ThreadTile::kWarpN;

  // a: vector v of thread t covers row (v * kThreads + t) / 2 mod kBM, k-group 4 * ((v*T+t) % 2)
  // + 8 * (pass over the first 8 k). A warp so covers 16 rows x 2 float4s: its transposed stores
  // as[k][m] land in 32 distinct banks with the 4-float pad (4 * k + m mod 32).
  // b: lanes along n, whole rows of the tile.
  float4 av[kVecsA], bv[kVecsB];
  ThreadTile tile(t % 32);
  for (int k0 = 0; k0 < p.K; k0 += kBK) {
#pragma unroll
    for (int v = 0; v < kVecsA; ++v) {
      const int e = v * kThreads + t;
      const int row = (e / 2) % kBM, k = 4 * (e % 2) + 8 * (e / (2 * kBM));
      const int m = m0 + row;
      av[v] = rosetta::load4<kVecA>(p.a + m * p.lda + k0 + k, m < p.M ? p.K - (k0 + k) : 0);
    }
#pragma unroll
    for (int v = 0; v < kVecsB; ++v) {
      const int e = v * kThreads + t;
      const int k = e / (kBN / 4), n = n0 + 4 * (e % (kBN / 4));
      bv[v] = rosetta::load4<kVecB>(p.b + (k0 + k) * p.ldb + n, k0 + k < p.K ? p.N - n : 0);
    }
#pragma unroll
    for (int v = 0; v < kVecsA; ++v) {
      const int e = v * kThreads + t;
      const int row = (e / 2) % kBM, k = 4 * (e % 2) + 8 * (e / (2 * kBM));
      as[k + 0][row] = av[v].x;
      as[k + 1][row] = av[v].y;
      as[k + 2][row] = av[v].z;
      as[k + 3][row] = av[v].w;
    }
#pragma unroll
    for (int v = 0; v < kVecsB; ++v) {
      const int e = v * kThreads + t;
      *reinterpret_cast<float4*>(&bs[e / (kBN / 4)][4 * (e % (kBN / 4))]) = bv[v];
    }
    __syncthreads();  // the tile is in shared memory
#pragma unroll
    for (int k = 0; k < kBK; ++k) tile.fma(&as[k][wm], &bs[k][wn]);
    __syncthreads();  // everyone has read it before the next tile overwrites it
  }
  tile.store(p, m0 + wm, n0 + wn, p.N % 4 == 0 && rosetta::aligned16(p.out));
}

}  // namespace

cudaError_t matmul_07_warptile(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](const rosetta::MatmulProblem& p) {
    const int64_t blocks = rosetta::ceil_div(p.M, kBM) * rosetta::ceil_div(p.N, kBN);
    rosetta::with_vec4_paths(rosetta::vec4_ok(p.a, p.lda), rosetta::vec4_ok(p.b, p.ldb), [&](auto va, auto vb) {
      matmul_warptile<va, vb><<<blocks, kThreads, 0, stream>>>(p);
    });
  });
}
