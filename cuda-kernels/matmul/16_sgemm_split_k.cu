/*
Step 16 — fp32 split-K: a tile shape per problem, K cut across blocks, slices added in order
Changed:  step 8's kernel (a cp.async ring of 3 stages, a transposed in shared memory, 8 x 16
          accumulators a thread, FFMAs column by column) as one template on four block tiles:
          128 x 256 (8 warps, one block an SM), 64 x 128 and 64 x 64 (4 warps, two blocks an
          SM), and 16 x 256 where M <= 16 (its lanes a 2 x 16 grid, not 8 x 4). A warp tile is
          always 4,096 outputs, so where a block tile has fewer warp tiles than warps, the warps
          split its k and add their partial tiles in shared memory in a fixed order. A stage
          that is not K's ragged last one issues its copies without step 8's per-copy selects.
          Then K is split across blocks: the tiles of whole waves (slots = SMs x blocks an SM,
          from the occupancy API) run over all of K; the tiles of the last, partial wave are
          cut into S k-slices, each writing its fp32 partial tile to a workspace. A second
          kernel (a programmatic dependent launch, as in step 14) adds each output's S partials
          in the order 0 .. S-1, the same bits on every run; where the split tile is small it
          takes a thread per output with all S loads in flight, in blocks small enough to reach
          every SM. S = 1 stores out directly: no workspace, no second kernel. Tile and S are
          the lowest of one estimate (choose_plan): the busiest scheduler's FFMA work, padding
          included, plus the reduction's launch and the longer of its bytes through L2 and its
          chain of L2 round trips.
Why:      step 8 cuts out into tiles of up to 128 x 256 and shares the last waves' k-tiles by
          stream-K, but one block adds all pieces of a tile: 64 x 16384 x 64 is one tile whose
          1,024 k-tiles are 256 pieces of 4, added by one block, an L2 round trip at a time.
          Here it is one 64 x 64 tile in 64 slices of 256 of K on 64 SMs, and its 4,096
          outputs are added by 4,096 threads, 128 blocks of 32 (one an SM), each with its 64
          partials in flight at once: a thread per 4 outputs would put 1,024 threads on 4 SMs,
          its 1 MB of partials a chain of 8 L2 round trips pulled by 4 SMs. 300 x 8192 x 300 is
          9 tiles of 128 x 128 for 132 SMs; here 25 tiles of 64 x 64 x 10 slices = 250 blocks
          on 264 slots. 1009 x 997 x 1013: 256 tiles of 64 x 64 fill the 264 slots unsplit,
          777 x 1234 x 2345 is 247 tiles of 64 x 128 (128 x 256: 70 on 132 SMs). 3000^3 is
          288 tiles of 128 x 256 = 2 waves + 24; those 24 are split 5 ways (120 blocks of 37-38
          k-tiles), and the last wave takes a fifth of a wave's time. At M <= 16 the product is
          a read of B (67 MB at K = N = 4096): 64-row tiles would multiply 4-64 times the rows
          there are, 16-row tiles keep the FFMAs under the read's time, and 16 tiles x 8 slices
          put 128 SMs on the stream, 2 stages of 69 KB in flight each.
Still:    4096^3 is 3.88 waves of tiles whatever the shape: with a whole tile per block the
          last wave stays 88% full, where step 8's stream-K evens it out. The inner loop is
          step 8's, a few percent leaner: shapes that already fill the machine gain little. A
          64 x 64 tile reads 16 flop per L2 byte (128 x 256: 42.7): 16 bytes an SM a clock at
          the FFMA peak, ~3.7 TB/s over 132 SMs, near what L2 serves; the estimate does not see
          it. A split pays its
          partials' round trip through L2 (2 x S x tile x 4 bytes per split tile) and a second
          launch; step 15's in-kernel fix-up would drop the launch but add a tile's S slices on
          one SM, step 8's wall again at S = 64. The estimate's weights, and its half a k-step
          (~0.6 us) an L2 round trip, are assumptions, not fitted to measurements.
Limits:   A and B need a unit last stride (the dispatcher copies others). B's rows not on 16
          bytes (N % 4 != 0, or an offset view) are first repacked into the workspace, as in
          step 8. M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
Mirrors:  Triton step 07 (split-K: a tile per problem, the slices added in order by a second kernel)
*/
#include "matmul.cuh"

