/*
Step 8 — cp.async multi-stage pipeline, stream-K for the last waves, FFMAs in reuse order
Changed:  global -> shared copies go through cp.async (sm_80+) into a ring of kStages shared
          buffers: while tile k is computed, tiles k+1 .. k+kStages-1 are in flight, and one
          barrier per tile replaces two. a is still transposed on the way in (4-byte copies,
          each to its place in as[k][m]); b moves in 16-byte copies. Out-of-range elements are
          zero-filled by cp.async's src-size operand, with no branch around the copy. With no
          staging registers, the block tile grows to 128 x 256 (8 warps, 1 block per SM), and the
          fragments of k-step k+1 are loaded from shared memory before the FFMAs of step k.
          Four later revisions, each measured on its own (the fourth not yet):
          - stream-K (plan_stream_k): the k-tiles of the last two waves of tiles are shared
            evenly by 132 blocks, whose ranges may start and end inside a tile; the block that
            finishes a tile's last piece adds the pieces in a fixed order (deterministic);
          - a b whose rows are not 16-byte aligned (N % 4 != 0, or an offset view) is repacked
            into a padded copy first, rather than copied 4 bytes at a time;
          - the 128 FFMAs of a k-step run column by column (ThreadTile::fma_by_columns);
          - the block tile is chosen per problem (pick_shape) among 128 x 256, 128 x 128 and
            64 x 128, the same kernel templated on it, 8 warps per SM in each (1, 2 or 4 blocks).
Why:      in step 7 a block's global latency (~1 us per tile from L2/DRAM) sat between its
          barriers, hidden only by the other resident block. With the copies kStages - 1 tiles
          ahead, the block's warps go from one tile's FFMAs to the next with one barrier
          between. Global intensity: (128 + 256) x 16 x 4 B per 128 x 256 x 16 x 2 flops =
          42.7 flop/B (step 7: 32); shared 16 flop/B per warp and 21 FFMA per LDS.128 as in
          step 7. Copies cost one LDGSTS each (per-row source pointers, immediate offsets):
          ncu counted 91.8% of issued instructions as FFMA at 4096^3 (step 7: 89.2%).
          Wave quantization: a problem of 2-3 waves of tiles leaves SMs idle in the last one;
          stream-K over the last two waves gives every SM (132 + tail) / 132 tiles of work.
          FFMA order: the same tile and instruction count as cuBLAS's SGEMM, but fewer issue
          slots used (register-file bank conflicts, counted in the SASS): column order with
          serpentine rows reads the fewest extra banks. Tile choice: the launcher takes a
          smaller tile only where it fills more of the SMs (300 x 8192 x 300); shapes that fill
          the machine keep 128 x 256. KERNEL_LOG has the measurements behind each choice.
Still:    ~70% of FFMA peak where cuBLAS's SASS reaches ~79%: register allocation is ptxas's,
          and CUDA C can only steer it by the order of the FFMAs. The stream-K pieces pay a round
          trip through L2 and a pipeline fill each, and one block adds a tile's pieces: at
          300 x 8192 x 300, 35 pieces of 32 KB per 64 x 128 tile, ~3 L2 round trips per float4
          of a thread, 96 in a row, which the estimate does not count. FP32 FFMA tops out at
          ~60-67 TFLOP/s however fed: the tensor cores are the next rung.
Roofline: global 42.7 flop/B <= 277 (L2); shared as step 7 (<= 356); registers: 2048
          FFMA of the loop's 2,314 instructions (LDGSTS replaces LDG + STS) <= 0.89 x 65.3 = 58.
          Bound ~58 TFLOP/s; cuBLAS's SGEMM, with the same tile, reaches 51.8 (0.79 of FFMA
          peak): the gap to either is issue efficiency (stalls), not bytes.
Limits:   M, N, K < 2^31.
Dtypes:   float32
Layout:   rows
*/
#include "matmul.cuh"

