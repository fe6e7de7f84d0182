// Pieces of the rms_norm and layer_norm step 3 (rows pipelined through persistent blocks, the
// longest rows cut across a cluster), each op's step 3 using all of them:
//   Packed                      a tile's 16-byte vectors as loaded (16-bit values stay packed):
//                               the next row, in flight while the current one is worked on
//   inside                      which tile elements hold data (one compare a vector when whole)
//   store_partial               a thread's column sums as a partial row, 16-byte stores
//   Exchange, slot_total        one barrier per row: every warp's partial to every CTA of the
//                               row's cluster (or to its own CTA's shared memory), then merged
//                               in a fixed order by every warp alike
//   pick_long_tile              the tiles of step 2 and, past 8,192 columns, clusters of them
//   sum_partials                the partial rows summed: a dependent launch, wide and unrolled
//   launch_rows, launch_groups  plain or cluster launch of a persistent grid, sized to the machine
//   launch_forward_rows         the forward's grid: a row ahead in a persistent grid, or, over many
//                               waves of rows, none and a block per row group (16,385-32,768 16-bit
//                               columns: a block of 1,024 threads a row in place of a cluster)
// Nothing here changes step 2's pieces in norm.cuh; sums stay fp32 and their order fixed.
#pragma once

#include "norm.cuh"

namespace rosetta::norm {

// ---------------------------------------------------------------------------------------------
// Tiles

// The tile of a CTA when a cluster holds the row: 512 threads x 16 values, 8,192 elements a CTA.
constexpr int kSliceThreads = 512, kSliceElems = 16;
constexpr int64_t kSlice = int64_t(kSliceThreads) * kSliceElems;
// Clusters of up to 8 CTAs (the portable size: no opt-in, and 8 SMs of a GPC always exist).
constexpr int kMaxRanks = 8;
constexpr int64_t kMaxLongCols = kMaxRanks * kSlice;  // 65,536

// A Tile's vectors as loaded: the next row's registers. kWhole as Tile::load. `cols` is what
// is left of the row from `row` on (a cluster CTA's slice starts inside the row; <= 0: all zero).
template <typename T, int kGroup, int kElems>
struct Packed {
  using Row = Tile<T, kGroup, kElems>;
  static constexpr int V = Row::V, kVecs = Row::kVecs;
  Vec16<T> p[kVecs];

  template <bool kWhole>
  __device__ __forceinline__ void load(const T* row, int64_t cols, int t) {
    const bool vec = kWhole || aligned16(row);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int64_t c = Row::col(i, t);
      if constexpr (kWhole) p[i].raw = c < cols ? *reinterpret_cast<const uint4*>(row + c) : make_uint4(0, 0, 0, 0);
      else p[i] = load_vec(row, c, cols, vec, 0.0f);
    }
  }
  __device__ __forceinline__ void unpack(Row& r) const {
#pragma unroll
    for (int i = 0; i < kVecs; ++i)
#pragma unroll
      for (int k = 0; k < V; ++k) r.v[i][k] = p[i].get(k);
  }
};

// Element (i, k) of thread t's tile lies inside the first n columns (n: what is left of the row
// from the tile's start). kWhole: a vector is wholly inside or wholly past the end (cols % V == 0),
// so one compare a vector; per element, ptxas keeps a 64-bit compare pair and a LOP3 each.
template <bool kWhole, typename Row>
__device__ __forceinline__ bool inside(int i, int k, int t, int64_t n) {
  return Row::col(i, t) + (kWhole ? 0 : k) < n;
}

// A thread's per-column fp32 sums (dweight's, dbias's) as a partial row: out + Row::col(i, t).
// kWhole (cols % V == 0, so every vector starts on 16 bytes if out does): V / 4 float4 stores a
// vector (STG.E.128, each 32-byte sector in at most two writes). Scalar stores, lanes V x 4 bytes
// apart, put 4 bytes a sector a write: 8 writes per sector for 16-bit tiles, which at 264 partial
// rows x 4,096 columns cost microseconds of L2 traffic.
template <bool kWhole, typename Row>
__device__ __forceinline__ void store_partial(float* out, const float (&acc)[Row::kVecs][Row::V], int t, int64_t n) {
  const bool vec = kWhole && aligned16(out);
#pragma unroll
  for (int i = 0; i < Row::kVecs; ++i) {
    const int64_t c = Row::col(i, t);
    if (vec) {
      if (c < n)
#pragma unroll
        for (int k = 0; k < Row::V; k += 4)
          *reinterpret_cast<float4*>(out + c + k) = make_float4(acc[i][k], acc[i][k + 1], acc[i][k + 2], acc[i][k + 3]);
    } else {
#pragma unroll
      for (int k = 0; k < Row::V; ++k)
        if (c + k < n) out[c + k] = acc[i][k];
    }
  }
}

