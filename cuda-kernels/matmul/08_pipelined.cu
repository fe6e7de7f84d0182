/*
Step 8 — cp.async multi-stage pipeline
Changed:  global -> shared copies go through cp.async (sm_80+) into a ring of kStages shared
          buffers: while tile k is computed, tiles k+1 .. k+kStages-1 are in flight, and one
          barrier per tile replaces two. a is still transposed on the way in (4-byte copies,
          each to its place in as[k][m]); b moves in 16-byte copies, or 4-byte ones when its
          pointer or row stride is unaligned. Out-of-range elements are zero-filled by
          cp.async's src-size operand, with no branch around the copy. With no staging
          registers, the block tile grows to 128 x 256 (8 warps, 1 block per SM), and the
          fragments of k-step k+1 are loaded from shared memory before the FFMAs of step k.
Why:      in step 7 a block's global latency (~1 us per tile from L2/DRAM) sat between its
          barriers, hidden only by the other resident block. With the copies kStages - 1 tiles
          ahead, the block's warps go from one tile's FFMAs to the next with one barrier
          between. Global intensity: (128 + 256) x 16 x 4 B per 128 x 256 x 16 x 2 flops =
          42.7 flop/B (step 7: 32); shared 16 flop/B per warp and 21 FFMA per LDS.128 as in
          step 7. Copies cost one LDGSTS each (per-row source pointers, immediate offsets):
          ncu counted 91.8% of issued instructions as FFMA at 4096^3 (step 7: 89.2%).
Still:    ~27% of scheduler cycles have no eligible warp (ncu): 2 warps per scheduler barely
          cover LDS latency and register-bank stalls, so FFMA issue sits near 70% of peak;
          cuBLAS's hand-scheduled SASS reaches ~78%. Ragged and mid-size shapes lose a
          partial wave (3000^3: 288 tiles on 132 SMs = 2.2 waves), which cuBLAS avoids with
          other tile shapes or split-K. FP32 FFMA tops out at ~60-67 TFLOP/s however fed:
          the tensor cores are the next rung.
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

using rosetta::ThreadTile;

// ---- launch configuration --------------------------------------------------------------------
// 128 x 256 block tile, 8 warps of 64 x 64: with no staging registers (cp.async), 1 block of 256
// threads per SM may use up to 255 registers (ptxas: 229-233, no spills), and the bigger tile
// raises global intensity to 42.7 flop/B. Measured on the H100 (4096^3, with fragments double-
// buffered): 44.4 TFLOP/s vs 42.8 for step 7's 128 x 128 x 2 blocks per SM with the same pipeline.
constexpr int kBM = 128, kBN = 256, kBK = 16;
constexpr int kStages = 3;  // 3 x 24.8 KB of shared memory (4 stages measured no faster)
constexpr int kWarpsM = kBM / ThreadTile::kWarpM, kWarpsN = kBN / ThreadTile::kWarpN;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;  // 256
constexpr int kBlocksPerSm = 1;                   // registers: 255 per thread allowed
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

  // a: copy c of thread t is row t/8 + kRowsA * (c % kPassesA), k = t%8 + 8 * (c / kPassesA): a
  // warp covers 4 rows x 8 consecutive k (4 full sectors), and its transposed writes as[k][m]
  // hit banks 4k + m (mod 32, 4-float pad): 32 distinct. One source pointer per row, advanced
  // by kBK per tile, so a copy costs one LDGSTS with an immediate offset. Rows past M point at
  // row M-1 (a valid address) and copy 0 bytes: their slots are zero-filled.
  constexpr int kPassesA = kBM / kRowsA;
  const int a_row = t / 8, a_k = t % 8;
  const float* a_src[kPassesA];
  int a_bytes[kPassesA];
#pragma unroll
  for (int r = 0; r < kPassesA; ++r) {
    const int m = m0 + a_row + kRowsA * r;
    a_src[r] = p.a + min(m, p.M - 1) * p.lda + a_k;
    a_bytes[r] = m < p.M ? 4 : 0;
  }
  // b: lanes along n; a pass covers kRowsB rows of the tile. Past N: column 0, 0 bytes.
  constexpr int kVec = kVecB ? 4 : 1;
  constexpr int kPerRow = kBN / kVec, kRowsB = kThreads / kPerRow, kCopiesB = kBK / kRowsB;
  const int b_k = t / kPerRow, b_n = kVec * (t % kPerRow);
  const int b_bytes = 4 * max(0, min(kVec, p.N - (n0 + b_n)));  // partial vectors zero-fill
  const float* b_src = p.b + b_k * p.ldb + (b_bytes > 0 ? n0 + b_n : 0);
  const int64_t b_pass = kRowsB * p.ldb;

  auto copy_b = [&](float* dst, const float* src, int bytes) {
    if constexpr (kVecB) cp_async16(dst, src, bytes);
    else cp_async4(dst, src, bytes);
  };
  // Issues the copies of the next k-tile into stage s; k_left = K - k0 of that tile. Full tiles
  // take the branch-free path; the last, ragged one also zero-fills k >= K (source: the
  // operand's base, as nothing is read).
  auto load_tile = [&](int s, int k_left) {
    float* const as = smem + s * kStageFloats;
    float* const bs = as + kBK * kLdA;
    if (k_left >= kBK) {
#pragma unroll
      for (int c = 0; c < kCopiesA; ++c) {
        const int r = c % kPassesA, k = a_k + 8 * (c / kPassesA);
        cp_async4(&as[k * kLdA + a_row + kRowsA * r], a_src[r] + 8 * (c / kPassesA), a_bytes[r]);
      }
#pragma unroll
      for (int c = 0; c < kCopiesB; ++c) copy_b(&bs[(b_k + kRowsB * c) * kBN + b_n], b_src + c * b_pass, b_bytes);
    } else {
#pragma unroll
      for (int c = 0; c < kCopiesA; ++c) {
        const int r = c % kPassesA, k = a_k + 8 * (c / kPassesA);
        const bool ok = k < k_left;
        cp_async4(&as[k * kLdA + a_row + kRowsA * r], ok ? a_src[r] + 8 * (c / kPassesA) : p.a, ok ? a_bytes[r] : 0);
      }
#pragma unroll
      for (int c = 0; c < kCopiesB; ++c) {
        const bool ok = b_k + kRowsB * c < k_left;
        copy_b(&bs[(b_k + kRowsB * c) * kBN + b_n], ok ? b_src + c * b_pass : p.b, ok ? b_bytes : 0);
      }
    }
#pragma unroll
    for (int r = 0; r < kPassesA; ++r) a_src[r] += kBK;
    b_src += kBK * p.ldb;
  };

  const int tiles_k = (p.K + kBK - 1) / kBK;
  // Prologue: kStages - 1 tiles in flight. Every thread commits one group per tile slot, empty
  // ones included, so "wait until <= kStages - 2 groups are pending" always means "my copies of
  // the tile about to be computed have landed".
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles_k) load_tile(s, p.K - s * kBK);
    cp_async_commit();
  }
  ThreadTile tile(t % 32);
  int read = 0, write = kStages - 1;
  for (int kt = 0; kt < tiles_k; ++kt) {
    cp_async_wait<kStages - 2>();
    // One barrier does two jobs: every thread's copies of tile kt are visible, and every warp
    // has finished computing tile kt-1, whose stage (== write) the copies below refill.
    __syncthreads();
    if (kt + kStages - 1 < tiles_k) load_tile(write, p.K - (kt + kStages - 1) * kBK);
    cp_async_commit();
    const float* const as = smem + read * kStageFloats;
    const float* const bs = as + kBK * kLdA;
    // Fragments double-buffered in registers: the LDS.128s of step k+1 are issued before the
    // 128 FFMAs of step k, which hide their ~30-cycle latency.
    ThreadTile::Fragment frag[2];
    tile.load(frag[0], as + wm, bs + wn);
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      if (k + 1 < kBK) tile.load(frag[(k + 1) % 2], as + (k + 1) * kLdA + wm, bs + (k + 1) * kBN + wn);
      tile.fma(frag[k % 2]);
    }
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
