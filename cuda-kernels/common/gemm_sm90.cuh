// matmul step 13's persistent, cluster-paired, warp-specialized wgmma GEMM (the step's own file
// keeps the kernel, where its story is read: 2-CTA clusters multicasting B, a producer warpgroup
// feeding 4 TMA stages, 2 or 3 consumer warpgroups, a TMA-store epilogue through swizzled staging
// boxes), here with one change: an epilogue policy, for linear_gelu's steps, which fuse their
// math into it. run<T>(..., Identity{}) compiles to step 13's SASS (checked when this was made).
//   Config, gemm_persistent, launch, run   the kernel, its launch, step 13's tile-shape pick
//   Identity, TileInfo                      the epilogue policy: what a consumer warpgroup does
//                                           to its fp32 accumulators before they are stored
#pragma once

#include "hopper.cuh"

namespace rosetta::sm90::gemm {

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

// ------------------------------------------------------------------------------------------------
// Epilogue policies
//
// After a tile's last wgmma, each consumer warpgroup calls epilogue(d, tile) on its 64 x kBN fp32
// accumulators d (the fragment layout of hopper.cuh's wgmma: warp w, lane l holds d[4c + 2h + e]
// = row 16w + l/4 + 8h, column 8c + 2(l % 4) + e), then converts d to T and stores it. Rows past
// M and columns past N hold zeros (the zero-filled edge boxes) and are never stored.

struct TileInfo {
  int m0, n0;  // the warpgroup's first row (tile row + 64 x consumer), the tile's first column
  int M, N;
  int barrier;             // the warpgroup's named barrier (128 threads)
  unsigned char* scratch;  // the warpgroup's staging boxes, kScratchBytes or more

