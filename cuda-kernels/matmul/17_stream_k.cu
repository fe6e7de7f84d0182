/*
Step 17 — stream-K: every SM an equal share of the k-iterations, shared tiles added in the kernel
Changed:  step 14's pipeline (a TMA producer warp, one or two wgmma consumer warpgroups, 64 x 128 or
          128 x 128 tiles, 9 or 7 stages) made persistent over a line of work: tiles in grouped
          order, each tile its k-tiles. Under one wave of tiles all of them are one line of
          tiles x k_tiles iterations, and block b of G walks [b * total / G, (b + 1) * total / G),
          crossing tile boundaries as they come (G: one block per SM, fewer where a block would
          walk under 4 k-tiles or a tile would be shared by more than 8). From one wave up, whole
          waves run data-parallel (block b takes tiles b, b + G, ...) and only the last full wave
          plus the partial one are streamed. The producer runs ahead into the next segment while
          the consumers finish this one. A tile one block walks whole is stored from registers; a
          tile shared by blocks c0 .. c1 has each block write its fp32 accumulators to its own slot
          (in register order, coalesced) and take a ticket on the tile's counter (one thread,
          acquire-release, after the consumers' barrier); the block that draws the last ticket
          adds the slots in the order c0 .. c1 and stores the sum. Whichever block comes last,
          the additions happen in the same order: the same bits on every run.
Why:      step 14 cuts every tile into the same S slices and adds them in a second kernel: the
          launch (~2 us of an 8-20 us call at small M), partials for every tile, and a wave that
          is only even when SMs / tiles is. 128 x 768 x 3072 is 24 tiles of 128 x 128 x 12
          k-tiles = 288 iterations: step 14 runs 3 slices (72 blocks, 4.7 MB of partials, a second
          launch); here 72 blocks of 4 iterations, the same reads, and the fix-up inside. 256 x
          3584 x 18944 has 296 tiles: over two waves of step 14's limit, and step 13's 148 tiles
          of 128 x 256 leave the second wave 12% full (69 us against cuBLAS's 56); here 132 blocks
          of 2.24 tiles' work each, a few percent above one wave's work.
Still:    measured slower than steps 13-14 on every shape of the suite (H100; KERNEL_LOG has the
          figures): the prediction above did not hold. Where tiles are shared, the last block adds
          their slots alone, one L2 round trip per slot, after its own work: a serial tail on one
          SM where step 14's second kernel spreads the same adds over all of them (128 x 768 x 3072:
          3 slots of 64 KB a tile). At M = 1 the slots are a row each and the kernel is still ~7 us
          behind step 14's on the same k-tiles: not explained without ncu's stall reasons. Where
          the output fills the machine, 128 x 128 tiles read twice the L2 bytes per flop of step
          13's 128 x 256 pairs with multicast: ~0.65x of it at 4096^3, the data-parallel part
          included. The tickets are zeroed by a memset before every launch (a graph node of its own).
Limits:   A and B need one unit stride each (row- or column-major; the dispatcher copies others);
          operands the copy engine cannot read as they are (a leading stride that is not a
          multiple of 8 elements, a start off 16 bytes) are first copied into the workspace, as in
          step 14. Declared for step 14's range, at most two waves of 128 x 128 output tiles
          (`output_tiles <= 264`), so that without a measured table step=None never hands it a
          large problem; the kernel itself takes any size (the bench measured it at 4096^3 before
          the bound). M, N, K < 2^31.
Dtypes:   bfloat16, float16
Layout:   rows_or_cols
Max:      output_tiles <= 264
*/
#include "split_k.cuh"