namespace {

// ---- launch configuration --------------------------------------------------------------------
constexpr int kBK = 16;           // k rows a warp multiplies per stage (16 register-tile k-steps)
constexpr int kStages = 3;        // the cp.async ring, as step 8
constexpr int kWarpsPerSm = 8;    // registers: 255 per thread allowed (__launch_bounds__)
constexpr int kGroupM = 8;        // tile rows per L2 group
constexpr int kPadA = 4;          // a's transposed rows: conflict-free copies, 16-byte aligned rows
constexpr int kMinStages = 4;     // a k-slice walks >= 4 stages: the ring's fill is a quarter at most
constexpr int kMaxSplit = 64;     // partials an output adds up at most
constexpr int kReduceThreads = 256;
constexpr int kReduceBatch = 8;   // float4 partials a reduction thread has in flight (scalar: all S)
// -----------------------------------------------------------------------------------------------

// A warp's register tile (step 7's rosetta::ThreadTile with the lane grid as a parameter): the
// lanes form kLanesM rows x kLanesN columns, and lane (r, c) owns the rows {4 kLanesM i + 4r + ii}
// (i < 2, ii < 4) and the columns {4 kLanesN j + 4c + jj} (j < 4, jj < 4): 8 x 16 accumulators,
// 2 + 4 LDS.128 per k-step for 128 FFMAs in every shape. kLanesM = 8 is ThreadTile (64 x 64);
// kLanesM = 2 is 16 x 256, for M <= 16. Either way a warp tile is 4096 outputs, 2048 FFMAs a k-step.
template <int kLanesM>
struct WarpTile {
  static constexpr int kLanesN = 32 / kLanesM;
  static constexpr int kM = 8, kN = 16;
  static constexpr int kWarpM = kLanesM * kM, kWarpN = kLanesN * kN;
  static constexpr int kPieces = kM * kN / 4;  // the accumulators as float4s
  float acc[kM][kN];
  int row, col;  // the lane's offset inside the warp tile: 4r, 4c

  __device__ __forceinline__ explicit WarpTile(int lane) : row(4 * (lane / kLanesN)), col(4 * (lane % kLanesN)) {
#pragma unroll
    for (int i = 0; i < kM; ++i)
#pragma unroll
      for (int j = 0; j < kN; ++j) acc[i][j] = 0.f;
  }

  struct Fragment {
    float a[kM], b[kN];
  };

  // as: the warp's kWarpM values of A at one k (transposed: contiguous in m); bs: its kWarpN of B.
  // A warp's A load reads kLanesM distinct 16-byte pieces, its B load kLanesN (broadcast to the
  // lanes of a column): no bank conflicts, 1 (64 x 64) or 2 (16 x 256) wavefronts for B.
  __device__ __forceinline__ void load(Fragment& f, const float* as, const float* bs) const {
#pragma unroll
    for (int i = 0; i < kM / 4; ++i)
      *reinterpret_cast<float4*>(&f.a[4 * i]) = *reinterpret_cast<const float4*>(as + 4 * kLanesM * i + row);
#pragma unroll
    for (int j = 0; j < kN / 4; ++j)
      *reinterpret_cast<float4*>(&f.b[4 * j]) = *reinterpret_cast<const float4*>(bs + 4 * kLanesN * j + col);
  }

  // Step 8's order: column by column from the middle one, every other column's rows reversed.
  __device__ __forceinline__ void fma_by_columns(const Fragment& f) {
#pragma unroll
    for (int c = 0; c < kN; ++c) {
      const int j = (c + kN / 2) % kN;
#pragma unroll
      for (int r = 0; r < kM; ++r) {
        const int i = c % 2 ? kM - 1 - r : r;
        acc[i][j] = fmaf(f.a[i], f.b[j], acc[i][j]);
      }
    }
  }

