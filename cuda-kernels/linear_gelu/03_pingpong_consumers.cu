/*
Step 3 — ping-pong consumers: one warpgroup's epilogue under the other's MMAs
Changed:  step 2's fused epilogues (copied unchanged) on a GEMM of this file's own, step 2's
          producer, stages and cluster pair with another schedule for the consumers: the two
          consumer warpgroups no longer split one 128 x 256 tile; each owns a whole 128 x 128
          tile (two m64n128 row blocks, 128 fp32 accumulators a thread), the CTA's tiles go to
          them in turn, and a consumer issues a tile's MMAs only after the other has issued all
          of its previous tile's (an mbarrier each, "issued"). The producer fills 6 stages of
          32 KB in tile order, B multicast across the 2-CTA cluster as before. Backward: the
          recompute GEMM that fuses dGELU and dbias's partial rows runs ping-pong too; da's and
          dweight's GEMMs have no epilogue to hide and stay step 2's.
Why:      in step 2 both consumers reach the epilogue together: the tensor cores idle through
          the bias, the GELU (one MUFU op an element in bf16, two in fp16) and the stores,
          ~7 us of 186 at 4096^3 and a fifth of the time at K = 768. Here while one consumer
          runs its epilogue the other runs a mainloop alone; one warpgroup issuing m64n128k16
          back to back can keep an SM's tensor cores busy. The price: a 128 x 128 tile with B
          shared by the pair reads 24 KB from L2 per 2.1 MFLOP k-step against step 2's 32 KB per
          4.2 (1.5x the bytes a flop), and each wgmma reads A and B from shared memory for half
          the work of an m64n256. Predicted (bf16): the epilogue hidden where the mainloop
          keeps its rate: 4096^3 ~180 us (1.01x the bare GEMM, step 2 1.04x), 2048 x 768 x
          3072 ~21 us (step 2 24.6); fp16 (two MUFU ops) gains more.
Still:    slower than step 2 on every measured shape (run 60533a6f418a, bf16 4096^3: 224.9 us
          against 183.7; 2048 x 768 x 3072: 25.3 against 24.7): the epilogue is hidden, but the
          half-size tile is the wall. ncu at 4096^3: 1.46x step 2's L2-to-SM bytes, L2 73% busy
          (62), tensor pipe 71% active (90), 5x the long-scoreboard stalls of consumers waiting
          for stages. A consumer owning a whole tile at 128 accumulators a thread is 128 x 128 or
          64 x 256, and either reads 1.25x the shared-memory operand bytes a flop of step 2's
          128 x 256 pair. The backward's recompute GEMM trades the same (4096^3: -0.5%). One
          tile shape for every problem. It stays for its lesson (KERNEL_LOG); step=None takes
          it only where a measured table ranks it first (the H100's never does).
Limits:   as step 2: M, N, K < 2^31; K = 0 refused before launch (`Min: k`), step 1 takes it.
          Workspace (backward): M x N rounded up to 8 of T (dz) and ceil(M / 64) x N fp32.
Dtypes:   bfloat16, float16
Layout:   tma
Min:      k >= 1
Slower:   than step 2 on every shape measured on the H100 (a lesson, not a default)
*/
#include "gelu.cuh"

namespace {

namespace gemm = rosetta::sm90::gemm;
namespace gl = rosetta::gelu;
namespace nm = rosetta::norm;
using rosetta::from_float;
using rosetta::ceil_div;
using rosetta::sm_count;
using rosetta::to_float;
using namespace rosetta::sm90;

// ------------------------------------------------------------------------------------------------
// The epilogue policies: step 2's, unchanged (a consumer calls them once per 64-row half).

// Column n of bias as float, 0 past N (those accumulator columns are never stored).
template <typename T>
__device__ __forceinline__ float bias_at(const T* bias, int n, int N) {
  return n < N ? to_float(bias[n]) : 0.0f;
}

// out = gelu(acc + bias). The tile's kBN bias values are staged in the warpgroup's staging boxes
// first (each thread loads 2 of them from global memory): the GELU loop then reads them back
// with short-latency shared loads (a warp reads 4 addresses, broadcast to 8 rows each). With
// global loads in the loop ptxas hoisted them far ahead and spilled at 168 (128 x 256) and
// 128 (192 x 192) registers a thread, 128 or 96 of them accumulators.
template <typename T>
struct BiasGelu {
  const T* __restrict__ bias;