namespace {

namespace sm90 = rosetta::sm90;
using rosetta::split_k::Config;
using rosetta::split_k::kBK;
using rosetta::split_k::kBN;

constexpr int kGroupM = 8;     // tile order for L2 reuse: consecutive iterations stay near in A and B
constexpr int kMinIters = 4;   // k-tiles a block walks at least (unless a tile has fewer)
constexpr int kMaxShare = 8;   // blocks sharing one tile at most
constexpr int kBarrierId = 1;  // the consumers' named barrier (0 is __syncthreads)

// The work: tiles x k_tiles iterations (it = tile * k_tiles + k). The first sk_tiles tiles (in
// grouped order) are one line of sk_tiles x k_tiles iterations shared evenly by the blocks, tile
// boundaries or not (stream-K); the rest are whole tiles, block b taking tiles sk_tiles + b,
// sk_tiles + b + blocks, ... (data-parallel, as step 13's persistent loop).
struct Schedule {
  int64_t sk_total;  // sk_tiles x k_tiles
  int tiles, sk_tiles, blocks, k_tiles;
  __device__ int64_t begin(int block) const { return sk_total * block / blocks; }
  // The block whose stream-K range holds iteration it: the largest b with begin(b) <= it.
  __device__ int block_of(int64_t it) const { return int(((it + 1) * blocks + sk_total - 1) / sk_total) - 1; }
  // A shared tile's slot of block b: 2b when the tile is where b starts, 2b + 1 when it is where b ends.
  __device__ int slot(int block, int tile) const { return 2 * block + (begin(block) / k_tiles == tile ? 0 : 1); }
};

// Where this block's walk leaves `tile`: its end, or the tile's last k-tile.
__device__ __forceinline__ int segment_end(int64_t end, int tile, int k_tiles) {
  const int64_t left = end - int64_t(tile) * k_tiles;
  return left < k_tiles ? int(left) : k_tiles;
}

// The tile's ticket counter + 1, returning the count before: a release of this block's slot
// (ordered before it by the consumers' barrier) and, for the last block, an acquire of the others'.
__device__ __forceinline__ unsigned take_ticket(unsigned* ticket) {
  unsigned before;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(before) : "l"(ticket) : "memory");
  return before;
}

// One block's segments in order, (tile, k-tiles [k0, k1)): its stream-K range first (where
// shared tiles are, so their fix-ups overlap the whole tiles that follow), then its whole tiles.
// The producer and the consumers each walk their own copy.
struct Walk {
  Schedule work;
  int64_t it, end;
  int next_whole;
  __device__ Walk(const Schedule& w, int block)
      : work(w), it(w.begin(block)), end(w.begin(block + 1)), next_whole(w.sk_tiles + block) {}
  __device__ bool next(int& tile, int& k0, int& k1) {
    if (it < end) {
      tile = int(it / work.k_tiles), k0 = int(it - int64_t(tile) * work.k_tiles);
      k1 = segment_end(end, tile, work.k_tiles);
      it = int64_t(tile) * work.k_tiles + k1;
      return true;
    }
    if (next_whole >= work.tiles) return false;
    tile = next_whole, k0 = 0, k1 = work.k_tiles;
    next_whole += work.blocks;
    return true;
  }
};

// One warpgroup's 64 x 128 accumulators as float pairs in register order: pair p of consumer
// thread t at slot[p * threads + t] (a warp's stores are 256 contiguous bytes). Pairs of rows past
// M are neither written nor read: at M = 1 a slot is 4 of its 64 rows' worth of traffic.
__device__ __forceinline__ bool pair_row_valid(int p, int M, int m0) {
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  return m0 + 16 * warp + lane / 4 + 8 * (p % 2) < M;  // d[2p], d[2p + 1]: row half h = p % 2
}

template <int kConsumerThreads>
__device__ __forceinline__ void store_slot(const float (&d)[kBN / 2], float2* slot, int M, int m0) {
#pragma unroll
  for (int p = 0; p < kBN / 4; ++p)
    if (pair_row_valid(p, M, m0))
      __stcg(slot + p * kConsumerThreads + threadIdx.x, make_float2(d[2 * p], d[2 * p + 1]));
}

template <int kConsumerThreads>
__device__ __forceinline__ void add_slot(float (&sum)[kBN / 2], const float2* slot, int M, int m0) {
#pragma unroll
  for (int p = 0; p < kBN / 4; ++p) {
    if (!pair_row_valid(p, M, m0)) continue;
    const float2 v = __ldcg(slot + p * kConsumerThreads + threadIdx.x);  // L2: never a stale L1 line
    sum[2 * p] += v.x, sum[2 * p + 1] += v.y;
  }
}