namespace {

using rosetta::ThreadTile;

// ---- launch configuration --------------------------------------------------------------------
// Every block tile is whole 64 x 64 warp tiles (ThreadTile), and an SM holds kWarpsPerSm of them
// in any shape: 8 warps of up to 255 registers fill its 64K registers, 2 warps per scheduler.
// So a wave of any shape is 8 warp tiles per SM, ~the same time; a smaller block tile only cuts
// the output into finer pieces (less padding, more tiles to fill 132 SMs with) at the price of
// more L2 bytes and copy instructions per FFMA. 128 x 256 (1 block per SM, ptxas: 247 registers,
// no spills) raises global intensity to 42.7 flop/B; measured on the H100 (4096^3, fragments
// double-buffered): 44.4 TFLOP/s vs 42.8 for step 7's 128 x 128 x 2 blocks per SM, same pipeline.
constexpr int kBK = 16;
constexpr int kStages = 3;        // 3 x 24.8 KB of shared memory at 128 x 256 (4 stages measured no faster)
constexpr int kWarpsPerSm = 8;    // registers: 255 per thread allowed
constexpr int kGroupM = 8;        // tile rows per L2 group
constexpr int kMinSplitTiles = 4; // a stream-K block's range: at least 4 k-tiles (64 k)
constexpr int kPadA = 4;  // keeps the transposed copies conflict-free and rows 16-byte aligned
// The block tiles, largest first: the launcher picks one per problem (pick_shape). Not 64 x 64:
// as 1-warp blocks ptxas gave it a 228-register allocation with 676 extra register-bank reads per
// 2048 FFMA (SASS count, see the header) against 163 here and 142 for 128 x 128 and 64 x 128.
struct Shape {
  int bm, bn;
};
constexpr Shape kShapes[] = {{128, 256}, {128, 128}, {64, 128}};
// -----------------------------------------------------------------------------------------------

template <int kBM, int kBN>
struct Config {
  static constexpr int kWarps = (kBM / ThreadTile::kWarpM) * (kBN / ThreadTile::kWarpN);
  static constexpr int kWarpsN = kBN / ThreadTile::kWarpN;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlocksPerSm = kWarpsPerSm / kWarps;
  static constexpr int kLdA = kBM + kPadA;
  static constexpr int kStageFloats = kBK * kLdA + kBK * kBN;
  static constexpr int kSmemBytes = kStages * kStageFloats * int(sizeof(float));
  static constexpr int kRowsA = kThreads / 8;  // a: 8 lanes along k, kRowsA rows per pass
  static constexpr int kPassesA = kBM / kRowsA;
  static constexpr int kCopiesA = kBM * kBK / kThreads;
  static constexpr int kPerRowB = kBN / 4, kRowsB = kThreads / kPerRowB, kCopiesB = kBK / kRowsB;
  static_assert(kBM % ThreadTile::kWarpM == 0 && kBN % ThreadTile::kWarpN == 0, "whole warp tiles");
  static_assert(kWarpsPerSm % kWarps == 0, "whole blocks fill an SM's 8 warps");
  static_assert(kBK % 8 == 0 && kBM % kRowsA == 0 && kCopiesA == kPassesA * (kBK / 8),
                "a's copies: 8 lanes along k, whole passes of rows");
  static_assert(kLdA % 32 == 4, "a's transposed copies: a warp's 4 rows x 8 k land in banks 4k + m, all 32");
  static_assert(kThreads % kPerRowB == 0 && kBK % kRowsB == 0, "b's copies: whole float4 rows per pass");
  static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "a ring of stages that fits a block");
  static_assert(kBlocksPerSm * (kSmemBytes + 1024) <= 228 * 1024,
                "the resident blocks' rings (+1 KB reserved per block) fit an SM's 228 KB");
  static_assert(kLdA % 4 == 0 && kStageFloats % 4 == 0, "16-byte aligned rows and stages");
};

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