  static constexpr int kScratchBytes = 64 * 64 * 2;  // the 3-consumer tiles stage one box
  // The staging boxes as scratch shared memory: the leader waits until the warpgroup's earlier
  // TMA stores have read them, then the warpgroup meets. The store loop that follows the
  // epilogue starts with a barrier of the warpgroup, so reads of scratch finish before it is
  // overwritten with output.
  __device__ __forceinline__ unsigned char* claim_scratch() const {
    if (threadIdx.x % 128 == 0) tma_store_wait_read<0>();
    named_barrier(barrier, 128);
    return scratch;
  }
};

// matmul: the accumulators as they are.
struct Identity {
  template <int kN>
  __device__ __forceinline__ void operator()(float (&)[kN], const TileInfo&) const {}
};

// ------------------------------------------------------------------------------------------------
// The kernel: out (M x N, row stride given by map_out; `out` itself only on the masked path,
// whose row stride is N) = epilogue(A @ B)

template <typename T, int kBM, int kBN, bool kMnMajorA, bool kMnMajorB, typename Epilogue>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(Config<kBM, kBN>::kThreads, 1)
    gemm_persistent(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                    const __grid_constant__ CUtensorMap map_out, T* __restrict__ out, int M, int N, int K,
                    bool tma_store, bool pairs, const Epilogue epilogue) {
  using C = Config<kBM, kBN>;
  constexpr int kConsumers = C::kConsumers;
  using TileA = OperandTile<kBM, kMnMajorA>;
  using TileB = OperandTile<kBN, kMnMajorB>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + (1024 - smem_u32(smem_raw) % 1024) % 1024;
  unsigned char* const staging = smem + C::kStages * C::kStageBytes;
  uint64_t* const full = reinterpret_cast<uint64_t*>(staging + C::kOutBytes);
  uint64_t* const empty = full + C::kStages;
  auto tile_a = [&](int s) { return smem + s * C::kStageBytes; };
  auto tile_b = [&](int s) { return smem + s * C::kStageBytes + C::kBytesA; };

  const int rank = int(cluster_cta_rank());  // 0: upper tile of the pair, 1: lower
  const int cluster = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;
  const int pair_rows = ((M + kBM - 1) / kBM + kCluster - 1) / kCluster, tiles_n = (N + kBN - 1) / kBN;
  const int pairs_total = pair_rows * tiles_n;
  const int k_tiles = (K + kBK - 1) / kBK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbarrier_init(&full[s], 1);                      // own expect_tx, then A + both B halves
      mbarrier_init(&empty[s], kConsumers * kCluster);  // every consumer of the cluster
    }
    fence_barrier_init();
  }
  cluster_sync();  // the peer multicasts into our barriers: both initialised first

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    set_max_registers<kProducerRegs>();
    if (threadIdx.x == 0) {
      int it = 0;  // k-tiles issued by this CTA: stage it % kStages, fill it / kStages
      for (int t = cluster; t < pairs_total; t += clusters) {
        int pr, tn;
        grouped_tile(t, pair_rows, tiles_n, kGroupM, pr, tn);
        const int m0 = (kCluster * pr + rank) * kBM, n0 = tn * kBN;  // the lower tile may lie past M: zero-filled
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = it % C::kStages;
          mbarrier_wait(&empty[s], (it / C::kStages + 1) % 2);  // both CTAs released fill f - 1
          mbarrier_arrive_expect_tx(&full[s], C::kStageBytes);
          TileA::load(&map_a, tile_a(s), &full[s], m0, kt * kBK);
          TileB::load(&map_b, tile_b(s), &full[s], n0, kt * kBK, rank, kCluster, (1u << kCluster) - 1);
        }
      }
    }
  } else {
    set_max_registers<C::kConsumerRegs>();
    const int row0 = 64 * (wg - 1);
    const bool leader = threadIdx.x % 128 == 0;  // issues the TMA stores
    unsigned char* const my_staging = staging + (wg - 1) * C::kBoxBuffers * C::kBoxBytes;
    int boxes = 0;  // output boxes this warpgroup has stored: box i is staged in buffer i % kBoxBuffers
    // A stage is free once every consumer warpgroup of both CTAs has arrived (empty's count is
    // 2 x kConsumers): lane c of the warpgroup signals CTA c, so the arrivals go out in parallel.
    auto release = [&](int s) {
      if (threadIdx.x % 128 < kCluster) mbarrier_arrive_cluster(&empty[s], threadIdx.x % 128);
    };
    int it = 0;
    for (int t = cluster; t < pairs_total; t += clusters) {
      int pr, tn;
      grouped_tile(t, pair_rows, tiles_n, kGroupM, pr, tn);
      const int m0 = (kCluster * pr + rank) * kBM + row0, n0 = tn * kBN;
      float d[kBN / 2] = {};
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = it % C::kStages;
        mbarrier_wait(&full[s], (it / C::kStages) % 2);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          wgmma<T, kBN, kMnMajorA, kMnMajorB>(d, TileA::descriptor(tile_a(s), row0, kk),
                                              TileB::descriptor(tile_b(s), 0, kk));
        wgmma_commit();
        wgmma_wait<1>();  // the previous k-tile's group is done: release its stage
        if (kt > 0) release((it - 1) % C::kStages);
      }
      wgmma_wait<0>();
      fence_accumulators(d);
      release((it - 1) % C::kStages);  // the tile's last stage; the producer is already ahead
      // The epilogue's math runs here, the tensor cores of this warpgroup idle meanwhile (the
      // producer is already loading the next tile's stages).
      epilogue(d, TileInfo{m0, n0, M, N, wg, my_staging});

      if (!tma_store) {
        store_accumulators<T, kBN>(d, out, M, N, m0, n0, pairs);
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
        if (leader) tma_store_wait_read<C::kBoxBuffers - 1>();  // the last store from this buffer has read it
        named_barrier(wg, 128);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int r = 16 * warp + lane / 4 + 8 * h, i = 4 * (8 * j + c) + 2 * h;
            const T v[2] = {from_float<T>(d[i]), from_float<T>(d[i + 1])};
            unsigned char* p = box + r * 128 + (c ^ (r % 8)) * 16 + (lane % 4) * 4;
            *reinterpret_cast<uint32_t*>(p) = *reinterpret_cast<const uint32_t*>(v);
          }
        }
        fence_proxy_async_shared();
        named_barrier(wg, 128);
        if (leader) {
          sm90::tma_store(&map_out, box, n0 + 64 * j, m0);
          tma_store_commit();
        }
      }
    }
    if (leader) tma_store_wait();
  }
  // No CTA leaves while its peer may still multicast into it or arrive on its barriers.
  cluster_sync();
}

