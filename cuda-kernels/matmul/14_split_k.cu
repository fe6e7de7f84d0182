/*
Step 14 — split-K on the WGMMA + TMA pipeline for small-M and K-heavy shapes
Changed:  step 12's producer / consumer pipeline (full and empty mbarriers, TMA boxes in 128-byte
          swizzle, wgmma from shared memory) on smaller tiles, with K split across blocks. A
          block is 64 x 128 (one consumer warpgroup, wgmma.m64n128k16, HGMMA.64x128x16) when
          M <= 64, else 128 x 128 (two), plus one producer warp, with 9 (7) stages of 24 (32) KB:
          216 (224) KB of loads in flight per SM. The grid is tiles x S: block (t, z) multiplies
          k-tiles [z * k_tiles / S, (z + 1) * k_tiles / S) of tile t. With S > 1 each block
          writes its fp32 partial tile to a workspace slice (S x M x N floats), and a second
          kernel adds the S slices in the order z = 0 .. S - 1 (the same bits on every run) and
          converts to bf16/fp16, 4 elements a thread, launched with programmatic dependent launch
          (griddepcontrol): placed while the GEMM's blocks finish, waiting for their stores.
          S = round(SMs / tiles), at most one wave, slices of >= 4 k-tiles, at most 16; S = 1
          writes out directly. Later: where that would split, 64-column tiles (wgmma.m64n64k16,
          14 stages of 16 KB) with no split take its place if they make 48 to one wave of blocks
          (64 rows a tile, 128 past a wave) and K <= 4096 (2048 for 128 rows); at M < 64 A's
          K-major boxes are M rows, not 64 (see Still).
Why:      at small M the product is a stream of B: M = 16, K = 4096, N = 14336 bf16 reads 117 MB
          of B for 1.9 Gflop (16 flop/B), ~39 us at 3 TB/s; A (131 KB) and out (459 KB) are
          noise. Step 12 cuts out into 128 x 256 tiles: 56 blocks there, each streaming 2.1 MB
          of B, and 16 at N = 4096 (step 13: 56 and 22 cluster pairs, the lower tile of each all
          zero rows). 16 SMs cannot pull 3 TB/s: each would need ~190 GB/s from 192 KB in flight,
          which at the >= 1 us latency of a loaded HBM is its ceiling at best. Here M = 16,
          N = 4096, K = 4096 is 32 tiles x S = 4 = 128 blocks, 16 k-tiles (256 KB of B) each,
          ~23 GB/s per SM, and 128 x 216 KB = 27 MB in flight covers HBM's latency-bandwidth
          product (~3-5 MB) several times. The partials cost 2 x S x M x N x 4 bytes (written,
          read back, mostly from L2): 1 MB each way there, 3% of B's 33.5 MB. M = 16, N = 14336
          is 112 tiles: S = 1, one wave, no partials. K-heavy 300 x 8192 x 300 (9 tiles of
          128 x 128) gets S = 14: 126 blocks of 9-10 k-tiles instead of 9 blocks of 128.
Still:    since S ~ SMs / tiles, the partials are about SMs x tile area x 4 bytes whatever the
          shape: 8.4 MB each way at M = 128, N = 4096 (128 x 128 tiles, S = 4; B is 33.5 MB),
          up to 4.3 MB with 64 x 128 tiles, plus a second kernel; an in-kernel reduction (the
          last block of a tile adds the others' slices, in order, behind a counter) would keep
          them in L2 and drop the launch. Tile counts just over a multiple of the SMs leave a
          partial wave (M = 16, N = 28672: 224 tiles = 132 + 92 blocks); stream-K would even
          them out. Step 17 tries both, and measured slower: its in-kernel adds run on one SM
          per tile. At M = 16 a 64-row tile computes 75% zero rows (free while memory-bound),
          and at large M 128 x 128 blocks read more from L2 per flop than step 13's pairs.
          The narrow tiles came from ncu (KERNEL_LOG): the split GEMM ran within 1-8% of cuBLAS
          at 1-128 x 4096 x 4096, the second kernel was the loss (3.7-6.5 us alone), and cuBLAS
          splits nothing there: 64-wide tiles, 48-128 blocks, one launch. At M <= 16 and a long
          K they lost (1 x 4096 x 4096: 23.3 us in one kernel against 16.1 + 4.1 split, where
          64 x 4096 x 4096 took 17.2 in the same 64 blocks): most of each 64-row box of A was
          zero-filled by the copy engine. So A's boxes now hold only the rows that exist; the
          tile's other rows of shared memory are never written, and the accumulator rows they
          feed are never stored (a row of out depends on its row of A alone).
Limits:   each of A and B needs one unit stride (row- or column-major; the dispatcher copies
          others). An operand the copy engine cannot read as it is (a leading stride that is not
          a multiple of 8 elements, or a start off 16 bytes: an odd K or N) is first copied into
          16-byte-aligned rows in the workspace by the step's own repack kernel, inside the step's
          time: one read and one write of that operand. The step is meant for problems of at most
          two waves of 128 x 128 output tiles on 132 SMs (`output_tiles <= 264`): larger ones are
          refused before launch and left to steps 9-13. M, N, K < 2^31.
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
constexpr int kGroupM = 8;           // tile order for L2 reuse when M is large and S = 1
constexpr int kMinSliceTiles = 4;    // a slice shorter than this spends more on fill + epilogue than on loads
constexpr int kMaxSplit = 16;        // bounds the partials' traffic (2 x S x M x N x 4 bytes)
static_assert(int64_t(kMaxSplit) << 25 <= INT_MAX, "k_tiles (<= 2^25) x slice stays an int");
// One block per SM with as many stages as fit: at small M the block is a stream of B, and its
// loads in flight are what sets the bandwidth. Two blocks of half the stages each measured within
// 3% at N = 4096 and 4-15% slower at M = 16, N = 28672 and M = 128, N = 14336 (H100, development).
constexpr int kReduceThreads = 256;

__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
// Waits until the grids this one depends on have completed and their stores are visible (a no-op
// when it was launched without a programmatic dependency).
__device__ __forceinline__ void wait_for_prerequisites() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// One warpgroup's 64 x kN fp32 accumulators (layout in hopper.cuh) to rows m0.., columns n0.. of
// a row-major M x N float slice, masked at the tails; float2 stores when N is even (then every
// row start and every even column is 8-byte aligned: the slice base is 256-byte aligned). A
// warp's store covers 8 rows x 32 contiguous bytes: whole sectors.
template <int kN>
__device__ __forceinline__ void store_partials(const float (&d)[kN / 2], float* slice, int M, int N, int m0, int n0) {
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  const bool pairs = N % 2 == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m0 + 16 * warp + lane / 4 + 8 * h;
    if (m >= M) continue;
    float* row = slice + int64_t(m) * N;  // int64: m * N passes 2^31 for big outputs
#pragma unroll
    for (int c = 0; c < kN / 8; ++c) {
      const int n = n0 + 8 * c + 2 * (lane % 4);
      const float v0 = d[4 * c + 2 * h], v1 = d[4 * c + 2 * h + 1];
      if (pairs && n + 1 < N) {
        *reinterpret_cast<float2*>(row + n) = make_float2(v0, v1);
      } else {
        if (n < N) row[n] = v0;
        if (n + 1 < N) row[n + 1] = v1;
      }
    }
  }
}

// d (64 x 64 fp32) += A (64 x 16) * B (16 x 64) from shared memory: wgmma.m64n64k16, the narrow
// tiles' instruction (hopper.cuh's wgmma instantiates the 128-256 wide ones the other steps use).
// Accumulator layout as hopper.cuh's: d[4c + 2h + e] is row 16w + l/4 + 8h, column 8c + 2(l % 4) + e.
template <typename T, bool kTransA, bool kTransB>
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
#define ROSETTA_WGMMA_N64(TY)                                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                               \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " "                                  \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "         \
               "%32, %33, p, 1, 1, %35, %36;\n}\n"                                                         \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),         \
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),     \
                 "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),  \
                 "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),  \
                 "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                          \
               : "l"(desc_a), "l"(desc_b), "r"(1), "n"(int(kTransA)), "n"(int(kTransB)))
  if constexpr (std::is_same_v<T, __half>) ROSETTA_WGMMA_N64("f16");
  else ROSETTA_WGMMA_N64("bf16");
#undef ROSETTA_WGMMA_N64
}

// out (or, with partials, slice blockIdx.y of them) = the k-slice blockIdx.y of tile blockIdx.x,
// a tile of 64 x kConsumers rows and kTileN columns.
template <typename T, int kConsumers, int kTileN, bool kMnMajorA, bool kMnMajorB>
__global__ void __launch_bounds__(Config<kConsumers, kTileN>::kThreads, 1)
    matmul_split_k(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                   T* __restrict__ out, float* __restrict__ partials, int64_t slice_stride, int M, int N, int K,
                   bool pairs, uint32_t stage_bytes) {
  using C = Config<kConsumers, kTileN>;
  using TileA = sm90::OperandTile<C::kBM, kMnMajorA>;
  using TileB = sm90::OperandTile<kTileN, kMnMajorB>;
  extern __shared__ unsigned char smem_raw[];
  // Tiles on 1024-byte boundaries (the swizzle atom): round the dynamic shared base up.
  unsigned char* const smem = smem_raw + (1024 - sm90::smem_u32(smem_raw) % 1024) % 1024;
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + C::kStages * C::kStageBytes);
  uint64_t* const empty = full + C::kStages;
  auto tile_a = [&](int s) { return smem + s * C::kStageBytes; };
  auto tile_b = [&](int s) { return smem + s * C::kStageBytes + C::kBytesA; };

  int tm, tn;
  rosetta::tile_coords<kGroupM>(blockIdx.x, (M + C::kBM - 1) / C::kBM, (N + kTileN - 1) / kTileN, tm, tn);
  const int m0 = tm * C::kBM, n0 = tn * kTileN;
  // This block's k-tiles: slices as even as integers allow (lengths differ by at most one, and
  // the launcher's S <= k_tiles / kMinSliceTiles keeps every slice non-empty). 32-bit products:
  // k_tiles <= 2^25 and S <= kMaxSplit.
  const int k_tiles = (K + kBK - 1) / kBK, slice = blockIdx.y, slices = gridDim.y;
  const int k_first = k_tiles * slice / slices;
  const int steps = k_tiles * (slice + 1) / slices - k_first;

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      sm90::mbarrier_init(&full[s], 1);            // the producer's expect_tx, then the bytes
      sm90::mbarrier_init(&empty[s], kConsumers);  // one arrival per consumer warpgroup
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on the roles only meet at mbarriers

  const int wg = threadIdx.x / 128;
  if (wg == kConsumers) {  // the producer warp; one thread issues every copy
    if (threadIdx.x % 32 == 0) {
      for (int i = 0; i < steps; ++i) {
        const int s = i % C::kStages;
        // Fill f = i / kStages of stage s waits for the consumers' release of fill f - 1
        // (parity (f - 1) % 2; for f = 0 the fresh barrier's parity-1 phase counts as done).
        sm90::mbarrier_wait(&empty[s], (i / C::kStages + 1) % 2);
        // The engine credits whole boxes, out-of-bounds rows and columns included (zero-filled):
        // a ragged tile, or a 64-row box wholly past M, still lands exactly stage_bytes (kStageBytes,
        // less the rows of A's stage that a box of M < 64 rows leaves unwritten).
        sm90::mbarrier_arrive_expect_tx(&full[s], stage_bytes);
        TileA::load(&map_a, tile_a(s), &full[s], m0, (k_first + i) * kBK);
        TileB::load(&map_b, tile_b(s), &full[s], n0, (k_first + i) * kBK);
      }
    }
    return;  // the copies in flight complete on the barriers; the consumers keep the block alive
  }

  // At M < 64, rows M.. of A's stages hold whatever shared memory held (A's box is M rows): the
  // products of those rows land in accumulator rows >= M, which the stores below mask off.
  const int row0 = 64 * wg;
  float d[kTileN / 2] = {};
  for (int i = 0; i < steps; ++i) {
    const int s = i % C::kStages;
    sm90::mbarrier_wait(&full[s], (i / C::kStages) % 2);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint64_t desc_a = TileA::descriptor(tile_a(s), row0, kk), desc_b = TileB::descriptor(tile_b(s), 0, kk);
      if constexpr (kTileN == 64) wgmma_n64<T, kMnMajorA, kMnMajorB>(d, desc_a, desc_b);
      else sm90::wgmma<T, kTileN, kMnMajorA, kMnMajorB>(d, desc_a, desc_b);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<1>();  // step i - 1's group has read its stage: hand it back to the producer
    if (i >= 1 && threadIdx.x % 128 == 0) sm90::mbarrier_arrive(&empty[(i - 1) % C::kStages]);
  }
  sm90::wgmma_wait<0>();
  sm90::fence_accumulators(d);

  if (partials == nullptr) {
    sm90::store_accumulators<T, kTileN>(d, out, M, N, m0 + row0, n0, pairs);
    return;
  }
  // Only placement: the reduction's blocks may now be put on SMs as ours leave. Its
  // griddepcontrol.wait still waits for this whole grid to finish and its stores to be visible.
  launch_dependents();
  store_partials<kTileN>(d, partials + slice * slice_stride, M, N, m0 + row0, n0);
}

// out[i] = sum over z = 0 .. slices - 1, in that order, of partials[z * slice_stride + i], for 4
// consecutive i a thread: 16-byte loads (slice_stride and the base keep them aligned), one 8-byte
// store where out allows (vec), element by element at the tail. The fixed order makes the
// result independent of which GEMM block finished first.
template <typename T>
__global__ void __launch_bounds__(kReduceThreads)
    sum_slices(const float* __restrict__ partials, int64_t slice_stride, int slices, T* __restrict__ out,
               int64_t count, bool vec) {
  wait_for_prerequisites();  // launched while the GEMM may still run: its partials must be complete
  const int64_t i = (int64_t(blockIdx.x) * kReduceThreads + threadIdx.x) * 4;
  if (i >= count) return;
  if (i + 3 < count) {
    float4 acc = *reinterpret_cast<const float4*>(partials + i);
#pragma unroll 4
    for (int z = 1; z < slices; ++z) {
      const float4 v = *reinterpret_cast<const float4*>(partials + z * slice_stride + i);
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    const T r[4] = {rosetta::from_float<T>(acc.x), rosetta::from_float<T>(acc.y), rosetta::from_float<T>(acc.z),
                    rosetta::from_float<T>(acc.w)};
    if (vec) {
      *reinterpret_cast<uint2*>(out + i) = *reinterpret_cast<const uint2*>(r);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) out[i + j] = r[j];
    }
    return;
  }
  for (int64_t e = i; e < count; ++e) {  // the last 1-3 elements: never read past the written ones
    float acc = partials[e];
    for (int z = 1; z < slices; ++z) acc += partials[z * slice_stride + e];
    out[e] = rosetta::from_float<T>(acc);
  }
}

// The split: about one block per SM (S = round(SMs / tiles)), within one wave of resident blocks,
// slices of >= kMinSliceTiles k-tiles, at most kMaxSplit. More blocks than SMs only add partials:
// targeting two blocks per SM measured slower at every shape tried (H100, development: up to 16%
// at M = 128, N = 4096).
int choose_split(int64_t tiles, int64_t k_tiles, int64_t resident) {
  const int64_t sms = rosetta::sm_count();
  int64_t split = (sms + tiles / 2) / tiles;
  split = std::min({split, resident / tiles, k_tiles / kMinSliceTiles, int64_t(kMaxSplit)});
  return int(std::max<int64_t>(split, 1));
}

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) once per device: the attribute
// stays set, and the driver call is a measurable part of a small launch's host time.
template <auto kKernel, int kBytes>
cudaError_t allow_shared_memory() {
  static bool allowed[64] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (allowed[device]) return cudaSuccess;
  const cudaError_t status = cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
  allowed[device] = status == cudaSuccess;
  return status;
}

// The tile of a launch: 64 rows while M fits one (a 128-row tile at M <= 64 would load and multiply
// zero rows for nothing; above, 128 rows halve the times each B tile is read from L2 per row of
// out), 128 columns, split along K by choose_split. Where that split would be more than one slice,
// 64-column tiles with no split take its place if they alone make kMinNarrowBlocks to one wave of
// blocks (64 rows, or 128 where 64-row tiles would pass a wave) and K is short enough: one launch,
// no partials, as cuBLAS runs these shapes. The narrow blocks are fewer than the split's and each
// streams all of K, so their loss grows with K while the split's (its partials, a second launch) is
// about fixed: narrow 64-row tiles measured slower from K = 14336 (64 and 128 x 14336 x 4096: 50.4
// and 51.7 us against 46.9 and 49.5 split), 128-row ones from K = 4096 (256 x 4096 x 4096: 25.2
// against 24.0; two consumers of m64n64 tiles at M = 256 are near compute-bound). Every config
// holds one block an SM (its stages fill the shared memory).
struct Tile {
  int consumers, cols;
};
constexpr int kMinNarrowBlocks = 48;   // cuBLAS's smallest grid at these shapes (1 x 768 x 3072, ncu)
constexpr int kMaxNarrowKTiles = 64;   // K <= 4096 for 64-row narrow tiles, half that for 128-row ones

Tile choose_tile(int64_t M, int64_t N, int64_t K) {
  const int64_t sms = rosetta::sm_count(), k_tiles = rosetta::ceil_div(K, int64_t(kBK));
  const int consumers = M <= 64 ? 1 : 2;
  const int64_t wide = rosetta::ceil_div(M, int64_t(64 * consumers)) * rosetta::ceil_div(N, int64_t(kBN));
  if (choose_split(wide, k_tiles, sms) == 1) return {consumers, kBN};
  for (const int rows : {1, 2}) {
    const int64_t narrow = rosetta::ceil_div(M, int64_t(64 * rows)) * rosetta::ceil_div(N, int64_t(64));
    if (narrow >= kMinNarrowBlocks && narrow <= sms && k_tiles <= kMaxNarrowKTiles / rows) return {rows, 64};
  }
  return {consumers, kBN};
}

template <typename T, int kConsumers, int kTileN, bool kMnA, bool kMnB>
cudaError_t launch(const sm90::TmaOperand& a, const sm90::TmaOperand& b, const rosetta::MatmulArgs& args, int M,
                   int N, int K, int a_box_rows, cudaStream_t stream) {
  using C = Config<kConsumers, kTileN>;
  // A K-major box of a_box_rows rows lands that many 128-byte rows; an MN-major one is always whole.
  const uint32_t stage_bytes = (a.mn_major ? C::kBytesA : a_box_rows * kBK * 2) + C::kBytesB;
  constexpr auto kernel = matmul_split_k<T, kConsumers, kTileN, kMnA, kMnB>;
  if (const cudaError_t status = allow_shared_memory<kernel, C::kSmemBytes>(); status != cudaSuccess) return status;
  static const int per_sm = [&] {  // blocks resident per SM: 1 by design, read rather than assumed
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, C::kThreads, C::kSmemBytes);
    return std::max(n, 1);
  }();
  const int64_t tiles = rosetta::ceil_div(M, C::kBM) * rosetta::ceil_div(N, kTileN);
  if (tiles > INT_MAX) return cudaErrorInvalidValue;
  const int split = kTileN == kBN  // narrow tiles were chosen not to split
                        ? choose_split(tiles, rosetta::ceil_div(K, kBK), int64_t(per_sm) * rosetta::sm_count())
                        : 1;
  T* const out = args.out.ptr<T>();
  const bool pairs = N % 2 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  const dim3 grid{unsigned(tiles), unsigned(split)};
  if (split == 1) {
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a.map, b.map, out, nullptr, 0, M, N, K, pairs, stage_bytes);
    return cudaSuccess;  // launch errors: the caller's cudaGetLastError
  }
  // Slices 64 floats (256 bytes) apart at least: every slice starts on a sector and 16-byte vectors
  // of the reduction never straddle two of them.
  const int64_t count = int64_t(M) * N;
  const int64_t slice_stride = rosetta::ceil_div(count, 64) * 64;
  float* const partials = args.workspace.get<float>(split * slice_stride);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(a.map, b.map, out, partials, slice_stride, M, N, K, pairs,
                                                       stage_bytes);

  // Programmatic dependent launch: the reduction may be scheduled before the GEMM grid has
  // finished (its blocks wait in griddepcontrol.wait), which hides its launch latency.
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(rosetta::ceil_div(rosetta::ceil_div(count, 4), kReduceThreads)));
  config.blockDim = dim3(kReduceThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const bool vec = reinterpret_cast<uintptr_t>(out) % 8 == 0;  // 4 x 16-bit stores as one 8-byte store
  return cudaLaunchKernelEx(&config, sum_slices<T>, static_cast<const float*>(partials), slice_stride, split, out,
                            count, vec);
}

}  // namespace

cudaError_t matmul_14_split_k(const rosetta::MatmulArgs& args, cudaStream_t stream) {
  return sm90::tc_matmul_launch(args, stream, [&](auto tag, int M, int N, int K) {
    using T = decltype(tag);
    const Tile tile = choose_tile(M, N, K);
    // A's boxes hold the rows that exist: at M < 64 a K-major box of M rows, the rest of the tile's
    // 64 rows in shared memory never written (see matmul_split_k).
    const int a_box_rows = std::min(M, 64 * tile.consumers);
    sm90::TmaOperand a, b;
    if (!rosetta::split_k::tma_operands<T>(a, b, args, a_box_rows, stream, tile.cols)) return cudaErrorInvalidValue;
    cudaError_t status = cudaSuccess;
    sm90::with_majors(a.mn_major, b.mn_major, [&](auto mn_a, auto mn_b) {
      if (tile.cols == 64)
        status = tile.consumers == 1 ? launch<T, 1, 64, mn_a, mn_b>(a, b, args, M, N, K, a_box_rows, stream)
                                     : launch<T, 2, 64, mn_a, mn_b>(a, b, args, M, N, K, a_box_rows, stream);
      else
        status = tile.consumers == 1 ? launch<T, 1, kBN, mn_a, mn_b>(a, b, args, M, N, K, a_box_rows, stream)
                                     : launch<T, 2, kBN, mn_a, mn_b>(a, b, args, M, N, K, a_box_rows, stream);
    });
    return status;
  });
}