  // Piece q = acc[q / 4][4 (q % 4) .. + 3] sits at row row_of(q / 4), columns col_of(q % 4) .. + 3.
  __device__ __forceinline__ int row_of(int i) const { return 4 * kLanesM * (i / 4) + row + i % 4; }
  __device__ __forceinline__ int col_of(int j4) const { return 4 * kLanesN * j4 + col; }
  __device__ __forceinline__ float4 piece(int q) const {
    const float* a = &acc[q / (kN / 4)][4 * (q % (kN / 4))];
    return make_float4(a[0], a[1], a[2], a[3]);
  }
};

// A block: kWarpsM x kWarpsN warp tiles, each computed by kWarpsK warps (the k-groups), which
// split every stage's kWarpsK x 16 rows of k between them.
template <int LanesM, int WarpsM, int WarpsN, int WarpsK>
struct Config {
  using Tile = WarpTile<LanesM>;
  static constexpr int kWarpsN = WarpsN, kWarpsK = WarpsK;
  static constexpr int kBM = WarpsM * Tile::kWarpM, kBN = WarpsN * Tile::kWarpN;
  static constexpr int kWarpTiles = WarpsM * WarpsN;
  static constexpr int kWarps = kWarpTiles * kWarpsK, kThreads = 32 * kWarps;
  static constexpr int kBlocksPerSm = kWarpsPerSm / kWarps;  // registers' view; shared memory may allow fewer
  static constexpr int kStageK = kBK * kWarpsK;              // k rows per stage
  static constexpr int kLdA = kBM + kPadA;
  static constexpr int kStageFloats = kStageK * (kLdA + kBN);
  static constexpr int kSmemBytes = kStages * kStageFloats * int(sizeof(float));
  static constexpr int kRowsA = kThreads / 8;  // a: 8 lanes along k, kRowsA rows per pass
  static constexpr int kPassesA = kBM / kRowsA;
  static constexpr int kCopiesA = kBM * kStageK / kThreads;
  static constexpr int kPerRowB = kBN / 4, kRowsB = kThreads / kPerRowB, kCopiesB = kStageK / kRowsB;
  // The k-groups' exchange, in the ring once it is drained: groups 1.. each leave their tiles.
  static constexpr int kExchangeBytes = (kWarpsK - 1) * kWarpTiles * Tile::kPieces * 32 * 16;
  static_assert(kWarps == 4 || kWarps == 8, "whole blocks fill an SM's 8 warps (1 or 2 blocks)");
  static_assert(kBM % kRowsA == 0 && kCopiesA == kPassesA * (kStageK / 8), "a's copies: whole passes of rows");
  static_assert(kLdA % 8 == 4, "a's transposed copies: a warp's 4 rows x 8 k land in 32 distinct banks");
  static_assert(kThreads % kPerRowB == 0 && kStageK % kRowsB == 0, "b's copies: whole float4 rows per pass");
  static_assert(kSmemBytes <= 227 * 1024, "the ring fits one block's shared memory");
  static_assert(kExchangeBytes <= kSmemBytes, "the k-groups' exchange fits the drained ring");
};

using Wide = Config<8, 2, 4, 1>;    // 128 x 256, step 8's largest: 8 warp tiles
using Mid = Config<8, 1, 2, 2>;     // 64 x 128: 2 warp tiles x 2 k-groups (32 k a stage)
using Small = Config<8, 1, 1, 4>;   // 64 x 64: 1 warp tile x 4 k-groups (64 k a stage)
using Thin = Config<2, 1, 1, 4>;    // 16 x 256 (M <= 16): 1 warp tile x 4 k-groups, 207 KB of ring
static_assert(Wide::kBM == 128 && Wide::kBN == 256 && Mid::kBM == 64 && Mid::kBN == 128 && Small::kBM == 64 &&
              Small::kBN == 64 && Thin::kBM == 16 && Thin::kBN == 256, "the tiles the header names");

// cp.async: copy `bytes` (<= size) from global, zero-fill the rest of the `size`-byte slot (step 8).
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
// Programmatic dependent launch (step 14): the GEMM lets the reduction's blocks be placed; the
// reduction waits until the whole GEMM grid has finished and its stores are visible.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_for_prerequisites() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// What the launcher decided: blocks [0, dp_tiles) take tiles [0, dp_tiles) whole; the others
// take tile dp_tiles + t, k-slice z, with blockIdx.x = dp_tiles + z * tail + t (the slices of one
// z together: blocks placed at once read the same k columns of a and rows of b).
struct Split {
  int dp_tiles, tail, slices;
  float* partials;  // [tail tile t][slice z][kBM x kBN, row-major]; slices > 1 only
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kBlocksPerSm)
    sgemm_split_k(rosetta::MatmulProblem p, Split split) {
  using Tile = typename C::Tile;
  constexpr int kBM = C::kBM, kBN = C::kBN, kLdA = C::kLdA, kStageK = C::kStageK;
  constexpr int kStageFloats = C::kStageFloats;
  extern __shared__ float4 smem4[];  // float4: 16-byte aligned
  float* const smem = reinterpret_cast<float*>(smem4);
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int g = C::kWarpTiles == C::kWarps ? 0 : warp / C::kWarpTiles;  // the warp's k-group
  const int mn = warp % C::kWarpTiles;
  const int wm = (mn / C::kWarpsN) * Tile::kWarpM, wn = (mn % C::kWarpsN) * Tile::kWarpN;
  const int stages = (p.K + kStageK - 1) / kStageK;

  // This block's tile and its stages [kt_begin, kt_end): whole K, or slice z of S (as even as
  // integers allow; the launcher keeps S <= stages / kMinStages, so no slice is empty).
  const bool whole = int(blockIdx.x) < split.dp_tiles;
  int index = blockIdx.x, z = 0, kt_begin = 0, kt_end = stages;
  if (!whole) {
    const int u = blockIdx.x - split.dp_tiles;
    z = u / split.tail;
    index = split.dp_tiles + u % split.tail;
    kt_begin = int(int64_t(stages) * z / split.slices);
    kt_end = int(int64_t(stages) * (z + 1) / split.slices);
  }
  int tm, tn;
  rosetta::tile_coords<kGroupM>(index, (p.M + kBM - 1) / kBM, (p.N + kBN - 1) / kBN, tm, tn);
  const int m0 = tm * kBM, n0 = tn * kBN;

  // a: copy c of thread t is row t/8 + kRowsA * (c % kPassesA), k = t%8 + 8 * (c / kPassesA), a
  // 4-byte copy to as[k][m] (step 8: a warp's writes hit 32 distinct banks). Rows past M point at
  // row M-1 and copy 0 bytes: zero-filled.
  constexpr int kRowsA = C::kRowsA, kPassesA = C::kPassesA;
  const int a_row = t / 8, a_k = t % 8;
  const float* a_src[kPassesA];
  int a_bytes[kPassesA];
#pragma unroll
  for (int r = 0; r < kPassesA; ++r) {
    const int m = m0 + a_row + kRowsA * r;
    a_src[r] = p.a + min(m, p.M - 1) * p.lda + a_k + int64_t(kt_begin) * kStageK;
    a_bytes[r] = m < p.M ? 4 : 0;
  }
  // b: 16-byte copies, lanes along n; past N: column 0, 0 bytes; a partial vector zero-fills.
  constexpr int kPerRow = C::kPerRowB, kRowsB = C::kRowsB;
  const int b_k = t / kPerRow, b_n = 4 * (t % kPerRow);
  const int b_bytes = 4 * max(0, min(4, p.N - (n0 + b_n)));
  const float* b_src = p.b + (b_k + int64_t(kt_begin) * kStageK) * p.ldb + (b_bytes > 0 ? n0 + b_n : 0);
  const int64_t b_pass = kRowsB * p.ldb;

  // The copies of one stage into ring slot s; k_left = K - k0 of that stage. Only the last stage
  // of K can be ragged: there, copies past K read nothing (source: the operand's base) and
  // zero-fill, as in step 8. Every other stage takes the branch without a select per copy: step
  // 8's one select path costs ~7 instructions a copy, ~300 a stage for the 40 copies of a 64 x 64
  // tile (12 for 128 x 256), against one uniform branch.
  auto load_stage = [&](int s, int k_left) {
    float* const as = smem + s * kStageFloats;
    float* const bs = as + kStageK * kLdA;
    if (k_left >= kStageK) {
#pragma unroll
      for (int c = 0; c < C::kCopiesA; ++c)
        cp_async4(&as[(a_k + 8 * (c / kPassesA)) * kLdA + a_row + kRowsA * (c % kPassesA)],
                  a_src[c % kPassesA] + 8 * (c / kPassesA), a_bytes[c % kPassesA]);
#pragma unroll
      for (int c = 0; c < C::kCopiesB; ++c)
        cp_async16(&bs[(b_k + kRowsB * c) * kBN + b_n], b_src + c * b_pass, b_bytes);
    } else {
#pragma unroll
      for (int c = 0; c < C::kCopiesA; ++c) {
        const int r = c % kPassesA, k = a_k + 8 * (c / kPassesA);
        const bool ok = k < k_left;
        cp_async4(&as[k * kLdA + a_row + kRowsA * r], ok ? a_src[r] + 8 * (c / kPassesA) : p.a, ok ? a_bytes[r] : 0);
      }
#pragma unroll
      for (int c = 0; c < C::kCopiesB; ++c) {
        const bool ok = b_k + kRowsB * c < k_left;
        cp_async16(&bs[(b_k + kRowsB * c) * kBN + b_n], ok ? b_src + c * b_pass : p.b, ok ? b_bytes : 0);
      }
    }
#pragma unroll
    for (int r = 0; r < kPassesA; ++r) a_src[r] += kStageK;
    b_src += kStageK * p.ldb;
  };

  // Step 8's pipeline: kStages - 1 stages in flight, one commit group per stage slot (empty
  // ones too), one barrier per stage.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (kt_begin + s < kt_end) load_stage(s, p.K - (kt_begin + s) * kStageK);
    cp_async_commit();
  }
  Tile tile(lane);
  int read = 0, write = kStages - 1;
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt has landed for all; every warp is done with the slot refilled below
    // This warp's 16 rows of the stage (its k-group's). The first fragments are read before the
    // copies are issued: their shared-memory latency passes behind the copies.
    const float* const as = smem + read * kStageFloats + kBK * g * kLdA;
    const float* const bs = smem + read * kStageFloats + kStageK * kLdA + kBK * g * kBN;
    typename Tile::Fragment frag[2];
    tile.load(frag[0], as + wm, bs + wn);
    if (kt + kStages - 1 < kt_end) load_stage(write, p.K - (kt + kStages - 1) * kStageK);
    cp_async_commit();
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      if (k + 1 < kBK) tile.load(frag[(k + 1) % 2], as + (k + 1) * kLdA + wm, bs + (k + 1) * kBN + wn);
      tile.fma_by_columns(frag[k % 2]);
    }
    read = read + 1 == kStages ? 0 : read + 1;
    write = write + 1 == kStages ? 0 : write + 1;
  }
  launch_dependents();  // only placement: the reduction still waits for this whole grid

  // The k-groups' partial tiles meet in the drained ring: groups 1.. write theirs ([group - 1]
  // [warp tile][piece][lane]: a warp's float4 stores are 512 contiguous bytes), group 0 adds them
  // in the order 1, 2, ... to its own and stores the block's tile.
  float4* const exchange = smem4;
  auto slot = [&](int group, int q) { return ((group - 1) * C::kWarpTiles + mn) * Tile::kPieces * 32 + q * 32 + lane; };
  if constexpr (C::kWarpsK > 1) {
    cp_async_wait<0>();  // the trailing groups are empty; no copy may land in the exchange late
    __syncthreads();     // and every warp has read its last stage
    if (g > 0) {
#pragma unroll
      for (int q = 0; q < Tile::kPieces; ++q) exchange[slot(g, q)] = tile.piece(q);
    }
    __syncthreads();
    if (g > 0) return;
  }
  const bool vec = p.N % 4 == 0 && rosetta::aligned16(p.out);
  float4* const partial = whole ? nullptr
                                : reinterpret_cast<float4*>(split.partials) +
                                      (int64_t(index - split.dp_tiles) * split.slices + z) * (kBM * kBN / 4);