// Stream-K (Osama et al., 2023) over the last two waves. Number every k-tile of every tile
// tile-major: tile i owns k-tiles [i * tiles_k, (i + 1) * tiles_k). Blocks [0, dp_tiles) take one
// whole tile each (data-parallel, as before). The sk_blocks blocks after them split the k-tiles of
// the remaining tiles into equal, contiguous ranges, so a range may start or end inside a tile:
// such a piece of a tile is a partial sum. Every block of a tile's pieces publishes its partial and
// takes a ticket; the block that draws the last ticket adds the partials in block order
// (deterministic, whichever block finishes last) and stores the tile.
struct StreamK {
  int dp_tiles, sk_blocks;
  int64_t sk_iters;   // k-tiles shared by the stream-K blocks: (tiles - dp_tiles) * tiles_k
  unsigned* tickets;  // one per stream-K tile, zeroed before the launch
  float4* partials;   // [stream-K block][its first or last piece][kPartial4][block's threads]

  // Stream-K block b's range starts at begin(b), local to the stream-K tiles; block_of inverts it.
  __device__ int64_t begin(int b) const { return int64_t(b) * sk_iters / sk_blocks; }
  __device__ int block_of(int64_t it) const { return int(((it + 1) * sk_blocks - 1) / sk_iters); }
};
constexpr int kPartial4 = ThreadTile::kM * ThreadTile::kN / 4;  // a thread's accumulators as float4s

// Publishes this block's piece of stream-K tile u (slot 0 if the piece starts the block's range,
// else 1: only a range's first and last pieces can be partial) and takes the tile's ticket; the
// block that draws the last one adds the pieces of blocks c0 .. c1 in that order (the same rounding
// every run) and stores the sum at (m0, n0) of out. The partials are read back from L2 (.cg: other
// SMs wrote them).
template <int kThreads>
__device__ void finish_piece(const ThreadTile& tile, const rosetta::MatmulProblem& p, const StreamK& sk, int u,
                             int tiles_k, bool first_piece, int m0, int n0, bool vec) {
  __shared__ bool last;
  const int t = threadIdx.x;
  const int64_t u_begin = int64_t(u) * tiles_k;
  const int c0 = sk.block_of(u_begin), c1 = sk.block_of(u_begin + tiles_k - 1);
  // Element q of thread t of a piece at [q][t]: each store and load is one coalesced row.
  auto piece = [&](int block, int slot) { return sk.partials + (int64_t(2 * block + slot) * kPartial4) * kThreads + t; };
  float4* const mine = piece(blockIdx.x - sk.dp_tiles, first_piece ? 0 : 1);
  constexpr int kPerRow = ThreadTile::kN / 4;
#pragma unroll
  for (int q = 0; q < kPartial4; ++q) {
    const float* a = &tile.acc[q / kPerRow][4 * (q % kPerRow)];
    __stcg(mine + q * kThreads, make_float4(a[0], a[1], a[2], a[3]));
  }
  __threadfence();  // the partial is visible GPU-wide before the ticket that announces it
  __syncthreads();
  if (t == 0) last = atomicAdd(&sk.tickets[u], 1u) == unsigned(c1 - c0);
  __syncthreads();
  if (!last) return;
  __threadfence();
#pragma unroll 4
  for (int q = 0; q < kPartial4; ++q) {
    float4 sum = __ldcg(piece(c0, sk.begin(c0) >= u_begin ? 0 : 1) + q * kThreads);
    for (int c = c0 + 1; c <= c1; ++c) {  // later blocks start inside tile u: their first piece
      const float4 v = __ldcg(piece(c, 0) + q * kThreads);
      sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
    }
    ThreadTile::store4(p, m0 + tile.row_of(q / kPerRow), n0 + tile.col_of(q % kPerRow), sum, vec);
  }
}