  template <int kN>
  __device__ __forceinline__ void operator()(float (&d)[kN], const gemm::TileInfo& t) const {
    constexpr int kCols = 2 * kN;  // the tile's columns
    static_assert(kCols * 4 <= gemm::TileInfo::kScratchBytes, "the tile's bias fits the staging");
    float* const b = reinterpret_cast<float*>(t.claim_scratch());
    for (int j = threadIdx.x % 128; j < kCols; j += 128) b[j] = bias_at(bias, t.n0 + j, t.N);
    rosetta::sm90::named_barrier(t.barrier, 128);
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int c = 0; c < kN / 4; ++c) {
      const float2 bc = *reinterpret_cast<const float2*>(b + 8 * c + 2 * (lane % 4));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        d[4 * c + 2 * h] = gl::gelu<T>(d[4 * c + 2 * h] + bc.x);
        d[4 * c + 2 * h + 1] = gl::gelu<T>(d[4 * c + 2 * h + 1] + bc.y);
      }
    }
  }
};

// acc (= z - bias) -> dz = dy * gelu'(z), and partial[m0 / 64][n] = the sum of dz over the
// warpgroup's 64 rows. Rows past M and columns past N get dy = 0, so dz = 0 there and the sums
// need no mask.
template <typename T>
struct GeluBackward {
  const T* __restrict__ bias;
  const T* __restrict__ dy;
  int64_t dy_s0, dy_s1;
  bool dy_pairs;  // dy row-major, even row stride, 4-byte aligned: (n, n + 1) is one 4-byte load
  float* __restrict__ partial;  // ceil(M / 64) rows of N

  template <int kN>
  __device__ __forceinline__ void operator()(float (&d)[kN], const gemm::TileInfo& t) const {
    constexpr int kCols = 2 * kN;  // the tile's columns
    static_assert(4 * kCols * 4 <= gemm::TileInfo::kScratchBytes, "4 warps' column sums fit the staging");
    float* const sums = reinterpret_cast<float*>(t.claim_scratch());  // [warp][column]
    const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int c = 0; c < kN / 4; ++c) {
      const int n = t.n0 + 8 * c + 2 * (lane % 4);
      const float b0 = bias_at(bias, n, t.N), b1 = bias_at(bias, n + 1, t.N);
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = t.m0 + 16 * warp + lane / 4 + 8 * h;
        float g0 = 0.0f, g1 = 0.0f;
        if (m < t.M) {
          const T* p = dy + int64_t(m) * dy_s0 + int64_t(n) * dy_s1;  // int64: m * stride passes 2^31
          if (dy_pairs && n + 1 < t.N) {
            const uint32_t bits = __ldg(reinterpret_cast<const unsigned int*>(p));
            const T* v = reinterpret_cast<const T*>(&bits);
            g0 = to_float(v[0]), g1 = to_float(v[1]);
          } else {
            if (n < t.N) g0 = to_float(p[0]);
            if (n + 1 < t.N) g1 = to_float(p[dy_s1]);
          }
        }
        float& z0 = d[4 * c + 2 * h];
        float& z1 = d[4 * c + 2 * h + 1];
        z0 = g0 * gl::gelu_grad(z0 + b0);
        z1 = g1 * gl::gelu_grad(z1 + b1);
        s0 += z0, s1 += z1;
      }
      // The warp's 16 rows: lanes l, l ^ 4, l ^ 8, l ^ 16 hold the same columns. The same
      // butterfly in every lane: a fixed order, so dbias is deterministic.
#pragma unroll
      for (int off = 4; off < 32; off *= 2) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, off);
        s1 += __shfl_xor_sync(0xffffffffu, s1, off);
      }
      if (lane < 4) {
        sums[warp * kCols + 8 * c + 2 * lane] = s0;
        sums[warp * kCols + 8 * c + 2 * lane + 1] = s1;
      }
    }
    rosetta::sm90::named_barrier(t.barrier, 128);
    if (t.m0 >= t.M) return;  // the lower tile of a pair past M: no partial row of its own
    float* const row = partial + int64_t(t.m0 / 64) * t.N;
    for (int j = threadIdx.x % 128; j < kCols; j += 128) {
      if (t.n0 + j >= t.N) break;
      row[t.n0 + j] = ((sums[j] + sums[kCols + j]) + sums[2 * kCols + j]) + sums[3 * kCols + j];
    }
  }
};

// ------------------------------------------------------------------------------------------------
// The ping-pong GEMM: gemm_sm90.cuh's producer, stages and cluster pair; the consumers take turns.

using gemm::kBK;
using gemm::kCluster;
using gemm::kGroupM;
using gemm::kProducerRegs;
using gemm::TileInfo;