#pragma unroll
  for (int q = 0; q < Tile::kPieces; ++q) {
    float4 v = tile.piece(q);
#pragma unroll
    for (int group = 1; group < C::kWarpsK; ++group) {
      const float4 w = exchange[slot(group, q)];
      v = make_float4(v.x + w.x, v.y + w.y, v.z + w.z, v.w + w.w);
    }
    const int r = wm + tile.row_of(q / (Tile::kN / 4)), c = wn + tile.col_of(q % (Tile::kN / 4));
    if (whole) {
      rosetta::ThreadTile::store4(p, m0 + r, n0 + c, v, vec);  // masked at M and N
    } else if (m0 + r < p.M && n0 + c < p.N) {  // what the reduction reads; the rest is padding
      partial[(r * kBN + c) / 4] = v;
    }
  }
}

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float4 add(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// out at the split tiles = the sum of their S partials, in the order z = 0 .. S-1 (the same bits
// whichever block finished first). A thread per kVec consecutive outputs of a tile row; each batch
// of its loads is issued before that batch's adds. kVec = 4: a warp's float4s are 512 contiguous
// bytes of one slice, 8 slices a batch (reductions with 128 such threads an SM or more). kVec = 1:
// a warp's floats are 128 contiguous bytes, every slice in one batch (S <= kMaxSplit): small tiles
// get 4 times the threads, spread in blocks of down to 32 threads over all SMs, one L2 round trip.
template <int kVec>
__global__ void __launch_bounds__(kReduceThreads, kVec == 4 ? 4 : 2)  // <= 64 / 128 registers: no spills
    sum_slices(rosetta::MatmulProblem p, Split split, int bm, int bn) {
  using T = std::conditional_t<kVec == 4, float4, float>;
  constexpr int kBatch = kVec == 4 ? kReduceBatch : kMaxSplit;
  wait_for_prerequisites();  // launched while the GEMM may still run: its partials must be complete
  const int per_row = bn / kVec, per_tile = bm * per_row;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(split.tail) * per_tile) return;
  const int t = int(i / per_tile), e = int(i % per_tile);
  int tm, tn;
  rosetta::tile_coords<kGroupM>(split.dp_tiles + t, (p.M + bm - 1) / bm, (p.N + bn - 1) / bn, tm, tn);
  const int m = tm * bm + e / per_row, n = tn * bn + kVec * (e % per_row);
  if (m >= p.M || n >= p.N) return;  // padding: the GEMM wrote no partial there
  const T* src = reinterpret_cast<const T*>(split.partials) + int64_t(t) * split.slices * per_tile + e;
  T sum{};
  for (int z0 = 0; z0 < split.slices; z0 += kBatch) {
    T v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (z0 + u < split.slices) v[u] = __ldcg(src + int64_t(z0 + u) * per_tile);  // L2: another grid wrote it
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (z0 + u < split.slices) sum = z0 + u == 0 ? v[u] : add(sum, v[u]);  // slice 0, then + 1, + 2, ...
  }
  if constexpr (kVec == 4)
    rosetta::ThreadTile::store4(p, m, n, sum, p.N % 4 == 0 && rosetta::aligned16(p.out));
  else
    p.out[int64_t(m) * p.N + n] = sum;
}