template <int kBM, int kBN>
__global__ void __launch_bounds__(Config<kBM, kBN>::kThreads, Config<kBM, kBN>::kBlocksPerSm)
    matmul_pipelined(rosetta::MatmulProblem p, StreamK sk) {
  using C = Config<kBM, kBN>;
  constexpr int kLdA = C::kLdA, kStageFloats = C::kStageFloats, kThreads = C::kThreads;
  extern __shared__ float4 smem4[];  // float4: 16-byte aligned
  float* const smem = reinterpret_cast<float*>(smem4);
  const int t = threadIdx.x, warp = t / 32;
  const int tiles_k = (p.K + kBK - 1) / kBK;
  const int wm = (warp / C::kWarpsN) * ThreadTile::kWarpM, wn = (warp % C::kWarpsN) * ThreadTile::kWarpN;
  const bool vec = p.N % 4 == 0 && rosetta::aligned16(p.out);
  // This block's k-tiles [it, end), numbered tile-major (see StreamK).
  int64_t it, end;
  if (int(blockIdx.x) < sk.dp_tiles) {
    it = int64_t(blockIdx.x) * tiles_k;
    end = it + tiles_k;
  } else {
    const int b = blockIdx.x - sk.dp_tiles;
    it = int64_t(sk.dp_tiles) * tiles_k + sk.begin(b);
    end = int64_t(sk.dp_tiles) * tiles_k + sk.begin(b + 1);
  }
  for (bool first_piece = true; it < end; first_piece = false) {
    const int index = int(it / tiles_k);
    const int kt_begin = int(it - int64_t(index) * tiles_k);
    const int kt_end = end - it < tiles_k - kt_begin ? kt_begin + int(end - it) : tiles_k;
    it += kt_end - kt_begin;
    int tm, tn;
    rosetta::tile_coords<kGroupM>(index, (p.M + kBM - 1) / kBM, (p.N + kBN - 1) / kBN, tm, tn);
    const int m0 = tm * kBM, n0 = tn * kBN;
    // a: copy c of thread t is row t/8 + kRowsA * (c % kPassesA), k = t%8 + 8 * (c / kPassesA): a
    // warp covers 4 rows x 8 consecutive k (4 full sectors), and its transposed writes as[k][m]
    // hit banks 4k + m (mod 32, 4-float pad): 32 distinct. One source pointer per row, advanced
    // by kBK per tile, so a copy costs one LDGSTS with an immediate offset. Rows past M point at
    // row M-1 (a valid address) and copy 0 bytes: their slots are zero-filled.
    constexpr int kRowsA = C::kRowsA, kPassesA = C::kPassesA;
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
    constexpr int kPerRow = C::kPerRowB, kRowsB = C::kRowsB;
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
      for (int c = 0; c < C::kCopiesA; ++c) {
        const int r = c % kPassesA, k = a_k + 8 * (c / kPassesA);
        const bool ok = full || k < k_left;
        cp_async4(&as[k * kLdA + a_row + kRowsA * r], ok ? a_src[r] + 8 * (c / kPassesA) : p.a, ok ? a_bytes[r] : 0);
      }
#pragma unroll
      for (int c = 0; c < C::kCopiesB; ++c) {
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
        tile.fma_by_columns(frag[k % 2]);
      }
      read = read + 1 == kStages ? 0 : read + 1;
      write = write + 1 == kStages ? 0 : write + 1;
    }
    if (kt_begin == 0 && kt_end == tiles_k) {
      tile.store(p, m0 + wm, n0 + wn, vec);
    } else {
      finish_piece<kThreads>(tile, p, sk, index - sk.dp_tiles, tiles_k, first_piece, m0 + wm, n0 + wn, vec);
    }
    if (it < end) __syncthreads();  // the next piece's prologue refills stages this one still reads
  }
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