template <typename T, int kBM, int kBN, bool kMnA, bool kMnB, typename Epilogue>
void launch(const TmaOperand& a, const TmaOperand& b, const CUtensorMap& map_out, T* out, int M, int N, int K,
            bool tma_store, bool pairs, int pairs_total, const Epilogue& epilogue, cudaStream_t stream) {
  using C = Config<kBM, kBN>;
  const auto kernel = gemm_persistent<T, kBM, kBN, kMnA, kMnB, Epilogue>;
  static const int max_clusters = [&] {  // clusters of 2 co-resident at 1 block per SM
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kCluster * sm_count());
    config.blockDim = dim3(C::kThreads);
    config.dynamicSmemBytes = C::kSmemBytes;
    int n = 0;
    cudaOccupancyMaxActiveClusters(&n, kernel, &config);
    return std::max(n, 1);
  }();
  const int clusters = std::min(pairs_total, max_clusters);
  kernel<<<kCluster * clusters, C::kThreads, C::kSmemBytes, stream>>>(a.map, b.map, map_out, out, M, N, K,
                                                                      tma_store, pairs, epilogue);
}

// out = epilogue(a @ b), a: M x K, b: K x N (tensor views, row- or column-major; a transposed
// operand is the view with sizes and strides swapped), out: M x N with row stride ld_out
// (>= N), M, N, K >= 1. Stores go through TMA when out's rows are 16-byte aligned, else through
// masked register stores, which need ld_out == N. kThreeConsumers false keeps to the 2-consumer
// tiles (an epilogue whose registers do not fit 152 a thread). cudaErrorInvalidValue, before any
// launch, for operands no tensor map describes.
template <typename T, bool kThreeConsumers = true, typename Epilogue = Identity>
cudaError_t run(const Tensor& a, const Tensor& b, T* out, int64_t ld_out, int M, int N, int K,
                const Epilogue& epilogue, cudaStream_t stream) {
  // Tile shape: the cluster-pair count in waves of ~half the SMs, times the tile's area; ties go
  // to the larger tile, which reads fewer bytes per flop (3000^3: 2 waves of 192 x 192 pairs =
  // 3 waves of 128 x 192, and the larger tile moves 14% fewer bytes from L2).
  const int slots = sm_count() / kCluster;
  struct Shape { int bm, bn; };
  const Shape shapes[] = {{192, 192}, {128, 256}, {128, 192}};
  Shape pick{};
  int64_t best = INT64_MAX, pairs_total = 0;
  for (const Shape& t : shapes) {
    if (!kThreeConsumers && t.bm == 192) continue;
    const int64_t pairs = ceil_div(ceil_div(M, t.bm), kCluster) * ceil_div(N, t.bn);
    const int64_t cost = ceil_div(pairs, slots) * t.bm * t.bn;
    if (cost < best) best = cost, pick = t, pairs_total = pairs;
  }
  if (pairs_total > INT_MAX) return cudaErrorInvalidValue;
  const int bm = pick.bm, bn = pick.bn;

  TmaOperand ta, tb;
  if (!make_tma_operand<T>(ta, a, false, bm) || !make_tma_operand<T>(tb, b, true, bn / kCluster))
    return cudaErrorInvalidValue;
  CUtensorMap map_out{};  // TMA stores need out's rows 16-byte aligned (ld_out % 8 == 0) and its base
  const bool tma_store = encode_map<T>(map_out, out, N, M, ld_out, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  if (!tma_store && ld_out != N) return cudaErrorInvalidValue;
  const bool pairs = N % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  with_majors(ta.mn_major, tb.mn_major, [&](auto mn_a, auto mn_b) {
    const auto go = [&](auto kernel_launch) {
      kernel_launch(ta, tb, map_out, out, M, N, K, tma_store, pairs, int(pairs_total), epilogue, stream);
    };
    if constexpr (kThreeConsumers) {
      if (bm == 192) return go(launch<T, 192, 192, mn_a, mn_b, Epilogue>);
    }
    if (bn == 256) go(launch<T, 128, 256, mn_a, mn_b, Epilogue>);
    else go(launch<T, 128, 192, mn_a, mn_b, Epilogue>);
  });
  return cudaSuccess;
}

}  // namespace rosetta::sm90::gemm