// b (K x N, row stride ldb) -> dst (K x ld4, ld4 = N rounded up to 4 floats): step 8's repack.
__global__ void repack_rows(const float* __restrict__ b, int64_t ldb, float* __restrict__ dst, int64_t ld4, int N,
                            int K) {
  const int col = 4 * int(blockIdx.x * blockDim.x + threadIdx.x);
  if (col >= N) return;
  for (int64_t row = blockIdx.y; row < K; row += gridDim.y)
    *reinterpret_cast<float4*>(dst + row * ld4 + col) = rosetta::load4<false>(b + row * ldb + col, N - col);
}

// ---- the plan ---------------------------------------------------------------------------------
// One candidate tile as the planner sees it.
struct Candidate {
  int bm, bn, warps, warps_k;
  int weight;    // cost per FFMA: 8 for 128 x 256, 9 for the smaller tiles (as step 8 weighs them)
  int resident;  // blocks an SM holds (occupancy API); 0: cannot run here
};

struct Plan {
  int candidate = -1;
  int tiles = 0, dp_tiles = 0, slices = 1;
  int64_t cost = INT64_MAX;
};

// The estimate, in quarters of a warp k-step (2048 FFMAs) of the busiest scheduler, times the
// tile's weight. A block's warps walk `steps` stages while its SM holds `blocks` of the grid's
// blocks (at most `resident`); a scheduler with two or more warps issues a k-step of each in 4
// quarters, one with a single warp in 5 (assumed: no second warp covers its barrier and load
// stalls). The reduction costs kReduceLaunch k-steps (its launch, the wait for the GEMM's last
// blocks) plus the longer of two: its bytes (the partials written and read back) through L2 at one
// k-step per kReduceBytes (~3.5 TB/s), and its latency, a chain of dependent L2 round trips of
// half a k-step each (~0.6 us, loaded: assumed), one per batch of slices a thread has in flight and
// per wave of its threads.
constexpr int64_t kReduceLaunch = 2;
constexpr int64_t kReduceBytes = 4 << 20;
constexpr int kWeightWide = 8;

