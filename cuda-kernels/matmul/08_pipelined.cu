/*
Step 8 — cp.async multi-stage pipeline, stream-K for the last waves, FFMAs in reuse order
Changed:  global -> shared copies go through cp.async (sm_80+) into a ring of kStages shared
          buffers: while tile k is computed, tiles k+1 .. k+kStages-1 are in flight, and one
          barrier per tile replaces two. a is still transposed on the way in (4-byte copies,
          each to its place in as[k][m]); b moves in 16-byte copies. Out-of-range elements are
          zero-filled by cp.async's src-size operand, with no branch around the copy. With no
          staging registers, the block tile grows to 128 x 256 (8 warps, 1 block per SM), and the
          fragments of k-step k+1 are loaded from shared memory before the FFMAs of step k.
          Three later revisions, each measured on its own:
          - stream-K (plan_stream_k): the k-tiles of the last two waves of tiles are shared
            evenly by 132 blocks, whose ranges may start and end inside a tile; the block that
            finishes a tile's last piece adds the pieces in a fixed order (deterministic);
          - a b whose rows are not 16-byte aligned (N % 4 != 0, or an offset view) is repacked
            into a padded copy first, rather than copied 4 bytes at a time;
          - the 128 FFMAs of a k-step run column by column (ThreadTile::fma_by_columns).
Why:      in step 7 a block's global latency (~1 us per tile from L2/DRAM) sat between its
          barriers, hidden only by the other resident block. With the copies kStages - 1 tiles
          ahead, the block's warps go from one tile's FFMAs to the next with one barrier
          between. Global intensity: (128 + 256) x 16 x 4 B per 128 x 256 x 16 x 2 flops =
          42.7 flop/B (step 7: 32); shared 16 flop/B per warp and 21 FFMA per LDS.128 as in
          step 7. Copies cost one LDGSTS each (per-row source pointers, immediate offsets):
          ncu counted 91.8% of issued instructions as FFMA at 4096^3 (step 7: 89.2%).
          Wave quantization: 3000^3 is 288 tiles = 2 waves + 24 on 132 SMs, and a third of the
          time ran 24 SMs (0.74x cuBLAS); 4096^3 is 3 waves + 116, 16 SMs idle in the last
          wave (4224 x 4096 x 4096, exactly 4 waves, ran 2-3% faster per flop). A first version
          split only the tail tiles (3000^3: 1.67 -> 1.27 ms), which cannot help 4096^3. Stream-K
          over the last two waves gives every SM (132 + tail) / 132 tiles of work: predicted
          +3.1% at 4096^3, measured +1.5-2.7% (3.07-3.11 -> 3.03-3.05 ms); 3000^3 and
          4097 x 4095 x 4099 as with the tail split. b with N = 4099 took 4x the copy
          instructions, ~6% per wave; the repack (one read and one write of b) took
          4097 x 4095 x 4099 to 0.87x cuBLAS.
          FFMA order: cuBLAS's SGEMM here (sm80_xmma_gemm_..._tilesize256x128x8_warpsize4x2x1)
          runs the same 128 x 256 tile of 8 64 x 64 warps, 1 block per SM, with the same
          instruction count (2.43 G at 4096^3), but issues on 91% of scheduler cycles to our
          77%; ncu's stalls per instruction: dispatch 0.22 vs 0.10 and wait 0.11 vs 0.01,
          register-file bank conflicts. Counted in the SASS (4 banks, reg % 4; an operand that
          the previous FFMA flagged .reuse is not read), row order costs 359 extra bank reads
          per k-tile; column order with serpentine rows 163: 4096^3 0.873x -> 0.900x cuBLAS.
          Starting at column 0 instead gave ptxas a 212-register allocation costing 716 and
          0.827x: the allocation, not the arithmetic, moves the needle.
Still:    ~70% of FFMA peak where cuBLAS's SASS reaches ~79%: register allocation is ptxas's,
          and CUDA C can only steer it by the order of the FFMAs. The stream-K pieces pay a round
          trip through L2 and a pipeline fill each. FP32 FFMA tops out at ~60-67 TFLOP/s however
          fed: the tensor cores are the next rung.
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
// 128 x 256 block tile, 8 warps of 64 x 64: with no staging registers (cp.async), 1 block of 256
// threads per SM may use up to 255 registers (ptxas: 247, no spills), and the bigger tile
// raises global intensity to 42.7 flop/B. Measured on the H100 (4096^3, with fragments double-
// buffered): 44.4 TFLOP/s vs 42.8 for step 7's 128 x 128 x 2 blocks per SM with the same pipeline.
constexpr int kBM = 128, kBN = 256, kBK = 16;
constexpr int kStages = 3;  // 3 x 24.8 KB of shared memory (4 stages measured no faster)
constexpr int kWarpsM = kBM / ThreadTile::kWarpM, kWarpsN = kBN / ThreadTile::kWarpN;
constexpr int kThreads = 32 * kWarpsM * kWarpsN;  // 256
constexpr int kBlocksPerSm = 1;                   // registers: 255 per thread allowed
constexpr int kGroupM = 8;                        // tile rows per L2 group
constexpr int kMinSplitTiles = 4;  // a stream-K block's range: at least 4 k-tiles (64 k)
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
  float4* partials;   // [stream-K block][its first or last piece][kPartial4][kThreads]

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

__global__ void __launch_bounds__(kThreads, kBlocksPerSm) matmul_pipelined(rosetta::MatmulProblem p, StreamK sk) {
  extern __shared__ float4 smem4[];  // float4: 16-byte aligned
  float* const smem = reinterpret_cast<float*>(smem4);
  const int t = threadIdx.x, warp = t / 32;
  const int tiles_k = (p.K + kBK - 1) / kBK;
  const int wm = (warp / kWarpsN) * ThreadTile::kWarpM, wn = (warp % kWarpsN) * ThreadTile::kWarpN;
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
        tile.fma_by_columns(frag[k % 2]);
      }
      read = read + 1 == kStages ? 0 : read + 1;
      write = write + 1 == kStages ? 0 : write + 1;
    }
    if (kt_begin == 0 && kt_end == tiles_k) {
      tile.store(p, m0 + wm, n0 + wn, vec);
    } else {
      finish_piece(tile, p, sk, index - sk.dp_tiles, tiles_k, first_piece, m0 + wm, n0 + wn, vec);
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

// Wave quantization: T tiles run on S = SMs x kBlocksPerSm slots in waves, and a last wave of
// T mod S tiles takes a whole wave's time with the other SMs idle (4096^3: 512 tiles on 132 slots
// = 3 waves + 116 tiles, 12% of the last wave idle; 3000^3: 2 waves + 24 tiles). Stream-K evens
// out the last two waves: their S + T mod S tiles' k-tiles are shared by S blocks, so each SM runs
// (S + T mod S) / S tiles' worth, plus a round trip of the pieces of at most ~S split tiles
// through L2. Ranges are at least kMinSplitTiles k-tiles (small problems use fewer blocks); a last
// wave that leaves under 1/16 of the slots idle is not worth that round trip.
StreamK plan_stream_k(const rosetta::MatmulArgs& args, int tiles, int tiles_k) {
  const int slots = rosetta::sm_count() * kBlocksPerSm;
  const int waves = tiles / slots, tail = tiles % slots;
  const StreamK data_parallel{tiles, 0, 0, nullptr, nullptr};
  if (tail == 0 || 16 * (slots - tail) < slots) return data_parallel;
  const int dp_tiles = std::max(waves - 1, 0) * slots, sk_tiles = tiles - dp_tiles;
  const int64_t sk_iters = int64_t(sk_tiles) * tiles_k;
  const int sk_blocks = int(std::min<int64_t>(slots, sk_iters / kMinSplitTiles));
  // With a full wave before them, the stream-K blocks must be one per slot (short K cannot give
  // them kMinSplitTiles each otherwise); alone, they must split tiles, or the tiles stay whole.
  if (waves > 0 ? sk_blocks < slots : sk_blocks <= sk_tiles) return data_parallel;
  const int64_t ticket_floats = rosetta::ceil_div(sk_tiles, 4) * 4;  // partials stay 16-byte aligned
  float* ws = args.workspace.get<float>(ticket_floats + int64_t(2 * sk_blocks) * kPartial4 * kThreads * 4);
  return {dp_tiles, sk_blocks, sk_iters, reinterpret_cast<unsigned*>(ws),
          reinterpret_cast<float4*>(ws + ticket_floats)};
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
    const StreamK sk = plan_stream_k(args, tiles, int(rosetta::ceil_div(p.K, kBK)));
    const size_t ticket_bytes = (tiles - sk.dp_tiles) * sizeof(unsigned);
    if (sk.sk_blocks > 0 && cudaMemsetAsync(sk.tickets, 0, ticket_bytes, stream) != cudaSuccess) return;
    const int blocks = sk.sk_blocks > 0 ? sk.dp_tiles + sk.sk_blocks : tiles;
    // Over 48 KB of dynamic shared memory needs an opt-in per kernel (per device: every call).
    if (cudaFuncSetAttribute(matmul_pipelined, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) != cudaSuccess) return;
    matmul_pipelined<<<blocks, kThreads, kSmemBytes, stream>>>(p, sk);
  });
}