// Wave quantization: T tiles run on S = SMs x blocks-per-SM slots in waves, and a last wave of
// T mod S tiles takes a whole wave's time with the other SMs idle (4096^3: 512 tiles on 132 slots
// = 3 waves + 116 tiles, 12% of the last wave idle; 3000^3: 2 waves + 24 tiles). Stream-K evens
// out the last two waves: their S + T mod S tiles' k-tiles are shared by S blocks, so each SM runs
// (S + T mod S) / S tiles' worth, plus a round trip of the pieces of at most ~S split tiles
// through L2. Ranges are at least kMinSplitTiles k-tiles (small problems use fewer blocks); a last
// wave that leaves under 1/16 of the slots idle is not worth that round trip. The plan comes back
// without its workspace: pick_shape prices a plan per tile shape before one is launched.
StreamK plan_stream_k(int tiles, int tiles_k, int slots) {
  const int waves = tiles / slots, tail = tiles % slots;
  const StreamK data_parallel{tiles, 0, 0, nullptr, nullptr};
  if (tail == 0 || 16 * (slots - tail) < slots) return data_parallel;
  const int dp_tiles = std::max(waves - 1, 0) * slots, sk_tiles = tiles - dp_tiles;
  const int64_t sk_iters = int64_t(sk_tiles) * tiles_k;
  const int sk_blocks = int(std::min<int64_t>(slots, sk_iters / kMinSplitTiles));
  // With a full wave before them, the stream-K blocks must be one per slot (short K cannot give
  // them kMinSplitTiles each otherwise); alone, they must split tiles, or the tiles stay whole.
  if (waves > 0 ? sk_blocks < slots : sk_blocks <= sk_tiles) return data_parallel;
  return {dp_tiles, sk_blocks, sk_iters, nullptr, nullptr};
}

struct Plan {
  Shape shape;
  int tiles;
  StreamK sk;
  int64_t cost;  // the estimate below; INT64_MAX: more tiles than a grid holds
};

// The estimate pick_shape minimises: the FFMA work of the busiest scheduler, in warp k-tiles
// (64 x 64 x 16 each). Its block runs whole waves of whole tiles, then an even share of the
// stream-K k-tiles; its SM holds up to 8 warps on 4 schedulers. That is waves x tile area, with
// the last waves made fractional by stream-K; at full SMs it is the same for every shape
// whose tiles divide the output (4096^3: 993 k-tiles x 2 warps per scheduler, whichever shape):
// what differs is the padding of ragged edges, the k-tiles of a short wave, and how many of the
// 4 schedulers a sub-wave problem can occupy.
Plan plan(Shape shape, int M, int N, int tiles_k) {
  const int sms = rosetta::sm_count();
  const int warps = (shape.bm / ThreadTile::kWarpM) * (shape.bn / ThreadTile::kWarpN), per_sm = kWarpsPerSm / warps;
  const int slots = sms * per_sm;
  const int64_t tiles = rosetta::ceil_div(M, shape.bm) * rosetta::ceil_div(N, shape.bn);
  if (tiles > INT_MAX) return {shape, 0, {}, INT64_MAX};
  const StreamK sk = plan_stream_k(int(tiles), tiles_k, slots);
  const bool split = sk.sk_blocks > 0;
  const int64_t blocks = split ? sk.dp_tiles + sk.sk_blocks : tiles;
  const int64_t k_tiles = split ? int64_t(sk.dp_tiles / slots) * tiles_k + rosetta::ceil_div(sk.sk_iters, sk.sk_blocks)
                                : rosetta::ceil_div(tiles, slots) * tiles_k;
  const int64_t warps_on_sm = std::min<int64_t>(rosetta::ceil_div(blocks, sms), per_sm) * warps;
  return {shape, int(tiles), sk, k_tiles * rosetta::ceil_div(warps_on_sm, 4)};
}

