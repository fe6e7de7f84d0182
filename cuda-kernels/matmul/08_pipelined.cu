/*
Step 8 — cp.async multi-stage pipeline, and a last wave that fills the GPU
Changed:  global -> shared copies go through cp.async (sm_80+) into a ring of kStages shared
          buffers: while tile k is computed, tiles k+1 .. k+kStages-1 are in flight, and one
          barrier per tile replaces two. a is still transposed on the way in (4-byte copies,
          each to its place in as[k][m]); b moves in 16-byte copies. Out-of-range elements are
          zero-filled by cp.async's src-size operand, with no branch around the copy. With no
          staging registers, the block tile grows to 128 x 256 (8 warps, 1 block per SM), and the
          fragments of k-step k+1 are loaded from shared memory before the FFMAs of step k.
          Two launcher decisions for shapes that are not multiples of everything:
          - the last, partial wave of tiles is split along K (plan_tail): with T tiles on 132
            slots, T mod 132 tail tiles run as up to 132 / (T mod 132) blocks each, and the block
            that finishes a tile last adds its partials in a fixed order (deterministic);
          - a b whose rows are not 16-byte aligned (N % 4 != 0, or an offset view) is repacked
            into a padded copy first, rather than copied 4 bytes at a time.
Why:      in step 7 a block's global latency (~1 us per tile from L2/DRAM) sat between its
          barriers, hidden only by the other resident block. With the copies kStages - 1 tiles
          ahead, the block's warps go from one tile's FFMAs to the next with one barrier
          between. Global intensity: (128 + 256) x 16 x 4 B per 128 x 256 x 16 x 2 flops =
          42.7 flop/B (step 7: 32); shared 16 flop/B per warp and 21 FFMA per LDS.128 as in
          step 7. Copies cost one LDGSTS each (per-row source pointers, immediate offsets):
          ncu counted 91.8% of issued instructions as FFMA at 4096^3 (step 7: 89.2%).
          Wave quantization: 3000^3 has 288 tiles = 2 waves + 24 tiles, so a third of the time
          ran 24 of 132 SMs (0.74x cuBLAS). Split 5 ways, the tail takes 1/5 of a wave: predicted
          3 -> 2.2 waves, 1.36x; measured 1.67 -> 1.27 ms (0.97x cuBLAS). 4097 x 4095 x 4099:
          561 tiles = 4 waves + 33, split 4 ways: predicted 5 -> 4.25 waves, measured 4.20 -> 3.50
          ms; its b (N = 4099) took 4x the copy instructions, ~6% per wave, and the repack (one
          read and one write of b) brought it to 3.42 ms (0.87x cuBLAS).
Still:    ~27% of scheduler cycles have no eligible warp (ncu): 2 warps per scheduler barely
          cover LDS latency and register-bank stalls, so FFMA issue sits near 70% of peak;
          cuBLAS's hand-scheduled SASS reaches ~78% (0.86-0.87x at 4096^3 and 8192^3). The split
          tail pays a round trip of its partials through L2 and its own pipeline fill. FP32 FFMA
          tops out at ~60-67 TFLOP/s however fed: the tensor cores are the next rung.
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
constexpr int kMinSplitTiles = 4;  // a K range of a split tile: at least 4 k-tiles (64 k)
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

// The last, partial wave of tiles runs split along K (see the launcher): blocks [0, full) compute
// tiles [0, full) whole; block full + u * splits + s computes split s of tile full + u, whose
// k-tiles are [s * per_split, (s + 1) * per_split), and the block of the tile's last arriving
// split adds the splits' partials in the order s = 0, 1, ... (deterministic) and stores it.
struct TailSplit {
  int full, splits, per_split;
  unsigned* tickets;  // one per split tile, zeroed before the launch
  float4* partials;   // [tile][split][kPartial4][kThreads]
};
constexpr int kPartial4 = ThreadTile::kM * ThreadTile::kN / 4;  // a thread's accumulators as float4s

// Publishes this split's accumulators and takes a ticket for the tile; the block that draws the
// last one adds the tile's partials, in split order (the same rounding every run, whichever block
// finishes last), and stores the sum at (m0, n0) of out. The partials are read back from L2 (.cg:
// other SMs wrote them), so no accumulator stays live here.
__device__ void finish_split(const ThreadTile& tile, const rosetta::MatmulProblem& p, const TailSplit& ts,
                             int m0, int n0, bool vec) {
  __shared__ bool last;
  const int t = threadIdx.x, tail_block = blockIdx.x - ts.full;
  const int unit = tail_block / ts.splits, split = tail_block % ts.splits;
  // Element q of thread t of split s at [s][q][t]: each store and load is one coalesced row.
  float4* const slots = ts.partials + int64_t(unit) * ts.splits * kPartial4 * kThreads + t;
  float4* const mine = slots + split * kPartial4 * kThreads;
  constexpr int kPerRow = ThreadTile::kN / 4;
#pragma unroll
  for (int q = 0; q < kPartial4; ++q) {
    const float* a = &tile.acc[q / kPerRow][4 * (q % kPerRow)];
    __stcg(mine + q * kThreads, make_float4(a[0], a[1], a[2], a[3]));
  }
  __threadfence();  // the partial is visible GPU-wide before the ticket that announces it
  __syncthreads();
  if (t == 0) last = atomicAdd(&ts.tickets[unit], 1u) == unsigned(ts.splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
#pragma unroll 4
  for (int q = 0; q < kPartial4; ++q) {
    float4 sum = __ldcg(slots + q * kThreads);
    for (int s = 1; s < ts.splits; ++s) {
      const float4 v = __ldcg(slots + (s * kPartial4 + q) * kThreads);
      sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
    }
    ThreadTile::store4(p, m0 + tile.row_of(q / kPerRow), n0 + tile.col_of(q % kPerRow), sum, vec);
  }
}

__global__ void __launch_bounds__(kThreads, kBlocksPerSm) matmul_pipelined(rosetta::MatmulProblem p, TailSplit ts) {
  extern __shared__ float4 smem4[];  // float4: 16-byte aligned
  float* const smem = reinterpret_cast<float*>(smem4);
  const int t = threadIdx.x, warp = t / 32;
  const int tiles_k = (p.K + kBK - 1) / kBK;
  // A split of a tail tile (its unit and split are recomputed after the main loop rather than
  // held in registers through it).
  const bool in_tail = int(blockIdx.x) >= ts.full;
  const int unit = in_tail ? (blockIdx.x - ts.full) / ts.splits : 0;
  const int split = in_tail ? (blockIdx.x - ts.full) % ts.splits : 0;
  const int index = in_tail ? ts.full + unit : blockIdx.x;
  const int kt_begin = split * ts.per_split, kt_end = in_tail ? min(kt_begin + ts.per_split, tiles_k) : tiles_k;
  int tm, tn;
  rosetta::tile_coords<kGroupM>(index, (p.M + kBM - 1) / kBM, (p.N + kBN - 1) / kBN, tm, tn);
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
    a_src[r] = p.a + min(m, p.M - 1) * p.lda + a_k + kt_begin * kBK;
    a_bytes[r] = m < p.M ? 4 : 0;
  }
  // b: lanes along n; a pass covers kRowsB rows of the tile. Past N: column 0, 0 bytes.
  constexpr int kPerRow = kBN / 4, kRowsB = kThreads / kPerRow, kCopiesB = kBK / kRowsB;
  const int b_k = t / kPerRow, b_n = 4 * (t % kPerRow);
  const int b_bytes = 4 * max(0, min(4, p.N - (n0 + b_n)));  // partial vectors zero-fill
  const float* b_src = p.b + (b_k + int64_t(kt_begin) * kBK) * p.ldb + (b_bytes > 0 ? n0 + b_n : 0);
  const int64_t b_pass = kRowsB * p.ldb;

  // Issues the copies of the next k-tile into stage s; k_left = K - k0 of that tile. Only the last
  // k-tile of K can be ragged: its copies past K read nothing (source: the operand's base) and
  // zero-fill. One code path with selects, not a branch per case: measured ~1% faster at 4096^3.
  auto load_tile = [&](int s, int k_left) {
    float* const as = smem + s * kStageFloats;
    float* const bs = as + kBK * kLdA;
    const bool full = k_left >= kBK;
#pragma unroll
    for (int c = 0; c < kCopiesA; ++c) {
      const int r = c % kPassesA, k = a_k + 8 * (c / kPassesA);
      const bool ok = full || k < k_left;
      cp_async4(&as[k * kLdA + a_row + kRowsA * r], ok ? a_src[r] + 8 * (c / kPassesA) : p.a, ok ? a_bytes[r] : 0);
    }
#pragma unroll
    for (int c = 0; c < kCopiesB; ++c) {
      const bool ok = full || b_k + kRowsB * c < k_left;
      cp_async16(&bs[(b_k + kRowsB * c) * kBN + b_n], ok ? b_src + c * b_pass : p.b, ok ? b_bytes : 0);
    }
#pragma unroll
    for (int r = 0; r < kPassesA; ++r) a_src[r] += kBK;
    b_src += kBK * p.ldb;
  };

  // Prologue: kStages - 1 tiles in flight. Every thread commits one group per tile slot, empty
  // ones included, so "wait until <= kStages - 2 groups are pending" always means "my copies of
  // the tile about to be computed have landed".
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (kt_begin + s < kt_end) load_tile(s, p.K - (kt_begin + s) * kBK);
    cp_async_commit();
  }
  ThreadTile tile(t % 32);
  int read = 0, write = kStages - 1;
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait<kStages - 2>();
    // One barrier does two jobs: every thread's copies of tile kt are visible, and every warp
    // has finished computing tile kt-1, whose stage (== write) the copies below refill.
    __syncthreads();
    if (kt + kStages - 1 < kt_end) load_tile(write, p.K - (kt + kStages - 1) * kBK);
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
  const bool vec = p.N % 4 == 0 && rosetta::aligned16(p.out);
  if (ts.splits > 1 && int(blockIdx.x) >= ts.full) finish_split(tile, p, ts, m0 + wm, n0 + wn, vec);
  else tile.store(p, m0 + wm, n0 + wn, vec);
}

// b (K x N, row stride ldb) -> dst (K x ld4, ld4 = N rounded up to 4 floats): a thread per column
// vector and grid row, 4-byte loads that a warp coalesces, a 16-byte store. The padding columns
// of a row's last vector are written as zeros (load4), though the GEMM's copies never read them.
__global__ void repack_rows(const float* __restrict__ b, int64_t ldb, float* __restrict__ dst, int64_t ld4, int N,
                            int K) {
  const int col = 4 * int(blockIdx.x * blockDim.x + threadIdx.x);
  if (col >= N) return;
  for (int64_t row = blockIdx.y; row < K; row += gridDim.y)
    *reinterpret_cast<float4*>(dst + row * ld4 + col) = rosetta::load4<false>(b + row * ldb + col, N - col);
}

// Wave quantization: T tiles run on S = SMs x kBlocksPerSm slots in waves, and a last wave of
// T mod S tiles takes a whole wave's time with most SMs idle (3000^3: 288 tiles on 132 slots =
// 2 waves + 24 tiles, which cost a third of the time). Those tail tiles are split along K into
// up to S / tail pieces of at least kMinSplitTiles k-tiles, so the tail wave runs on every SM and
// takes 1 / splits of a wave, plus the partials' round trip through L2.
TailSplit plan_tail(const rosetta::MatmulArgs& args, int tiles, int tiles_k) {
  const int slots = rosetta::sm_count() * kBlocksPerSm;
  const int full = tiles / slots * slots, tail = tiles - full;
  int splits = tail > 0 ? std::min(slots / tail, tiles_k / kMinSplitTiles) : 1;
  if (splits < 2) return {tiles, 1, tiles_k, nullptr, nullptr};
  const int per_split = int(rosetta::ceil_div(tiles_k, splits));
  splits = int(rosetta::ceil_div(tiles_k, per_split));  // no empty split
  const int64_t ticket_floats = rosetta::ceil_div(tail, 4) * 4;  // partials stay 16-byte aligned
  float* ws = args.workspace.get<float>(ticket_floats + int64_t(tail) * splits * kPartial4 * kThreads * 4);
  return {full, splits, per_split, reinterpret_cast<unsigned*>(ws), reinterpret_cast<float4*>(ws + ticket_floats)};
}

}  // namespace

cudaError_t matmul_08_pipelined(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](rosetta::MatmulProblem p) {
    if (!rosetta::vec4_ok(p.b, p.ldb)) {  // b's rows break 16-byte alignment: repack it first
      const int64_t ld4 = rosetta::ceil_div(p.N, 4) * 4;
      float* packed = args.workspace.get<float>(p.K * ld4);
      const dim3 grid(unsigned(rosetta::ceil_div(ld4 / 4, 256)), unsigned(std::min(p.K, 65535)));
      repack_rows<<<grid, 256, 0, stream>>>(p.b, p.ldb, packed, ld4, p.N, p.K);
      p.b = packed;
      p.ldb = ld4;
    }
    const int tiles = int(rosetta::ceil_div(p.M, kBM) * rosetta::ceil_div(p.N, kBN));
    const TailSplit ts = plan_tail(args, tiles, int(rosetta::ceil_div(p.K, kBK)));
    if (ts.splits > 1 && cudaMemsetAsync(ts.tickets, 0, (tiles - ts.full) * sizeof(unsigned), stream) != cudaSuccess) return;
    const int64_t blocks = ts.full + int64_t(tiles - ts.full) * ts.splits;
    // Over 48 KB of dynamic shared memory needs an opt-in per kernel (per device: every call).
    if (cudaFuncSetAttribute(matmul_pipelined, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) != cudaSuccess) return;
    matmul_pipelined<<<blocks, kThreads, kSmemBytes, stream>>>(p, ts);
  });
}