constexpr int kBM = 128, kBN = 128;  // one consumer's tile
constexpr int kConsumers = 2, kThreads = 128 * (1 + kConsumers);
constexpr int kConsumerRegs = 232;
constexpr int kStageBytes = (kBM + kBN) * kBK * 2;  // 32 KB: A's 128 rows, B's 128 columns
constexpr int kBoxBytes = 64 * 64 * 2;              // one 64 x 64 output box
constexpr int kBoxBuffers = 2;                      // a consumer writes one box while the last is stored
constexpr int kOutBytes = kConsumers * kBoxBuffers * kBoxBytes;
constexpr int kMaxStages = 6;
constexpr int kBarrierBytes = (2 * kMaxStages + kConsumers) * 8;  // full, empty, issued
constexpr int kStages = std::min(kMaxStages, (227 * 1024 - kOutBytes - kBarrierBytes - 1024) / kStageBytes);
constexpr int kSmemBytes = kStages * kStageBytes + kOutBytes + kBarrierBytes + 1024;
static_assert(kStages >= 4, "a pipeline deep enough for one consumer to run alone");
static_assert(128 * (kProducerRegs + kConsumers * kConsumerRegs) <= 65536, "the register file");
static_assert(kSmemBytes <= 227 * 1024, "fits the opt-in shared memory of one block");
static_assert(TileInfo::kScratchBytes <= kBoxBuffers * kBoxBytes, "a consumer's staging is its epilogue's scratch");

// A consumer's 64 x 128 accumulators (rows m0.., columns n0..) out through its staging boxes: two
// boxes of 64 x 64, each written swizzled (the layout CU_TENSOR_MAP_SWIZZLE_128B reads) and
// stored by the leader; with two buffers box i is written while box i - 1 is stored.
template <typename T>
__device__ __forceinline__ void store_half(const float (&d)[64], const CUtensorMap* map_out, unsigned char* staging,
                                           int& boxes, int m0, int n0, int barrier, bool leader) {
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kBN / 64; ++j, ++boxes) {
    unsigned char* const box = staging + (boxes % kBoxBuffers) * kBoxBytes;
    if (leader) tma_store_wait_read<kBoxBuffers - 1>();  // the last store from this buffer has read it
    named_barrier(barrier, 128);
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
    named_barrier(barrier, 128);
    if (leader) {
      tma_store(map_out, box, n0 + 64 * j, m0);
      tma_store_commit();
    }
  }
}

