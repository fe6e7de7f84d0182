/*
Step 13 — persistent tiles, 2-CTA clusters sharing B by TMA multicast, TMA-store epilogue
Changed:  step 12's warp-specialized block, made persistent: the grid is as many 2-CTA clusters
          as fit on the chip, each walking output tiles in grouped order, with stage and
          barrier-phase counters running on across tiles. The two CTAs of a cluster compute
          vertically adjacent 128 x kBN tiles that share their B tile: each loads half of it and
          multicasts it to both (cp.async.bulk.tensor .multicast::cluster), and a stage is
          refilled only when the consumers of both CTAs have released it (remote mbarrier
          arrivals). The epilogue writes bf16/fp16 into 128-byte-swizzled shared memory and
          hands it to the copy engine (cp.async.bulk.tensor store, UTMASTG) one 64 x 64 box at a
          time through two buffers (box j is converted while box j - 1 is stored), while the
          producer is already filling the stages with the next tile. Staging two boxes instead
          of the whole tile frees 32 KB: enough for a 4th 48 KB stage at 128 x 256. The tile is
          128 x 256, 128 x 192 or 192 x 192 (three consumer warpgroups, each staging one box so
          that 4 stages fit), whichever makes waves of cluster pairs x tile area smallest, ties
          to the larger tile. 3000^3: 2 waves of 192 x 192 pairs = 3 waves of 128 x 192, with
          14% fewer bytes from L2 per flop; the other shapes keep 128 x 256.
Why:      step 12 paid, per 128 x 256 tile, a pipeline fill and an epilogue with the tensor
          cores idle, and every block read its B tile from L2 alone. Now the next tile's loads
          overlap this tile's epilogue; L2 -> SM traffic per k-tile and CTA drops from 48 KB to
          16 + 16 KB (A own, half of B): 128 * 256 / (128 + 128) = 128 flop/B. Stores leave
          as whole 128-byte rows. The 4th stage matters because a stage is refilled only when
          both CTAs of the pair released it, so either CTA's hiccup stalls the other: 3 stages
          of 128 x 256 measured 190 us at 4096^3 in development, 4 stages 183-185 us.
Still:    the consumer warpgroups do their epilogues together, so the tensor cores idle
          while they convert and store (ping-pong consumers overlap one's epilogue with the
          other's MMAs, but each must own a whole tile, 128 x 128 at 128 accumulators a thread:
          linear_gelu step 3 measured that 18% slower at 4096^3); the tile shape is picked per problem from three, without stream-K
          for the last partial wave. Rows whose byte pitch is not a multiple of 128 (K or N =
          3000: 6000 B) make most 128-byte box rows straddle two L2 lines. With 256-byte L2
          promotion and 3 stages of 192 x 192 the loads set the time there (development, bf16
          3000^3: 100 us, loads alone 97-98, cuBLAS 81); 128-byte promotion (hopper.cuh) took
          the loads alone to 81-84 us and the kernel to 94, and the 4th stage, worth nothing
          while the loads were the wall, to 84: see KERNEL_LOG.
Limits:   as step 11: each of A and B needs one unit stride and the copy engine's alignment
          (16-byte aligned base, the other stride a multiple of 8 elements); other inputs return
          cudaErrorInvalidValue (step 10 takes them). Outputs whose rows are not 16-byte
          multiples (N % 8 != 0) take masked register stores instead of TMA stores.
          M, N, K < 2^31.
Dtypes:   bfloat16, float16
Layout:   rows_or_cols
Max:      tma_unaligned <= 0
*/
#include "hopper.cuh"