// How the reduction is launched: float4s a thread where they alone give every SM kVecThreads
// threads, else one float a thread; blocks halved from 256 threads down to 32 until there are two
// an SM.
constexpr int kVecThreads = 128;
struct Reduction {
  int vec, block;
  int64_t blocks, quarters;  // quarters of a k-step of latency (round trips x waves)
};

Reduction reduction_for(int64_t outputs, int slices, int sms) {
  Reduction r{};
  r.vec = outputs / 4 >= int64_t(sms) * kVecThreads ? 4 : 1;
  const int64_t threads = outputs / r.vec;
  r.block = kReduceThreads;
  while (r.block > 32 && rosetta::ceil_div(threads, r.block) < 2 * int64_t(sms)) r.block /= 2;
  r.blocks = rosetta::ceil_div(threads, r.block);
  // Threads an SM holds by registers: 2,048 at 64 a thread (kVec = 4), 512 at 128 (kVec = 1).
  const int64_t resident = int64_t(sms) * std::min(32, (r.vec == 4 ? 2048 : 512) / r.block);
  const int64_t rounds = rosetta::ceil_div(slices, r.vec == 4 ? kReduceBatch : kMaxSplit);
  r.quarters = 2 * rounds * rosetta::ceil_div(r.blocks, resident);
  return r;
}