template <typename T, int kConsumers, bool kMnMajorA, bool kMnMajorB>
__global__ void __launch_bounds__(Config<kConsumers>::kThreads, 1)
    matmul_stream_k(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                    T* __restrict__ out, float2* __restrict__ slots, unsigned* __restrict__ tickets, int M, int N,
                    int K, Schedule work, bool pairs) {
  using C = Config<kConsumers>;
  using TileA = sm90::OperandTile<C::kBM, kMnMajorA>;
  using TileB = sm90::OperandTile<kBN, kMnMajorB>;
  constexpr int kConsumerThreads = 128 * kConsumers;
  constexpr int kSlotPairs = C::kBM * kBN / 2;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + C::kStages * C::kStageBytes);
  uint64_t* const empty = full + C::kStages;
  auto tile_a = [&](int s) { return smem + s * C::kStageBytes; };
  auto tile_b = [&](int s) { return smem + s * C::kStageBytes + C::kBytesA; };
  __shared__ bool last;  // this block drew a shared tile's last ticket

  const int tiles_m = (M + C::kBM - 1) / C::kBM, tiles_n = (N + kBN - 1) / kBN;
  const int me = blockIdx.x, k_tiles = work.k_tiles;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      sm90::mbarrier_init(&full[s], 1);
      sm90::mbarrier_init(&empty[s], kConsumers);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  // Both roles walk the same segments: (tile, k-tiles [k0, k1)) for each tile the range touches.
  // i counts every k-tile this block loads, across segments, so the stages' phases run on.
  const int wg = threadIdx.x / 128;
  if (wg == kConsumers) {
    if (threadIdx.x % 32 == 0) {
      int i = 0, tile, k0, k1;
      for (Walk walk(work, me); walk.next(tile, k0, k1);) {
        int tm, tn;
        rosetta::tile_coords<kGroupM>(tile, tiles_m, tiles_n, tm, tn);
        for (int k = k0; k < k1; ++k, ++i) {
          const int s = i % C::kStages;
          sm90::mbarrier_wait(&empty[s], (i / C::kStages + 1) % 2);
          sm90::mbarrier_arrive_expect_tx(&full[s], C::kStageBytes);
          TileA::load(&map_a, tile_a(s), &full[s], tm * C::kBM, k * kBK);
          TileB::load(&map_b, tile_b(s), &full[s], tn * kBN, k * kBK);
        }
      }
    }
    return;
  }

  const int row0 = 64 * wg;
  int i = 0, tile, k0, k1;
  for (Walk walk(work, me); walk.next(tile, k0, k1);) {
    int tm, tn;
    rosetta::tile_coords<kGroupM>(tile, tiles_m, tiles_n, tm, tn);
    const int m0 = tm * C::kBM + row0, n0 = tn * kBN;

    float d[kBN / 2] = {};
    for (int k = k0; k < k1; ++k, ++i) {
      const int s = i % C::kStages;
      sm90::mbarrier_wait(&full[s], (i / C::kStages) % 2);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        sm90::wgmma<T, kBN, kMnMajorA, kMnMajorB>(d, TileA::descriptor(tile_a(s), row0, kk),
                                                  TileB::descriptor(tile_b(s), 0, kk));
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();
      if (k > k0 && threadIdx.x % 128 == 0) sm90::mbarrier_arrive(&empty[(i - 1) % C::kStages]);
    }
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(d);
    if (threadIdx.x % 128 == 0) sm90::mbarrier_arrive(&empty[(i - 1) % C::kStages]);  // the segment's last stage

    if (k0 == 0 && k1 == k_tiles) {  // the whole tile was ours
      sm90::store_accumulators<T, kBN>(d, out, M, N, m0, n0, pairs);
      continue;
    }
    // A shared tile: publish our part, then the last of its blocks to arrive adds them all.
    const int c0 = work.block_of(int64_t(tile) * k_tiles), c1 = work.block_of(int64_t(tile + 1) * k_tiles - 1);
    store_slot<kConsumerThreads>(d, slots + int64_t(work.slot(me, tile)) * kSlotPairs, M, m0);
    // One thread takes the ticket for all: the barrier orders every consumer's slot stores before
    // its release, and its acquire (when last) before everyone's slot loads after the second
    // barrier. A __threadfence in every thread instead (MEMBAR.SC.GPU) costs each of them a wait.
    sm90::named_barrier(kBarrierId, kConsumerThreads);
    if (threadIdx.x == 0) last = take_ticket(&tickets[tile]) == unsigned(c1 - c0);
    sm90::named_barrier(kBarrierId, kConsumerThreads);
    if (!last) continue;
    // Our own part too comes back from L2 rather than from registers: d is dead after store_slot,
    // which keeps the two-warpgroup kernel under its 168 registers a thread (no spills).
#pragma unroll
    for (int j = 0; j < kBN / 2; ++j) d[j] = 0.f;
    for (int c = c0; c <= c1; ++c) add_slot<kConsumerThreads>(d, slots + int64_t(work.slot(c, tile)) * kSlotPairs, M, m0);
    sm90::store_accumulators<T, kBN>(d, out, M, N, m0, n0, pairs);
  }
}

