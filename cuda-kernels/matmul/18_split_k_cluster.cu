/*
Step 18 — split-K inside a cluster: the k-slices of a tile add up in distributed shared memory
Changed:  step 14's split, with the S blocks of a tile launched as one thread-block cluster
          (cluster dims 1 x S, S <= 8). Each block runs step 14's pipeline over its k-slice;
          then it writes its fp32 accumulators into its own shared memory (the pipeline's stages,
          free by then: 64 KB for a 128 x 128 tile, in register order so each warp's writes are
          256 contiguous bytes), and the cluster meets at a barrier (barrier.cluster arrive.release
          / wait.acquire). Block z then owns the z-th S-th of the tile: for each of its elements it
          reads the S blocks' values through DSMEM (mapa + ld.shared::cluster), all S loads in
          flight, adds them in the order 0 .. S-1 (the same bits on every run), and stores the
          sum. A second cluster barrier keeps every block alive until its peers have read it.
          No workspace, no ticket, no second kernel.
Why:      step 14's slices meet in global memory: S x M x N fp32 written and read back through
          L2 (4.7 MB at 128 x 768 x 3072, as much as B itself) and a second launch, ~2-4 us of
          calls that cuBLAS finishes in 7-8 us. Step 17 moved the adds into the GEMM kernel but
          onto one SM per tile, a chain of L2 round trips. Here the adds stay on the S SMs that
          computed the slices, each adding 1/S of the tile from the S shared memories one DSMEM
          round trip deep, and never leave the cluster: 128 x 768 x 3072 is 24 tiles x 4 slices of 3
          k-tiles, 96 blocks, each adding a 32 x 128 band of its tile. The split rule is step
          14's (about one block per SM), lowered until every cluster is resident at once: a
          cluster sits whole on one GPC, so 132 SMs hold only 30 clusters of 4 (1 x 4096 x 4096:
          32 tiles, S = 3 rather than 4: 32 clusters of 4 ran in two rounds, ~25% behind step 14).
Still:    S <= 8 (the portable cluster size): a tile with many k-tiles and nothing else to share
          the machine (64 x 16384 x 64: one tile) runs on 8 SMs where step 14 puts 16. The slices
          are as long as step 14's; at M <= 16 a 64-row tile still multiplies padding rows.
Limits:   as step 14: one unit stride per operand (row- or column-major; the dispatcher copies
          others), operands the copy engine cannot read as they are first repacked into the
          workspace. Meant for problems of at most two waves of 128 x 128 output tiles on 132
          SMs (`output_tiles <= 264`): larger ones are refused before launch and left to steps
          9-13. M, N, K < 2^31.
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

constexpr int kGroupM = 8;         // tile order for L2 reuse when M is large and S = 1
constexpr int kMinSliceTiles = 3;  // k-tiles a slice walks at least
constexpr int kMaxSplit = 8;       // the portable cluster size

// A float2 of CTA `rank`'s shared memory, at the offset `local` has in ours.
__device__ __forceinline__ float2 load_peer(const float2* local, uint32_t rank) {
  uint32_t remote;
  asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(sm90::smem_u32(local)), "r"(rank));
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(remote));
  return v;
}

// The element pair i of a tile held in register order (pair p of consumer thread t at
// i = p * kConsumerThreads + t; hopper.cuh's accumulator layout): its row and column in the tile.
template <int kConsumerThreads>
__device__ __forceinline__ void pair_coords(int i, int& row, int& col) {
  const int t = i % kConsumerThreads, p = i / kConsumerThreads;
  const int wg = t / 128, warp = t % 128 / 32, lane = t % 32;
  row = 64 * wg + 16 * warp + lane / 4 + 8 * (p % 2);
  col = 8 * (p / 2) + 2 * (lane % 4);
}

// out (S = 1), or with S > 1 the k-slice blockIdx.y of tile blockIdx.x, its sum with the other
// slices' taken inside the cluster.
template <typename T, int kConsumers, bool kMnMajorA, bool kMnMajorB>
__global__ void __launch_bounds__(Config<kConsumers>::kThreads, 1)
    matmul_split_k_cluster(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           T* __restrict__ out, int M, int N, int K, bool pairs) {
  using C = Config<kConsumers>;
  using TileA = sm90::OperandTile<C::kBM, kMnMajorA>;
  using TileB = sm90::OperandTile<kBN, kMnMajorB>;
  constexpr int kConsumerThreads = 128 * kConsumers;
  constexpr int kPairs = C::kBM * kBN / 2;  // float pairs in a tile
  static_assert(kPairs * 8 <= C::kStages * C::kStageBytes, "the tile's fp32 sums fit in the stages");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + C::kStages * C::kStageBytes);
  uint64_t* const empty = full + C::kStages;
  auto tile_a = [&](int s) { return smem + s * C::kStageBytes; };
  auto tile_b = [&](int s) { return smem + s * C::kStageBytes + C::kBytesA; };

  int tm, tn;
  rosetta::tile_coords<kGroupM>(blockIdx.x, (M + C::kBM - 1) / C::kBM, (N + kBN - 1) / kBN, tm, tn);
  const int m0 = tm * C::kBM, n0 = tn * kBN;
  const int k_tiles = (K + kBK - 1) / kBK, slice = blockIdx.y, slices = gridDim.y;
  const int k_first = k_tiles * slice / slices;
  const int steps = k_tiles * (slice + 1) / slices - k_first;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      sm90::mbarrier_init(&full[s], 1);
      sm90::mbarrier_init(&empty[s], kConsumers);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  float d[kBN / 2] = {};
  if (wg == kConsumers) {  // the producer warp: one thread issues every copy, as in step 14
    if (threadIdx.x % 32 == 0) {
      for (int i = 0; i < steps; ++i) {
        const int s = i % C::kStages;
        sm90::mbarrier_wait(&empty[s], (i / C::kStages + 1) % 2);
        sm90::mbarrier_arrive_expect_tx(&full[s], C::kStageBytes);
        TileA::load(&map_a, tile_a(s), &full[s], m0, (k_first + i) * kBK);
        TileB::load(&map_b, tile_b(s), &full[s], n0, (k_first + i) * kBK);
      }
    }
    if (slices == 1) return;  // with S > 1 the warp stays for the cluster's barriers
  } else {
    for (int i = 0; i < steps; ++i) {
      const int s = i % C::kStages;
      sm90::mbarrier_wait(&full[s], (i / C::kStages) % 2);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        sm90::wgmma<T, kBN, kMnMajorA, kMnMajorB>(d, TileA::descriptor(tile_a(s), 64 * wg, kk),
                                                  TileB::descriptor(tile_b(s), 0, kk));
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();
      if (i >= 1 && threadIdx.x % 128 == 0) sm90::mbarrier_arrive(&empty[(i - 1) % C::kStages]);
    }
    sm90::wgmma_wait<0>();
    sm90::fence_accumulators(d);
    if (slices == 1) {
      sm90::store_accumulators<T, kBN>(d, out, M, N, m0 + 64 * wg, n0, pairs);
      return;
    }
  }

  // The slices meet. Every copy has landed and every wgmma has read its stage: after this
  // barrier the stages hold this block's sums instead.
  float2* const sums = reinterpret_cast<float2*>(smem);
  __syncthreads();
  if (wg < kConsumers) {
#pragma unroll
    for (int p = 0; p < kBN / 4; ++p) sums[p * kConsumerThreads + threadIdx.x] = make_float2(d[2 * p], d[2 * p + 1]);
  }
  sm90::cluster_sync();  // every block's sums written, and visible to the cluster

  // Block z adds pairs [z * kPairs / S, (z + 1) * kPairs / S) of the tile over the S blocks.
  if (wg < kConsumers) {
    const int first = kPairs * slice / slices, last = kPairs * (slice + 1) / slices;
    for (int i = first + threadIdx.x; i < last; i += kConsumerThreads) {
      int row, col;
      pair_coords<kConsumerThreads>(i, row, col);
      const int m = m0 + row, n = n0 + col;
      if (m >= M || n >= N) continue;
      float2 v[kMaxSplit];
#pragma unroll
      for (int z = 0; z < kMaxSplit; ++z)  // every load in flight before the first add
        if (z < slices) v[z] = load_peer(sums + i, z);
      float2 s = v[0];
#pragma unroll
      for (int z = 1; z < kMaxSplit; ++z)
        if (z < slices) s.x += v[z].x, s.y += v[z].y;
      T* const row_out = out + int64_t(m) * N;
      const T r[2] = {rosetta::from_float<T>(s.x), rosetta::from_float<T>(s.y)};
      if (pairs && n + 1 < N) {
        *reinterpret_cast<uint32_t*>(row_out + n) = *reinterpret_cast<const uint32_t*>(r);
      } else {
        row_out[n] = r[0];
        if (n + 1 < N) row_out[n + 1] = r[1];
      }
    }
  }
  sm90::cluster_sync();  // no block leaves while a peer may still read its sums
}

// S: about one block per SM (step 14's rule), slices of >= kMinSliceTiles k-tiles, at most
// kMaxSplit, and no more than lets every cluster be resident at once: a cluster is placed whole
// on one GPC, so clusters of S one-block-per-SM blocks fit fewer than SMs / S times (this H100:
// 66 of 2, 30 of 4, 15 of 8), and one more would wait for a second round, doubling the time.
// clusters_fitting(s) is the occupancy API's count for clusters of s.
template <typename ClustersFitting>
int choose_split(int64_t tiles, int64_t k_tiles, ClustersFitting&& clusters_fitting) {
  const int64_t sms = rosetta::sm_count();
  int split = int(std::min({(sms + tiles / 2) / tiles, k_tiles / kMinSliceTiles, int64_t(kMaxSplit)}));
  while (split > 1 && tiles > clusters_fitting(split)) --split;
  return std::max(split, 1);
}

template <typename T, int kConsumers, bool kMnA, bool kMnB>
cudaError_t launch(const sm90::TmaOperand& a, const sm90::TmaOperand& b, const rosetta::MatmulArgs& args, int M,
                   int N, int K, cudaStream_t stream) {
  using C = Config<kConsumers>;
  const auto kernel = matmul_split_k_cluster<T, kConsumers, kMnA, kMnB>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  const int64_t tiles = rosetta::ceil_div(M, C::kBM) * rosetta::ceil_div(N, kBN);
  if (tiles > INT_MAX) return cudaErrorInvalidValue;
  // The launch for a split of s: a grid of tiles x s blocks in clusters of 1 x s.
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(C::kThreads);
  config.dynamicSmemBytes = C::kSmemBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  auto configure = [&](int s) {
    config.gridDim = dim3(unsigned(tiles), unsigned(s));
    cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = unsigned(s), cluster.val.clusterDim.z = 1;
  };
  static int fitting[kMaxSplit + 1] = {};  // per instantiation: clusters of s resident at once
  const int split = choose_split(tiles, rosetta::ceil_div(K, kBK), [&](int s) {
    if (fitting[s] == 0) {
      configure(s);
      int n = 0;
      cudaOccupancyMaxActiveClusters(&n, kernel, &config);
      fitting[s] = std::max(n, 1);
    }
    return int64_t(fitting[s]);
  });
  configure(split);
  T* const out = args.out.ptr<T>();
  const bool pairs = N % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  return cudaLaunchKernelEx(&config, kernel, a.map, b.map, out, M, N, K, pairs);
}

}  // namespace

cudaError_t matmul_18_split_k_cluster(const rosetta::MatmulArgs& args, cudaStream_t stream) {
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