int64_t scheduler_quarters(const Candidate& c, int64_t blocks, int sms, int64_t steps) {
  const int64_t per_sm = std::min<int64_t>(rosetta::ceil_div(blocks, sms), c.resident);
  const int64_t warps = rosetta::ceil_div(per_sm * c.warps, 4);  // per scheduler
  return (warps == 1 ? 5 : 4 * warps) * steps;
}

// Tiles of whole waves (tiles / slots of them) run whole; the T mod slots tiles of the last wave
// are split S ways, S from 1 up to what fills the slots (>= kMinStages stages a slice, <= kMaxSplit),
// the cheapest S by the estimate kept (ties: the smaller S).
Plan plan_for(const Candidate& c, int index, int M, int N, int K, int sms) {
  Plan best;
  const int64_t tiles = rosetta::ceil_div(M, c.bm) * rosetta::ceil_div(N, c.bn);
  if (c.resident == 0 || tiles > INT_MAX) return best;
  const int64_t slots = int64_t(sms) * c.resident, waves = tiles / slots, tail = tiles % slots;
  const int64_t stages = rosetta::ceil_div(K, kBK * c.warps_k);
  const int64_t full = waves * scheduler_quarters(c, slots, sms, stages);
  const int64_t max_split = tail == 0 ? 1 : std::min({slots / tail, stages / kMinStages, int64_t(kMaxSplit)});
  for (int64_t s = 1; s <= std::max<int64_t>(max_split, 1); ++s) {
    int64_t cost = c.weight * (full + (tail ? scheduler_quarters(c, tail * s, sms, rosetta::ceil_div(stages, s)) : 0));
    if (s > 1) {
      const int64_t bytes = 2 * 4 * s * tail * std::min(M, c.bm) * std::min(N, c.bn);  // written, read back
      const int64_t latency = reduction_for(tail * c.bm * c.bn, int(s), sms).quarters;
      cost += kWeightWide * (4 * kReduceLaunch + std::max(rosetta::ceil_div(4 * bytes, kReduceBytes), latency));
    }
    if (cost < best.cost) best = {index, int(tiles), s > 1 ? int(tiles - tail) : int(tiles), int(s), cost};
  }
  return best;
}

// Tile choice: the lowest estimate over the candidates (ties: the larger tile, listed first).
// 16 x 256 only where one row of tiles covers M (M <= 16): taller problems would read B once per
// 16 rows. Where every SM is full, all shapes cost the same warp k-steps, and the weight keeps
// 128 x 256 (the most flops per byte of L2); smaller tiles win where they fill more slots or
// pad less (odd sizes), or where the split needs fewer partials.
Plan choose_plan(const Candidate* candidates, int count, int M, int N, int K, int sms) {
  Plan best;
  for (int i = 0; i < count; ++i) {
    if (candidates[i].bm == 16 && M > 16) continue;
    const Plan plan = plan_for(candidates[i], i, M, N, K, sms);
    if (plan.cost < best.cost) best = plan;
  }
  return best;
}