// Blocks and the stream-K share. Under one wave of tiles, all of them are streamed, over one block
// per SM or fewer: a block walks >= kMinIters k-tiles (or one whole tile), and no tile is shared
// by more than kMaxShare blocks (its fix-up reads that many slots on one SM). From one wave up,
// whole waves run data-parallel and the last wave plus the partial one are streamed (each block
// then walks at least one tile's worth: a shared tile has 2-3 blocks); a whole number of waves is
// all data-parallel.
Schedule plan(int64_t tiles, int64_t k_tiles, int64_t resident) {
  Schedule s{};
  s.tiles = int(tiles), s.k_tiles = int(k_tiles);
  if (tiles < resident) {
    s.sk_tiles = int(tiles);
    const int64_t most = std::min({resident, tiles * k_tiles / std::min<int64_t>(kMinIters, k_tiles), tiles * kMaxShare});
    s.blocks = int(std::max<int64_t>(1, most));
  } else {
    s.sk_tiles = tiles % resident == 0 ? 0 : int(tiles % resident + resident);
    s.blocks = int(resident);
  }
  s.sk_total = int64_t(s.sk_tiles) * k_tiles;
  return s;
}

template <typename T, int kConsumers, bool kMnA, bool kMnB>
cudaError_t launch(const sm90::TmaOperand& a, const sm90::TmaOperand& b, const rosetta::MatmulArgs& args, int M,
                   int N, int K, cudaStream_t stream) {
  using C = Config<kConsumers>;
  const auto kernel = matmul_stream_k<T, kConsumers, kMnA, kMnB>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  static const int per_sm = [&] {
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, C::kThreads, C::kSmemBytes);
    return std::max(n, 1);
  }();
  const int64_t tiles = rosetta::ceil_div(M, C::kBM) * rosetta::ceil_div(N, kBN);
  const int64_t k_tiles = rosetta::ceil_div(K, kBK);
  if (tiles > INT_MAX || tiles * k_tiles > (INT64_MAX >> 12)) return cudaErrorInvalidValue;  // total * blocks fits
  const Schedule work = plan(tiles, k_tiles, int64_t(per_sm) * rosetta::sm_count());
  const int blocks = work.blocks;
  bool shared = false;  // does any stream-K boundary fall inside a tile?
  for (int64_t b = 1; b < blocks && !shared; ++b) shared = work.sk_total * b / blocks % k_tiles != 0;
  float2* slots = nullptr;
  unsigned* tickets = nullptr;
  if (shared) {
    slots = args.workspace.get<float2>(2 * int64_t(blocks) * C::kBM * kBN / 2);
    tickets = args.workspace.get<unsigned>(work.sk_tiles);
    cudaMemsetAsync(tickets, 0, work.sk_tiles * sizeof(unsigned), stream);
  }
  T* const out = args.out.ptr<T>();
  const bool pairs = N % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  kernel<<<blocks, C::kThreads, C::kSmemBytes, stream>>>(a.map, b.map, out, slots, tickets, M, N, K, work, pairs);
  return cudaSuccess;  // launch errors: the caller's cudaGetLastError
}

}  // namespace

cudaError_t matmul_17_stream_k(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return sm90::tc_matmul_launch(args, stream, [&](auto tag, int M, int N, int K) {
    using T = decltype(tag);
    const int consumers = M <= 64 ? 1 : 2;  // as step 14: no 64 rows of zeros at small M
    sm90::TmaOperand a, b;
    if (!rosetta::split_k::tma_operands<T>(a, b, args, 64 * consumers, stream)) return cudaErrorInvalidValue;
    cudaError_t status = cudaSuccess;
    sm90::with_majors(a.mn_major, b.mn_major, [&](auto mn_a, auto mn_b) {
      status = consumers == 1 ? launch<T, 1, mn_a, mn_b>(a, b, args, M, N, K, stream)
                              : launch<T, 2, mn_a, mn_b>(a, b, args, M, N, K, stream);
    });
    return status;
  });
}