namespace {

namespace sm90 = rosetta::sm90;

constexpr int kBK = 64, kCluster = 2;
constexpr int kProducerRegs = 40;
constexpr int kGroupM = 8;  // cluster rows (of 2 tiles) per group of the persistent order
static_assert(kBK * 2 == 128, "one k-tile row is exactly one 128-byte swizzle row");

// Shared memory for a kBM x kBN tile: up to 4 stages of A (kBM x 64) and B (kBN x 64), the
// output staging (swizzled 64 x 64 boxes, two per consumer written and stored in turn, or one
// for three consumers), barriers, slack for 1024-byte alignment. 128 x 256: 4 x 48 + 32 KB =
// 225 KB of 227; 128 x 192: 4 x 40 + 32 KB = 193 KB (a 5th stage would need 233); 192 x 192:
// 4 x 48 + 24 KB = 217 KB, a 4th stage bought with the second staging box of each consumer.
template <int kBM, int kBN>
struct Config {
  static constexpr int kConsumers = kBM / 64;  // one m64 wgmma row block per consumer warpgroup
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // 64K registers per SM: the producer gives back to 40, the consumers share the rest
  static constexpr int kConsumerRegs = kConsumers == 2 ? 232 : 152;
  static constexpr int kBytesA = kBM * kBK * 2, kBytesB = kBN * kBK * 2;
  static constexpr int kStageBytes = kBytesA + kBytesB;
  static constexpr int kBoxBytes = 64 * 64 * 2;  // one consumer's 64 rows x 64 columns of output
  static constexpr int kBoxBuffers = kConsumers == 2 ? 2 : 1;
  static constexpr int kOutBytes = kConsumers * kBoxBuffers * kBoxBytes;
  static constexpr int kStages = std::min(4, (227 * 1024 - kOutBytes - 1024 - 64) / kStageBytes);
  static constexpr int kSmemBytes = kStages * kStageBytes + kOutBytes + 2 * kStages * 8 + 1024;
  static_assert(kBM % 64 == 0 && kStages >= 3, "whole consumer row blocks, a pipeline of 3+ stages");
  static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "the register file");
  static_assert(kBN % 64 == 0 && (kBN / kCluster) % 8 == 0, "multicast halves of whole 8-row groups");
  static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one block");
};