// The tiles of step 3: step 2's forward or backward table up to kMaxRegisterCols, then
// cluster(ranks) of 2, 4 or 8 CTAs of kSliceThreads x kSliceElems. False past kMaxLongCols.
template <typename T, bool kBackward, typename Warp, typename Block, typename Cluster>
bool pick_long_tile(int64_t cols, Warp warp, Block block, Cluster cluster) {
  if (cols <= kMaxRegisterCols) {
    if constexpr (kBackward) return pick_backward_tile<T>(cols, warp, block);
    else return pick_forward_tile<T>(cols, warp, block);
  }
  if (cols <= 2 * kSlice) cluster(Int<2>{});
  else if (cols <= 4 * kSlice) cluster(Int<4>{});
  else if (cols <= kMaxLongCols) cluster(Int<8>{});
  else return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Clusters (PTX: the CTA's rank, a peer's shared memory, the cluster barrier)

__device__ __forceinline__ int cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return int(r);
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ uint32_t peer_address(const void* p, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
  return r;
}
// st.async: the value lands in CTA `rank`'s slot and completes its bytes of a transaction on that
// CTA's barrier (at bar's offset). No fence: the receiver's barrier wait is what orders it.
__device__ __forceinline__ void send(float2* slot, uint64_t* bar, int rank, float2 v) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n"
               ::"r"(peer_address(slot, rank)), "f"(v.x), "f"(v.y), "r"(peer_address(bar, rank)) : "memory");
}
__device__ __forceinline__ void send(float4* slot, uint64_t* bar, int rank, float4 v) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n"
               ::"r"(peer_address(slot, rank)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(peer_address(bar, rank))
               : "memory");
}
// A transaction barrier of one arrival: armed (the arrival, and the bytes still to land), then
// waited on by phase parity.
__device__ __forceinline__ void bar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void bar_arm(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)), "r"(parity)
      : "memory");
}
// The start-up handshake: arrive (relaxed: it orders only the barriers' initialisation, which
// fence.mbarrier_init publishes) at the start, wait before the first message.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// ---------------------------------------------------------------------------------------------
// One barrier a row

// A row's reduction over kWarps warps a CTA and kRanks CTAs: each warp's partial P (a float2: one
// sum, or both of layer_norm's) goes to slot [rank][warp] of every CTA's inbox, and the
// kRanks x kWarps slots are there to read in every CTA after one wait.
//   kRanks 1: lane 0 stores the slot, then the CTA barrier.
//   a cluster: lane r of each warp st.async's it into CTA r, completing bytes on CTA r's
//   transaction barrier, and each CTA waits on its own barrier for all kRanks x kWarps slots. A
//   barrier.cluster here would cost a fence: ptxas emits MEMBAR.ALL.GPU for its release, which
//   waits for the next row's loads and this row's stores, the very overlap of this step.
// Two inboxes (and barriers) alternate by row. Reuse is safe without a barrier: a peer sends row
// i + 2 only after it has every CTA's slots of row i + 1, which each CTA sends only after it has
// read its slots of row i. Thread 0 re-arms a barrier as soon as its phase completes; a phase
// cannot complete early, its arrival being that re-arm.
// open() at the kernel's start (every thread; the cluster's start-up arrive), cluster_wait()
// before the first row: no peer's st.async may land before this CTA's barriers exist.
template <int kWarps, int kRanks, typename P>
struct Exchange {
  static constexpr int kSlots = kWarps * kRanks;
  static constexpr uint32_t kBytes = kSlots * sizeof(P);
  P* inbox;        // 2 x kSlots, shared memory
  uint64_t* bars;  // 2, shared memory (clusters only)
  int rank;

  __device__ __forceinline__ void open() const {
    if constexpr (kRanks > 1) {
      if (threadIdx.x == 0) {
        bar_init(&bars[0]);
        bar_init(&bars[1]);
        bar_arm(&bars[0], kBytes);
        bar_arm(&bars[1], kBytes);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      }
      cluster_arrive_relaxed();
    }
  }