// Tile choice (the one place): the lowest estimate, ties to the larger tile. A smaller tile pays
// more per FFMA (64 x 128: 21.3 flop per L2 byte against 42.7, 24 copies per 2048 FFMA against
// 12), which the estimate does not see, so its estimate is weighted 9/8 against 128 x 256's: a
// ragged edge or a short wave must cost 128 x 256 over 1/9 more before a smaller tile replaces
// the one measured. 300 x 8192 x 300: 6 tiles of 128 x 256 are 384 x 512 outputs (46% real), 24
// k-tiles per block; 15 tiles of 64 x 128 are 320 x 384 (73% real), 15 k-tiles per block: 30
// against 48. 3000^3 (804 against 822) and 4097 x 4095 x 4099 (2080 against 2176) stay.
Plan pick_shape(int M, int N, int tiles_k) {
  Plan best = plan(kShapes[0], M, N, tiles_k);
  int64_t best_weighted = best.cost == INT64_MAX ? INT64_MAX : 8 * best.cost;
  for (const Shape& shape : kShapes) {
    const Plan candidate = plan(shape, M, N, tiles_k);
    if (candidate.cost == INT64_MAX) continue;
    const int64_t weighted = (&shape == kShapes ? 8 : 9) * candidate.cost;
    if (weighted < best_weighted) best = candidate, best_weighted = weighted;
  }
  return best;
}

template <int kBM, int kBN>
void launch(const rosetta::MatmulArgs& args, const rosetta::MatmulProblem& p, const Plan& plan, cudaStream_t stream) {
  using C = Config<kBM, kBN>;
  StreamK sk = plan.sk;
  if (sk.sk_blocks > 0) {
    const int sk_tiles = plan.tiles - sk.dp_tiles;
    const int64_t ticket_floats = rosetta::ceil_div(sk_tiles, 4) * 4;  // partials stay 16-byte aligned
    float* ws = args.workspace.get<float>(ticket_floats + int64_t(2 * sk.sk_blocks) * kPartial4 * C::kThreads * 4);
    sk.tickets = reinterpret_cast<unsigned*>(ws);
    sk.partials = reinterpret_cast<float4*>(ws + ticket_floats);
    if (cudaMemsetAsync(sk.tickets, 0, sk_tiles * sizeof(unsigned), stream) != cudaSuccess) return;
  }
  const int blocks = sk.sk_blocks > 0 ? sk.dp_tiles + sk.sk_blocks : plan.tiles;
  const auto kernel = matmul_pipelined<kBM, kBN>;
  // Over 48 KB of dynamic shared memory needs an opt-in per kernel (per device: every call).
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes) != cudaSuccess) return;
  if (C::kBlocksPerSm > 1) {  // a shared-memory carveout that holds all kBlocksPerSm blocks' rings
    const int percent = int(rosetta::ceil_div(100 * C::kBlocksPerSm * (C::kSmemBytes + 1024), 228 * 1024));
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent) != cudaSuccess) return;
  }
  kernel<<<blocks, C::kThreads, C::kSmemBytes, stream>>>(p, sk);
}

}  // namespace

cudaError_t matmul_08_pipelined(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return rosetta::matmul_launch(args, stream, [&](rosetta::MatmulProblem p) {
    const int tiles_k = int(rosetta::ceil_div(p.K, kBK));
    const Plan plan = pick_shape(p.M, p.N, tiles_k);
    if (plan.cost == INT64_MAX) return;  // over 2^31 tiles of 128 x 256: out alone would be 256 TB
    if (!rosetta::vec4_ok(p.b, p.ldb)) {  // b's rows break 16-byte alignment: repack it first
      const int64_t ld4 = rosetta::ceil_div(p.N, 4) * 4;
      float* packed = args.workspace.get<float>(p.K * ld4);
      const dim3 grid(unsigned(rosetta::ceil_div(ld4 / 4, 256)), unsigned(std::min(p.K, 65535)));
      repack_rows<<<grid, 256, 0, stream>>>(p.b, p.ldb, packed, ld4, p.N, p.K);
      p.b = packed;
      p.ldb = ld4;
    }
    const Shape s = plan.shape;
    if (s.bn == 256) launch<128, 256>(args, p, plan, stream);
    else if (s.bm == 128) launch<128, 128>(args, p, plan, stream);
    else launch<64, 128>(args, p, plan, stream);
  });
}