template <typename T, int kBM, int kBN, bool kMnMajorA, bool kMnMajorB>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(Config<kBM, kBN>::kThreads, 1)
    matmul_persistent(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                      const __grid_constant__ CUtensorMap map_out, T* __restrict__ out, int M, int N, int K,
                      bool tma_store, bool pairs) {
  using C = Config<kBM, kBN>;
  constexpr int kConsumers = C::kConsumers;
  using TileA = sm90::OperandTile<kBM, kMnMajorA>;
  using TileB = sm90::OperandTile<kBN, kMnMajorB>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  unsigned char* const staging = smem + C::kStages * C::kStageBytes;
  uint64_t* const full = reinterpret_cast<uint64_t*>(staging + C::kOutBytes);
  uint64_t* const empty = full + C::kStages;
  auto tile_a = [&](int s) { return smem + s * C::kStageBytes; };
  auto tile_b = [&](int s) { return smem + s * C::kStageBytes + C::kBytesA; };

  const int rank = int(sm90::cluster_cta_rank());  // 0: upper tile of the pair, 1: lower
  const int cluster = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;
  const int pair_rows = ((M + kBM - 1) / kBM + kCluster - 1) / kCluster, tiles_n = (N + kBN - 1) / kBN;
  const int pairs_total = pair_rows * tiles_n;
  const int k_tiles = (K + kBK - 1) / kBK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      sm90::mbarrier_init(&full[s], 1);                      // own expect_tx, then A + both B halves
      sm90::mbarrier_init(&empty[s], kConsumers * kCluster);  // every consumer of the cluster
    }
    sm90::fence_barrier_init();
  }
  sm90::cluster_sync();  // the peer multicasts into our barriers: both initialised first

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    sm90::set_max_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      int it = 0;  // k-tiles issued by this CTA: stage it % kStages, fill it / kStages
      for (int t = cluster; t < pairs_total; t += clusters) {
        int pr, tn;
        sm90::grouped_tile(t, pair_rows, tiles_n, kGroupM, pr, tn);
        const int m0 = (kCluster * pr + rank) * kBM, n0 = tn * kBN;  // the lower tile may lie past M: zero-filled
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = it % C::kStages;
          sm90::mbarrier_wait(&empty[s], (it / C::kStages + 1) % 2);  // both CTAs released fill f - 1
          sm90::mbarrier_arrive_expect_tx(&full[s], C::kStageBytes);
          TileA::load(&map_a, tile_a(s), &full[s], m0, kt * kBK);
          TileB::load(&map_b, tile_b(s), &full[s], n0, kt * kBK, rank, kCluster, (1u << kCluster) - 1);
        }
      }
    }
  } else {
    sm90::set_max_registers<C::kConsumerRegs>();
    const int row0 = 64 * (wg - 1);
    const bool leader = threadIdx.x % 128 == 0;  // issues the TMA stores
    unsigned char* const my_staging = staging + (wg - 1) * C::kBoxBuffers * C::kBoxBytes;
    int boxes = 0;  // output boxes this warpgroup has stored: box i is staged in buffer i % kBoxBuffers
    // A stage is free once every consumer warpgroup of both CTAs has arrived (empty's count is
    // 2 x kConsumers): lane c of the warpgroup signals CTA c, so the arrivals go out in parallel.
    auto release = [&](int s) {
      if (threadIdx.x % 128 < kCluster) sm90::mbarrier_arrive_cluster(&empty[s], threadIdx.x % 128);
    };
    int it = 0;
    for (int t = cluster; t < pairs_total; t += clusters) {
      int pr, tn;
      sm90::grouped_tile(t, pair_rows, tiles_n, kGroupM, pr, tn);
      const int m0 = (kCluster * pr + rank) * kBM + row0, n0 = tn * kBN;
      float d[kBN / 2] = {};
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % C::kStages;
        sm90::mbarrier_wait(&full[s], (it / C::kStages) % 2);
        sm90::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          sm90::wgmma<T, kBN, kMnMajorA, kMnMajorB>(d, TileA::descriptor(tile_a(s), row0, kk),
                                                    TileB::descriptor(tile_b(s), 0, kk));
        sm90::wgmma_commit();
        sm90::wgmma_wait<1>();  // the previous k-tile's group is done: release its stage
        if (kt > 0) release((it - 1) % C::kStages);
      }
      sm90::wgmma_wait<0>();
      sm90::fence_accumulators(d);
      release((it - 1) % C::kStages);  // the tile's last stage; the producer is already ahead

      if (!tma_store) {
        sm90::store_accumulators<T, kBN>(d, out, M, N, m0, n0, pairs);
        continue;
      }
      // Box j (columns 64j .. 64j + 63 of the warpgroup's 64 rows): row r at r * 128, 16-byte chunk
      // XOR r % 8: the layout CU_TENSOR_MAP_SWIZZLE_128B reads. A warp's 4-byte stores (8 rows x
      // 4 column pairs of one chunk) then hit 8 different chunks of 8 lines: all 32 banks, no
      // conflict. With two buffers box j is written while box j - 1 is stored; with one, in turn.
      const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
#pragma unroll
      for (int j = 0; j < kBN / 64; ++j, ++boxes) {
        unsigned char* const box = my_staging + (boxes % C::kBoxBuffers) * C::kBoxBytes;
        if (leader) sm90::tma_store_wait_read<C::kBoxBuffers - 1>();  // the last store from this buffer has read it
        sm90::named_barrier(wg, 128);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = 16 * warp + lane / 4 + 8 * h, i = 4 * (8 * j + c) + 2 * h;
            const T v[2] = {rosetta::from_float<T>(d[i]), rosetta::from_float<T>(d[i + 1])};
            unsigned char* p = box + r * 128 + (c ^ (r % 8)) * 16 + (lane % 4) * 4;
            *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<const uint32_t*>(v);
          }
        }
        sm90::fence_proxy_async_shared();
        sm90::named_barrier(wg, 128);
        if (leader) {
          sm90::tma_store(&map_out, box, n0 + 64 * j, m0);
          sm90::tma_store_commit();
        }
      }
    }
    if (leader) sm90::tma_store_wait();
  }
  // No CTA leaves while its peer may still multicast into it or arrive on its barriers.
  sm90::cluster_sync();
}