  // Row `it` of this CTA's rows (0, 1, ...): inbox it % 2, the barrier's phase (it / 2) % 2.
  __device__ __forceinline__ const P* operator()(P partial, unsigned it) const {
    const unsigned parity = it & 1u;
    P* slots = inbox + parity * kSlots;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if constexpr (kRanks == 1) {
      if (lane == 0) slots[warp] = partial;
      __syncthreads();
    } else {
      if (lane < kRanks) send(&slots[rank * kWarps + warp], &bars[parity], lane, partial);
      bar_wait(&bars[parity], (it >> 1) & 1u);
      if (threadIdx.x == 0) bar_arm(&bars[parity], kBytes);  // its next phase: row it + 2
    }
    return slots;
  }
};

// Lane j adds slots j, j + 32, ... (f picks the value), then the butterfly: every lane of every
// warp of every CTA gets the same bits (the same operands, the same order).
template <int kSlots, typename P, typename F>
__device__ __forceinline__ float slot_total(const P* slots, F f) {
  float s = 0.0f;
#pragma unroll
  for (int j = threadIdx.x % 32; j < kSlots; j += 32) s += f(slots[j], j);
  return warp_sum(s);
}

// ---------------------------------------------------------------------------------------------
// The partial rows' sum (the backward's second kernel)

// partial: kSums stacked blocks of `parts` rows x cols. Block: 32 columns x kPartSlices slices,
// slice y adding parts y, y + kPartSlices, ... (8 loads in flight a thread: the 264 rows of two
// 256-thread CTAs an SM take 9 a thread, 2 rounds), then the slices in order: the same bits
// every run. A programmatic dependent launch: its blocks are placed while the
// backward's last ones finish, and griddepcontrol.wait holds them until that grid's stores are
// visible.
constexpr int kPartSlices = 32;

template <typename T, int kSums>
__global__ void __launch_bounds__(32 * kPartSlices)
sum_partials(const float* __restrict__ partial, int64_t parts, int64_t cols, T* __restrict__ out0,
             T* __restrict__ out1) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __shared__ float part[kSums][kPartSlices][32];
  const int x = threadIdx.x % 32, y = threadIdx.x / 32;
  const int64_t c = int64_t(blockIdx.x) * 32 + x;
  float acc[kSums];
#pragma unroll
  for (int s = 0; s < kSums; ++s) acc[s] = 0.0f;
  if (c < cols) {
#pragma unroll 8
    for (int64_t r = y; r < parts; r += kPartSlices)
#pragma unroll
      for (int s = 0; s < kSums; ++s) acc[s] += partial[(s * parts + r) * cols + c];
  }
#pragma unroll
  for (int s = 0; s < kSums; ++s) part[s][y][x] = acc[s];
  __syncthreads();
  if (y < kSums && c < cols) {  // warp s finishes sum s
    float total = part[y][0][x];
#pragma unroll
    for (int j = 1; j < kPartSlices; ++j) total += part[y][j][x];
    (y == 0 ? out0 : out1)[c] = from_float<T>(total);
  }
}

// The backward's dependents may start now (they wait for the whole grid anyway): called once
// every block of the persistent grid is placed, which is at its start.
__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

template <typename T, int kSums>
cudaError_t launch_sum_partials(const float* partial, int64_t parts, int64_t cols, T* out0, T* out1,
                                cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(ceil_div(cols, 32)));
  config.blockDim = dim3(32 * kPartSlices);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, sum_partials<T, kSums>, partial, parts, cols, out0, out1);
}

// ---------------------------------------------------------------------------------------------
// Host: persistent grids

// How many groups of `ranks` CTAs of `threads` (each with `smem` bytes of dynamic shared memory)
// fit on the machine at once (a CTA per group when ranks is 1). 0: none fits (the launch would fail).
template <typename Kernel>
int64_t resident_groups(Kernel kernel, int threads, int ranks, cudaStream_t stream, size_t smem = 0) {
  if (ranks == 1) {
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
    return int64_t(per_sm) * sm_count();
  }
  cudaLaunchAttribute cluster_dim{};
  cluster_dim.id = cudaLaunchAttributeClusterDimension;
  cluster_dim.val.clusterDim = {unsigned(ranks), 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(ranks));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;  // a query only; the launch's own stream (never the legacy one while capturing)
  config.attrs = &cluster_dim;
  config.numAttrs = 1;
  int clusters = 0;
  cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  return clusters;
}

