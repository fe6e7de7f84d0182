/*
Step 8 — cp.async multi-stage pipeline
Changed:  global -> shared copies go through cp.async (sm_80+) into a ring of kStages shared
          buffers: while tile k is computed, tiles k+1 .. k+kStages-1 are in flight, and one
          barrier per tile replaces two. a is still transposed on the way in (4-byte copies,
          each to its place in as[k][m]); b moves in 16-byte copies, or 4-byte ones when its
          pointer or row stride is unaligned. Out-of-range elements are zero-filled by
          cp.async's src-size operand, with no branch around the copy.
Why:      in step 7 a block's global latency (~1 us per tile from L2/DRAM) sat between its
          barriers, hidden only by the other resident block. With the copies kStages - 1 tiles
          ahead, the block's warps go from one tile's FFMAs to the next with one barrier
          between. Registers stay what step 7 needed (no staging registers: cp.async writes
          shared memory directly). Intensities as step 7 per level (global 32 flop/B at
          128 x 128, shared 16 flop/B per warp, 21 FFMA per LDS.128); the inner loop is ~95%
          FFMA. Prediction: ~1.15x step 7, ~45-48 TFLOP/s at 4096^3 (0.9x cuBLAS).
Still:    FP32 FFMA on CUDA cores: ~60-67 TFLOP/s is the ceiling however well fed; the tensor
          cores (TF32/bf16 wgmma) are the next ladder. Ragged shapes lose a partial wave.
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

using rosetta::ThreadTile;

// ---- launch configuration --------------------------------------------------------------------
constexpr int kBM = 128, kBN = 128, kBK = 16;
constexpr int kStages = 4;  // 4 x 16.6 KB of shared memory per block
constexpr int kWarpsM = kBM / ThreadTile::kWarpM, kWarpsN = kBN / ThreadTile::kWarpN;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;  // 128
constexpr int kBlocksPerSm = 2;                   // registers: 65536 / (2 x 128) = 255 each
constexpr int kGroupM = 8;                        // tile rows per L2 group
constexpr int kPadA = 4;  // keeps the transposed copies conflict-free and rows 16-byte aligned
// -----------------------------------------------------------------------------------------------
constexpr int kLdA = kBM + kPadA;
constexpr int kStageFloats = kBK * kLdA + kBK * kBN;
constexpr int kSmemBytes = kStages * kStageFloats * int(sizeof(float));
constexpr int kRowsA = kThreads / 8;  // a: 8 lanes along k, kRowsA rows per pass
constexpr int kCopiesA = kBM * kBK / kThreads;
static_assert(kBM % ThreadTile::kWarpM == 0 && kBN % ThreadTile::kWarpN == 0, "whole warp tiles");
static_assert(kBK % 8 == 0 && kBM % kRowsA == 0 && kBM * kBK % kThreads == 0,
              "a's copies: 8 lanes along k, whole passes of rows");
static_assert(kThreads % kBN == 0 && kBK * kBN % (4 * kThreads) == 0,
              "b's copies: whole rows per pass, whole float4s per thread");
static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "a ring of stages that fits an SM");
static_assert(kLdA % 4 == 0 && kStageFloats % 4 == 0, "16-byte aligned rows and stages");

// cp.async: copy `bytes` (<= size) from global, zero-fill the rest of the `size`-byte slot.
// .ca for 4-byte copies (L1 keeps the line for the 7 neighbours that follow), .cg for 16-byte.
__device__ __forceinline__ void cp_async4(float* dst, const float* src, int bytes) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src, int bytes) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

template <bool kVecB>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) matmul_pipelined(rosetta::MatmulProblem p) {
  extern __shared__ float4 smem4[];  // float4: 16-byte aligned
  float* const smem = reinterpret_cast<float*>(smem4);
  const int t = threadIdx.x, warp = t / 32;
  int tm, tn;
  rosetta::tile_coords<kGroupM>((p.M + kBM - 1) / kBM, (p.N + kBN - 1) / kBN, tm, tn);
  const int m0 = tm * kBM, n0 = tn * kBN;
  const int wm = (warp / kWarpsN) * ThreadTile::kWarpM, wn = (warp % kWarpsN) * ThreadTile::kWarpN;

  // a: copy c of thread t is row t/8 + kRowsA * (c % passes), k = t%8 + 8 * (c / passes): a warp
  // covers 4 rows x 8 consecutive k (4 full sectors), and its transposed writes as[k][m] hit
  // banks 4k + m (mod 32, 4-float pad): 32 distinct.
  constexpr int kPassesA = kBM / kRowsA;
  const int a_row = t / 8, a_k = t % 8;
  const float* const a_thread = p.a + (m0 + a_row) * p.lda + a_k;
  // b: lanes along n; a pass covers kThreads / (kBN / kVec) rows of the tile.
  constexpr int kVec = kVecB ? 4 : 1;
  constexpr int kPerRow = kBN / kVec, kRowsB = kThreads / kPerRow, kCopiesB = kBK / kRowsB;
  const int b_k = t / kPerRow, b_n = kVec * (t % kPerRow);
  const float* const b_thread = p.b + b_k * p.ldb + n0 + b_n;
  const int b_bytes = 4 * max(0, min(kVec, p.N - (n0 + b_n)));  // zero-fill past N

  // Issues the copies of k-tile `kt` into stage `s`. An element outside a or b gets src-size 0:
  // nothing is read (the source is then a's or b's base, a valid address) and 0 is written.
  auto load_tile = [&](int kt, int s) {
    float* const as = smem + s * kStageFloats;
    float* const bs = as + kBK * kLdA;
    const int k0 = kt * kBK;
#pragma unroll
    for (int c = 0; c < kCopiesA; ++c) {
      const int row = a_row + kRowsA * (c % kPassesA), k = a_k + 8 * (c / kPassesA);
      const bool ok = m0 + row < p.M && k0 + k < p.K;
      const float* src = a_thread + int64_t(kRowsA * (c % kPassesA)) * p.lda + k0 + 8 * (c / kPassesA);
      cp_async4(&as[k * kLdA + row], ok ? src : p.a, ok ? 4 : 0);
    }
#pragma unroll
    for (int c = 0; c < kCopiesB; ++c) {
      const int k = b_k + kRowsB * c;
      const bool ok = k0 + k < p.K && b_bytes > 0;
      const float* src = b_thread + int64_t(k0 + kRowsB * c) * p.ldb;
      if constexpr (kVecB) cp_async16(&bs[k * kBN + b_n], ok ? src : p.b, ok ? b_bytes : 0);
      else cp_async4(&bs[k * kBN + b_n], ok ? src : p.b, ok ? b_bytes : 0);
    }
  };

  const int tiles_k = (p.K + kBK - 1) / kBK;
  // Prologue: kStages - 1 tiles in flight. Every thread commits one group per tile slot, empty
  // ones included, so "wait until <= kStages - 2 groups are pending" always means "my copies of
  // the tile about to be computed have landed".
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles_k) load_tile(s, s);
    cp_async_commit();
  }
  ThreadTile tile(t % 32);
  int read = 0, write = kStages - 1;
  for (int kt = 0; kt < tiles_k; ++kt) {
    cp_async_wait<kStages - 2>();
    // One barrier does two jobs: every thread's copies of tile kt are visible, and every warp
    // has finished computing tile kt-1, whose stage (== write) the copies below refill.
    __syncthreads();
    if (kt + kStages - 1 < tiles_k) load_tile(kt + kStages - 1, write);
    cp_async_commit();
    const float* const as = smem + read * kStageFloats;
    const float* const bs = as + kBK * kLdA;
#pragma unroll
    for (int k = 0; k < kBK; ++k) tile.fma(as + k * kLdA + wm, bs + k * kBN + wn);
    read = read + 1 == kStages ? 0 : read + 1;
    write = write + 1 == kStages ? 0 : write + 1;
  }
  tile.store(p, m0 + wm, n0 + wn, p.N % 4 == 0 && rosetta::aligned16(p.out));
}

}  // namespace

cudaError_t matmul_08_pipelined(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](const rosetta::MatmulProblem& p) {
    const int64_t blocks = rosetta::ceil_div(p.M, kBM) * rosetta::ceil_div(p.N, kBN);
    // a's vector path does not matter here: its copies are 4-byte, to transpose on the way in.
    rosetta::with_vec4_paths(true, rosetta::vec4_ok(p.b, p.ldb), [&](auto, auto vb) {
      auto kernel = matmul_pipelined<vb>;
      // Over 48 KB of dynamic shared memory needs an opt-in per kernel (per device: every call).
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) != cudaSuccess) return;
      kernel<<<blocks, kThreads, kSmemBytes, stream>>>(p);
    });
  });
}