template <typename T, bool kMnMajorA, bool kMnMajorB, typename Epilogue>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 1)
    gemm_pingpong(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                  const __grid_constant__ CUtensorMap map_out, T* __restrict__ out, int M, int N, int K,
                  bool tma_store, bool pairs, const Epilogue epilogue) {
  using TileA = OperandTile<kBM, kMnMajorA>;
  using TileB = OperandTile<kBN, kMnMajorB>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const smem = smem_raw + (1024 - smem_u32(smem_raw) % 1024) % 1024;
  unsigned char* const staging = smem + kStages * kStageBytes;
  uint64_t* const full = reinterpret_cast<uint64_t*>(staging + kOutBytes);
  uint64_t* const empty = full + kStages;
  uint64_t* const issued = empty + kStages;  // issued[c]: consumer c has issued all of a tile's MMAs
  auto tile_a = [&](int s) { return smem + s * kStageBytes; };
  auto tile_b = [&](int s) { return smem + s * kStageBytes + TileA::kBytes; };

  const int rank = int(cluster_cta_rank());  // 0: upper tile of the pair, 1: lower
  const int cluster = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;
  const int pair_rows = ((M + kBM - 1) / kBM + kCluster - 1) / kCluster, tiles_n = (N + kBN - 1) / kBN;
  const int pairs_total = pair_rows * tiles_n;
  const int k_tiles = (K + kBK - 1) / kBK;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);          // own expect_tx, then A + both B halves
      mbarrier_init(&empty[s], kCluster);  // the one consumer that reads the stage, in both CTAs
    }
    for (int c = 0; c < kConsumers; ++c) mbarrier_init(&issued[c], 1);
    fence_barrier_init();
  }
  cluster_sync();  // the peer multicasts into our barriers: both initialised first

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    set_max_registers<kProducerRegs>();
    if (threadIdx.x == 0) {  // the stages in tile order, whichever consumer reads them
      int it = 0;
      for (int t = cluster; t < pairs_total; t += clusters) {
        int pr, tn;
        grouped_tile(t, pair_rows, tiles_n, kGroupM, pr, tn);
        const int m0 = (kCluster * pr + rank) * kBM, n0 = tn * kBN;  // the lower tile may lie past M: zero-filled
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = it % kStages;
          mbarrier_wait(&empty[s], (it / kStages + 1) % 2);  // both CTAs released fill f - 1
          mbarrier_arrive_expect_tx(&full[s], kStageBytes);
          TileA::load(&map_a, tile_a(s), &full[s], m0, kt * kBK);
          TileB::load(&map_b, tile_b(s), &full[s], n0, kt * kBK, rank, kCluster, (1u << kCluster) - 1);
        }
      }
    }
  } else {
    set_max_registers<kConsumerRegs>();
    const int me = wg - 1;
    const bool leader = threadIdx.x % 128 == 0;  // issues the TMA stores
    unsigned char* const my_staging = staging + me * kBoxBuffers * kBoxBytes;
    int boxes = 0;
    auto release = [&](int s) {  // lane c signals CTA c: both CTAs' copies of the stage are read
      if (threadIdx.x % 128 < kCluster) mbarrier_arrive_cluster(&empty[s], threadIdx.x % 128);
    };
    int it = 0, j = 0;  // it: stages of the CTA's tiles so far; j: the CTA's tiles so far
    for (int t = cluster; t < pairs_total; t += clusters, ++j, it += k_tiles) {
      if (j % kConsumers != me) continue;  // the other consumer's tile (its stages are skipped)
      int pr, tn;
      grouped_tile(t, pair_rows, tiles_n, kGroupM, pr, tn);
      const int m0 = (kCluster * pr + rank) * kBM, n0 = tn * kBN;
      // The turn: tile j's MMAs after tile j - 1's are all issued (the other consumer's
      // ((j - 1) / 2)-th completion of its barrier). Without it the two drift into step, share
      // the tensor cores, and reach their epilogues together again.
      if (j > 0) mbarrier_wait(&issued[1 - me], ((j - 1) / kConsumers) % 2);
      float d0[kBN / 2] = {}, d1[kBN / 2] = {};  // rows 0-63 and 64-127 of the tile
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = (it + kt) % kStages;
        mbarrier_wait(&full[s], ((it + kt) / kStages) % 2);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          const uint64_t b = TileB::descriptor(tile_b(s), 0, kk);
          wgmma<T, kBN, kMnMajorA, kMnMajorB>(d0, TileA::descriptor(tile_a(s), 0, kk), b);
          wgmma<T, kBN, kMnMajorA, kMnMajorB>(d1, TileA::descriptor(tile_a(s), 64, kk), b);
        }
        wgmma_commit();
        wgmma_wait<1>();  // k-tile kt - 1's group is done: release its stage
        if (kt > 0) release((it + kt - 1) % kStages);
      }
      if (leader) mbarrier_arrive(&issued[me]);  // the other consumer may start its tile
      wgmma_wait<0>();
      fence_accumulators(d0);
      fence_accumulators(d1);
      release((it + k_tiles - 1) % kStages);
      epilogue(d0, TileInfo{m0, n0, M, N, wg, my_staging});
      epilogue(d1, TileInfo{m0 + 64, n0, M, N, wg, my_staging});
      if (tma_store) {
        store_half<T>(d0, &map_out, my_staging, boxes, m0, n0, wg, leader);
        store_half<T>(d1, &map_out, my_staging, boxes, m0 + 64, n0, wg, leader);
      } else {
        store_accumulators<T, kBN>(d0, out, M, N, m0, n0, pairs);
        store_accumulators<T, kBN>(d1, out, M, N, m0 + 64, n0, pairs);
      }
    }
    if (leader) tma_store_wait();
  }
  // No CTA leaves while its peer may still multicast into it or arrive on its barriers.
  cluster_sync();
}

template <typename T, bool kMnA, bool kMnB, typename Epilogue>
void launch(const TmaOperand& a, const TmaOperand& b, const CUtensorMap& map_out, T* out, int M, int N, int K,
            bool tma_store, bool pairs, int pairs_total, const Epilogue& epilogue, cudaStream_t stream) {
  const auto kernel = gemm_pingpong<T, kMnA, kMnB, Epilogue>;
  static const int max_clusters = [&] {  // clusters of 2 co-resident at 1 block per SM
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kCluster * sm_count());
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmemBytes;
    int n = 0;
    cudaOccupancyMaxActiveClusters(&n, kernel, &config);
    return std::max(n, 1);
  }();
  const int clusters = std::min(pairs_total, max_clusters);
  kernel<<<kCluster * clusters, kThreads, kSmemBytes, stream>>>(a.map, b.map, map_out, out, M, N, K, tma_store,
                                                                pairs, epilogue);
}