// The forward's two grids. `ahead` (the kernel with the next row in flight) runs as many blocks
// as fit at once, each walking its rows. `alone` (no row ahead: fewer registers, more blocks an
// SM; nullptr where the tile has none) runs one block per row group where the rows make at least
// kAloneWaves waves of it; then the hardware's block scheduler keeps the SMs fed. Measured on
// H100 (bench/ablations/norm_03_lean.py, layer_norm bf16, GB/s): at 16384 x 8192 and 32768 x 4096
// (41 waves) alone 2,975 and 2,963 against 2,818 and 2,797 ahead; at 4096 x 8192 (10 waves)
// 2,897 both; at 4096^2 (5 waves) 2,789 against 2,897. The same alone kernel in the persistent
// grid measured 2,773-2,804: the grid, not the registers alone, is what pays.
// `alone` is never a cluster's kernel (kMayRunAlone): it launches as single CTAs.
constexpr int64_t kAloneWaves = 12;
template <int kGroup, int kElems, int kRanks>
constexpr bool kMayRunAlone = kGroup > 32 && kElems == 16 && kRanks == 1;  // block tiles of 16 values

// groups x ranks CTAs of `threads` (`smem` bytes of dynamic shared memory each), as clusters of
// `ranks` when ranks > 1.
template <typename Kernel, typename... Args>
cudaError_t launch_groups(Kernel kernel, int64_t groups, int ranks, int threads, size_t smem, cudaStream_t stream,
                          Args... args) {
  cudaLaunchAttribute cluster_dim{};
  cluster_dim.id = cudaLaunchAttributeClusterDimension;
  cluster_dim.val.clusterDim = {unsigned(ranks), 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(groups * ranks));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &cluster_dim;
  config.numAttrs = ranks > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}
template <typename Kernel, typename... Args>
cudaError_t launch_rows(Kernel kernel, int64_t groups, int ranks, int threads, cudaStream_t stream, Args... args) {
  return launch_groups(kernel, groups, ranks, threads, 0, stream, args...);
}

// The forward's rows of 16,385-32,768 16-bit columns: one block of kWideThreads a row (32 values a
// thread, the row in registers, no row ahead) in place of a cluster of 4 CTAs, on the same
// kAloneWaves rule: all 132 SMs, where clusters of 4 one-SM CTAs fit 30 (120 SMs). Measured on
// H100 (layer_norm bf16, GB/s): 4096 x 32768 2,752 -> 2,944 (run 8d5086c82d25). Not for clusters
// of 2: a 1,024 x 16 block a row of 16,384 lost to them in development (2,848 -> 2,479). The
// whole-vector path only (layer_norm's element-wise one spills 68 bytes at 64 registers).
constexpr int kWideThreads = 1024, kWideElems = 32;
template <typename T, int kRanks, bool kWhole>
constexpr bool kMayRunWide = sizeof(T) == 2 && kWhole && kRanks == 4;

// `alone` runs `alone_threads` a block (the ahead kernel's `threads`, or kWideThreads).
template <typename Kernel, typename... Args>
cudaError_t launch_forward_rows(Kernel ahead, Kernel alone, int threads, int alone_threads, int ranks,
                                int64_t rows_per_block, int64_t rows, cudaStream_t stream, Args... args) {
  const int64_t blocks = ceil_div(rows, rows_per_block);
  if (alone != nullptr) {
    const int64_t fit = resident_groups(alone, alone_threads, 1, stream);
    if (fit > 0 && blocks >= kAloneWaves * fit) return launch_rows(alone, blocks, 1, alone_threads, stream, args...);
  }
  const int64_t groups = std::min(blocks, resident_groups(ahead, threads, ranks, stream));
  return groups <= 0 ? cudaErrorInvalidConfiguration : launch_rows(ahead, groups, ranks, threads, stream, args...);
}

// The backward's row split over persistent groups (a CTA, or a cluster of `ranks`): `groups`
// contiguous chunks of `chunk` rows, as many as fit at once (each writes a partial row), no more
// than there are rows for the row-groups of a CTA. groups 0: none fits.
template <typename Kernel>
Chunks plan_long_chunks(Kernel kernel, int threads, int ranks, int64_t rows, int rows_per_group, cudaStream_t stream,
                        size_t smem = 0) {
  const int64_t resident = resident_groups(kernel, threads, ranks, stream, smem);
  if (resident <= 0) return {rows, 0};
  const int64_t want = std::min<int64_t>(ceil_div(rows, rows_per_group), resident);
  const int64_t chunk = ceil_div(rows, want);
  return {chunk, unsigned(ceil_div(rows, chunk))};
}

}  // namespace rosetta::norm