template <typename T, int kBM, int kBN, bool kMnA, bool kMnB>
void launch(const sm90::TmaOperand& a, const sm90::TmaOperand& b, const CUtensorMap& map_out, T* out, int M,
            int N, int K, bool tma_store, bool pairs, int pairs_total, cudaStream_t stream) {
  using C = Config<kBM, kBN>;
  const auto kernel = matmul_persistent<T, kBM, kBN, kMnA, kMnB>;
  static const int max_clusters = [&] {  // clusters of 2 co-resident at 1 block per SM
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kCluster * rosetta::sm_count());
    config.blockDim = dim3(C::kThreads);
    config.dynamicSmemBytes = C::kSmemBytes;
    int n = 0;
    cudaOccupancyMaxActiveClusters(&n, kernel, &config);
    return std::max(n, 1);
  }();
  const int clusters = std::min(pairs_total, max_clusters);
  kernel<<<kCluster * clusters, C::kThreads, C::kSmemBytes, stream>>>(a.map, b.map, map_out, out, M, N, K,
                                                                      tma_store, pairs);
}

}  // namespace

cudaError_t matmul_13_persistent_clusters(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return sm90::tc_matmul_launch(args, stream, [&](auto tag, int M, int N, int K) {
    using T = decltype(tag);
    // Tile shape: the cluster-pair count in waves of ~half the SMs, times the tile's area; ties go
    // to the larger tile, which reads fewer bytes per flop (3000^3: 2 waves of 192 x 192 pairs =
    // 3 waves of 128 x 192, and the larger tile moves 14% fewer bytes from L2).
    const int slots = rosetta::sm_count() / kCluster;
    struct Shape { int bm, bn; };
    const Shape shapes[] = {{192, 192}, {128, 256}, {128, 192}};
    Shape pick{};
    int64_t best = INT64_MAX, pairs_total = 0;
    for (const Shape& t : shapes) {
      const int64_t pairs = rosetta::ceil_div(rosetta::ceil_div(M, t.bm), kCluster) * rosetta::ceil_div(N, t.bn);
      const int64_t cost = rosetta::ceil_div(pairs, slots) * t.bm * t.bn;
      if (cost < best) best = cost, pick = t, pairs_total = pairs;
    }
    if (pairs_total > INT_MAX) return cudaErrorInvalidValue;
    const int bm = pick.bm, bn = pick.bn;

    sm90::TmaOperand a, b;
    if (!sm90::make_tma_operand<T>(a, args.a, false, bm) || !sm90::make_tma_operand<T>(b, args.b, true, bn / kCluster))
      return cudaErrorInvalidValue;
    CUtensorMap map_out{};  // out is M x N contiguous: TMA stores need N % 8 == 0 and a 16-byte aligned base
    const bool tma_store = sm90::encode_map<T>(map_out, args.out.data, N, M, N, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    const bool pairs = N % 2 == 0 && reinterpret_cast<uintptr_t>(args.out.data) % 4 == 0;
    sm90::with_majors(a.mn_major, b.mn_major, [&](auto mn_a, auto mn_b) {
      const auto go = [&](auto kernel_launch) {
        kernel_launch(a, b, map_out, args.out.ptr<T>(), M, N, K, tma_store, pairs, int(pairs_total), stream);
      };
      if (bm == 192) go(launch<T, 192, 192, mn_a, mn_b>);
      else if (bn == 256) go(launch<T, 128, 256, mn_a, mn_b>);
      else go(launch<T, 128, 192, mn_a, mn_b>);
    });
    return cudaSuccess;
  });
}