// out = epilogue(a @ b): gemm::run's contract (operands, ld_out, the TMA or masked store, errors).
template <typename T, typename Epilogue>
cudaError_t run(const rosetta::Tensor& a, const rosetta::Tensor& b, T* out, int64_t ld_out, int M, int N, int K,
                const Epilogue& epilogue, cudaStream_t stream) {
  const int64_t pairs_total = ceil_div(ceil_div(M, kBM), kCluster) * ceil_div(N, kBN);
  if (pairs_total > INT_MAX) return cudaErrorInvalidValue;
  TmaOperand ta, tb;
  if (!make_tma_operand<T>(ta, a, false, kBM) || !make_tma_operand<T>(tb, b, true, kBN / kCluster))
    return cudaErrorInvalidValue;
  CUtensorMap map_out{};
  const bool tma_store = encode_map<T>(map_out, out, N, M, ld_out, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  if (!tma_store && ld_out != N) return cudaErrorInvalidValue;
  const bool pairs = N % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  with_majors(ta.mn_major, tb.mn_major, [&](auto mn_a, auto mn_b) {
    launch<T, mn_a, mn_b, Epilogue>(ta, tb, map_out, out, M, N, K, tma_store, pairs, int(pairs_total), epilogue,
                                    stream);
  });
  return cudaSuccess;
}

}  // namespace

cudaError_t linear_gelu_03_pingpong_consumers(const rosetta::LinearGeluArgs& args, cudaStream_t stream) {
  const int64_t M = args.a.size[0], K = args.a.size[1], N = args.weight.size[1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || K == 0) return cudaErrorInvalidValue;  // K: Min: k
  if (M == 0 || N == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(args.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = run<T>(args.a, args.weight, args.out.ptr<T>(), N, int(M), int(N), int(K),
                              BiasGelu<T>{args.bias.ptr<const T>()}, stream);
  });
  return status != cudaSuccess ? status : launched;
}

cudaError_t linear_gelu_03_pingpong_consumers_backward(const rosetta::LinearGeluBackwardArgs& args,
                                                       cudaStream_t stream) {
  const int64_t M = args.a.size[0], K = args.a.size[1], N = args.weight.size[1];
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || K == 0) return cudaErrorInvalidValue;  // K: Min: k
  if (M == 0) {  // no rows: dweight and dbias are sums of nothing (da is empty)
    const cudaError_t e = nm::zero(args.dweight, stream);
    return e != cudaSuccess ? e : nm::zero(args.dbias, stream);
  }
  if (N == 0) return nm::zero(args.da, stream);  // da = dz @ weight^T over no columns; the rest is empty
  cudaError_t status = cudaSuccess;
  const cudaError_t launched = rosetta::dispatch_dtype(args.a.dtype, [&](auto tag) {
    using T = decltype(tag);
    const int64_t ldz = gl::padded_cols(N);  // dz is a TMA operand below: 16-byte rows
    T* const dz = args.workspace.get<T>(M * ldz);
    const int64_t parts = rosetta::ceil_div(M, 64);  // one partial row per 64 rows (a consumer's half tile)
    float* const partial = args.workspace.get<float>(parts * N);
    const rosetta::Tensor& dy = args.dy;
    const bool pairs = dy.stride[1] == 1 && dy.stride[0] % 2 == 0 && reinterpret_cast<uintptr_t>(dy.data) % 4 == 0;
    const GeluBackward<T> epilogue{args.bias.ptr<const T>(), dy.ptr<const T>(), dy.stride[0], dy.stride[1],
                                       pairs, partial};
    status = run<T>(args.a, args.weight, dz, ldz, int(M), int(N), int(K), epilogue, stream);
    if (status != cudaSuccess) return;
    nm::reduce_partials<T, 1><<<nm::column_grid(N), nm::column_block(), 0, stream>>>(
        partial, parts, N, args.dbias.ptr<T>(), static_cast<T*>(nullptr));
    const rosetta::Tensor dz_view = gl::matrix(dz, args.a.dtype, M, N, ldz, 1);
    status = gemm::run<T>(dz_view, gl::transposed(args.weight), args.da.ptr<T>(), K, int(M), int(K), int(N),
                          gemm::Identity{}, stream);
    if (status != cudaSuccess) return;
    status = gemm::run<T>(gl::transposed(args.a), dz_view, args.dweight.ptr<T>(), N, int(K), int(N), int(M),
                          gemm::Identity{}, stream);
  });
  return status != cudaSuccess ? status : launched;
}