// Over 48 KB of dynamic shared memory needs an opt-in per kernel, and 2 blocks an SM a carveout
// that holds both rings (+1 KB reserved per block): step 8's settings, per device, so every call.
template <class C>
cudaError_t configure() {
  const auto kernel = sgemm_split_k<C>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (err != cudaSuccess || C::kBlocksPerSm == 1) return err;
  const int percent = int(rosetta::ceil_div(100 * C::kBlocksPerSm * (C::kSmemBytes + 1024), 228 * 1024));
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, std::min(percent, 100));
}

template <class C>
Candidate candidate() {
  // Blocks an SM holds, read once rather than assumed (as step 14): two 64 x 64 rings of 99 KB
  // need Hopper's 228 KB an SM; 16 x 256's 207 KB ring fits no GPU with less than 227 KB a block.
  static const int resident = [] {
    int blocks = 0;
    if (configure<C>() != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, sgemm_split_k<C>, C::kThreads, C::kSmemBytes) !=
            cudaSuccess) {
      cudaGetLastError();  // a tile this device cannot run is not chosen, and not an error
      return 0;
    }
    return std::min(blocks, C::kBlocksPerSm);
  }();
  return {C::kBM, C::kBN, C::kWarps, C::kWarpsK, std::is_same_v<C, Wide> ? kWeightWide : kWeightWide + 1, resident};
}

template <class C>
cudaError_t launch(const rosetta::MatmulArgs& args, const rosetta::MatmulProblem& p, const Plan& plan,
                   cudaStream_t stream) {
  const cudaError_t err = configure<C>();
  if (err != cudaSuccess) return err;
  Split split{plan.dp_tiles, plan.tiles - plan.dp_tiles, plan.slices, nullptr};
  if (plan.slices > 1) split.partials = args.workspace.get<float>(int64_t(split.tail) * split.slices * C::kBM * C::kBN);
  const int64_t blocks = plan.dp_tiles + int64_t(split.tail) * split.slices;
  sgemm_split_k<C><<<unsigned(blocks), C::kThreads, C::kSmemBytes, stream>>>(p, split);
  if (plan.slices == 1) return cudaSuccess;  // launch errors: the caller's cudaGetLastError

  // The reduction, as a programmatic dependent launch: its blocks may be placed while the GEMM's
  // last ones finish (they wait in griddepcontrol.wait), which hides its launch latency.
  const Reduction r =
      reduction_for(int64_t(split.tail) * C::kBM * C::kBN, split.slices, std::max(rosetta::sm_count(), 1));
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(r.blocks));
  config.blockDim = dim3(unsigned(r.block));
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return r.vec == 4 ? cudaLaunchKernelEx(&config, sum_slices<4>, p, split, C::kBM, C::kBN)
                    : cudaLaunchKernelEx(&config, sum_slices<1>, p, split, C::kBM, C::kBN);
}

}  // namespace

cudaError_t matmul_16_sgemm_split_k(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::matmul_launch(args, stream, [&](rosetta::MatmulProblem p) {
    const Candidate candidates[] = {candidate<Wide>(), candidate<Mid>(), candidate<Small>(), candidate<Thin>()};
    const Plan plan = choose_plan(candidates, 4, p.M, p.N, p.K, std::max(rosetta::sm_count(), 1));
    if (plan.candidate < 0) {  // no tile fits the device, or over 2^31 tiles (out alone would be 32 TB)
      status = cudaErrorInvalidValue;
      return;
    }
    if (!rosetta::vec4_ok(p.b, p.ldb)) {  // b's rows break 16-byte alignment: repack it first (step 8)
      const int64_t ld4 = rosetta::ceil_div(p.N, 4) * 4;
      float* packed = args.workspace.get<float>(p.K * ld4);
      const dim3 grid(unsigned(rosetta::ceil_div(ld4 / 4, 256)), unsigned(std::min(p.K, 65535)));
      repack_rows<<<grid, 256, 0, stream>>>(p.b, p.ldb, packed, ld4, p.N, p.K);
      p.b = packed;
      p.ldb = ld4;
    }
    switch (plan.candidate) {
      case 0: status = launch<Wide>(args, p, plan, stream); break;
      case 1: status = launch<Mid>(args, p, plan, stream); break;
      case 2: status = launch<Small>(args, p, plan, stream); break;
      default: status = launch<Thin>(args, p, plan, stream); break;
    }
  });
  return status != cudaSuccess ? status : launched;
}
