// What the norms' bulk-copy steps (rms_norm and layer_norm step 4) share: a persistent CTA's
// ring of row buffers in shared memory, filled by the copy engine (cp.async.bulk, the 1-D form
// of TMA, completing on an mbarrier) rows ahead of the row being reduced.
//   Ring, open_ring, kStages      the buffers, their barriers, how many rows are in flight
//   window_of, read_row           a row's copy (an unaligned row: its 16-byte-aligned window)
//                                 and a thread's tile of it from shared memory
//   block_sums                    a row's pair of sums over the block (or its cluster), step 3's
//                                 one barrier
//   pick_ring_tile, plan_ring     the tiles by row length, clusters past 8,192 columns; the
//                                 persistent grid (a CTA with a 64 KB ring: one an SM) and its chunks
#pragma once

#include "hopper.cuh"
#include "norm_long.cuh"

namespace rosetta::norm {

// A row's buffer holds the tile's kThreads x kElems values plus two 16-byte groups of slack: an
// unaligned row is copied as the aligned window around it (up to V - 1 elements before, the
// rest of its last group after).
template <typename T, int kThreads, int kElems> constexpr int kBufferElems = kThreads * kElems + 2 * kVec<T>;
// Rows in flight: up to 4, within ~100 KB of buffers a 256-thread CTA (two an SM) or ~200 KB a
// 512-thread one (one an SM: 128 registers x 512 threads is the register file). A cluster's
// backward ring (x and dy, 32 KB a row of 16-bit slices) keeps up to 6: every row's sums cross the
// cluster, so each CTA waits on its slowest peer once a row and needs more rows landed to cover it.
// Measured by bench/ablations/norm_04_ring (H100, bf16 backward, GB/s, 4 -> 6 rows): layer_norm 4096 x 32768
// 2,498 -> 2,632, 8192 x 16384 2,547 -> 2,640, 2048 x 65536 2,485 -> 2,624; rms_norm 2,521 -> 2,620,
// 2,508 -> 2,643, 2,425 -> 2,539. A single CTA's ring lost at 6 (16384 x 8192: 2,706 -> 2,592), and
// the clusters' forward was mixed (layer_norm 4096 x 32768 2,325 -> 2,268, rms_norm 2,518 -> 2,610).
// 7 rows (224.4 KB of buffers, nearly all a CTA may have) lost to 6: layer_norm 4096 x 32768
// backward 2,674 -> 2,533, rms_norm 2,684 -> 2,514 (development run, H100, bf16).
template <typename T, int kThreads, int kElems, int kTensors, int kRanks = 1>
constexpr int kStages = [] {
  constexpr int bytes = kTensors * kBufferElems<T, kThreads, kElems> * int(sizeof(T));
  constexpr int budget = kThreads >= 512 ? 200 * 1024 : 100 * 1024;
  constexpr int most = kRanks > 1 && kTensors == 2 ? 6 : 4;
  return budget / bytes < 2 ? 2 : budget / bytes > most ? most : budget / bytes;
}();
template <typename T, int kThreads, int kElems, int kTensors, int kRanks = 1>
constexpr int kRingBytes =
    kStages<T, kThreads, kElems, kTensors, kRanks> * kTensors * kBufferElems<T, kThreads, kElems> * int(sizeof(T));

// Where a row's copy starts (rounded down to 16 bytes), how many bytes it takes, and the row's
// first element's offset in the buffer. `cols` <= 0 (a cluster CTA whose slice starts past the
// row's end): nothing to copy.
template <typename T>
struct Window {
  const void* src;
  uint32_t bytes;
  int lead;
};
template <bool kWhole, typename T>
__device__ __forceinline__ Window<T> window_of(const T* row, int64_t cols) {
  if (cols <= 0) return {row, 0u, 0};
  if constexpr (kWhole) return {row, uint32_t(cols * int64_t(sizeof(T))), 0};
  const uintptr_t begin = reinterpret_cast<uintptr_t>(row), end = begin + uintptr_t(cols) * sizeof(T);
  const uintptr_t lo = begin & ~uintptr_t(15), hi = (end + 15) & ~uintptr_t(15);
  return {reinterpret_cast<const void*>(lo), uint32_t(hi - lo), int((begin - lo) / sizeof(T))};
}

// Thread t's tile of a row from its buffer (0 past the row's end). kWhole: the row starts the
// buffer and is whole vectors, so 16-byte shared loads; else element by element at the offset.
template <bool kWhole, typename Row, typename T>
__device__ __forceinline__ void read_row(Row& r, const T* buffer, int lead, int64_t cols, int t) {
#pragma unroll
  for (int i = 0; i < Row::kVecs; ++i) {
    const int64_t c = Row::col(i, t);
    if constexpr (kWhole) {
      Vec16<T> p;
      p.raw = c < cols ? *reinterpret_cast<const uint4*>(buffer + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int k = 0; k < Row::V; ++k) r.v[i][k] = p.get(k);
    } else {
#pragma unroll
      for (int k = 0; k < Row::V; ++k) r.v[i][k] = c + k < cols ? to_float(buffer[lead + c + k]) : 0.0f;
    }
  }
}

// The ring: kStages buffers of kTensors rows each, a transaction barrier per buffer. Row j of the
// chunk uses buffer j % kStages, phase (j / kStages) % 2. A buffer is refilled by thread 0 right
// after its row's barrier: every thread's shared loads of it were consumed before that barrier,
// and the copy engine writes only after it (the order a TMA pipeline's empty barrier gives).
template <typename T, int kThreads, int kElems, int kTensors, int kRanks = 1>
struct Ring {
  static constexpr int kDepth = kStages<T, kThreads, kElems, kTensors, kRanks>;
  static constexpr int kElemsPerBuffer = kBufferElems<T, kThreads, kElems>;
  T* buffers;
  uint64_t* full;

  __device__ __forceinline__ T* buffer(int64_t j, int tensor) const {
    return buffers + (int(j % kDepth) * kTensors + tensor) * kElemsPerBuffer;
  }
  // Thread 0: row j's copies (one per tensor, rows[k] its start), bytes announced first.
  template <bool kWhole>
  __device__ __forceinline__ void fill(int64_t j, const T* const (&rows)[kTensors], int64_t cols) const {
    uint64_t* bar = &full[j % kDepth];
    Window<T> w[kTensors];
    uint32_t bytes = 0;
#pragma unroll
    for (int k = 0; k < kTensors; ++k) w[k] = window_of<kWhole>(rows[k], cols), bytes += w[k].bytes;
    sm90::mbarrier_arrive_expect_tx(bar, bytes);
#pragma unroll
    for (int k = 0; k < kTensors; ++k)
      if (w[k].bytes > 0) sm90::bulk_load(buffer(j, k), w[k].src, w[k].bytes, bar);
  }
  __device__ __forceinline__ void wait(int64_t j) const { sm90::mbarrier_wait(&full[j % kDepth], uint32_t(j / kDepth) & 1u); }

  // Row j of the chunk, one start per tensor (x; or x and dy), as `rows_of(j)` names it.
  struct Sources {
    const T* rows[kTensors];
  };
  // Thread 0: the chunk's first rows (up to kDepth of its n) into the ring.
  template <bool kWhole, typename RowsOf>
  __device__ __forceinline__ void prime(int64_t n, RowsOf rows_of, int64_t cols) const {
    if (threadIdx.x == 0)
      for (int64_t j = 0; j < (n < kDepth ? n : kDepth); ++j) fill<kWhole>(j, rows_of(j).rows, cols);
  }
  // Thread 0, after row j's barrier (every thread has read buffer j): the buffer takes row
  // j + kDepth, if the chunk has one.
  template <bool kWhole, typename RowsOf>
  __device__ __forceinline__ void refill(int64_t j, int64_t n, RowsOf rows_of, int64_t cols) const {
    if (threadIdx.x == 0 && j + kDepth < n) fill<kWhole>(j + kDepth, rows_of(j + kDepth).rows, cols);
  }
};

template <int kThreads, int kElems, typename T, int kTensors, int kRanks>
__device__ __forceinline__ void open_ring(const Ring<T, kThreads, kElems, kTensors, kRanks>& ring) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < Ring<T, kThreads, kElems, kTensors, kRanks>::kDepth; ++s) sm90::mbarrier_init(&ring.full[s], 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
}

// The row's two sums over the block, or over the cluster of kRanks blocks that holds the row: the
// shuffle trees side by side, then step 3's exchange (one barrier, or one transaction barrier a
// cluster). Every thread of every block gets the same bits. Once it returns, every thread of this
// block has read the row's buffers (each warp sends its slot after its shuffles).
template <int kThreads, int kRanks = 1>
__device__ __forceinline__ float2 block_sums(float2 v, const Exchange<kThreads / 32, kRanks, float2>& xchg, int64_t j) {
  constexpr int kSlots = kThreads / 32 * kRanks;
  v = make_float2(warp_sum(v.x), warp_sum(v.y));
  const float2* slots = xchg(v, unsigned(j));
  return make_float2(slot_total<kSlots>(slots, [](float2 p, int) { return p.x; }),
                     slot_total<kSlots>(slots, [](float2 p, int) { return p.y; }));
}

// The block tiles of step 3 by row length (its backward table) for 1,025..8,192 columns, then its
// clusters: 2, 4 or 8 CTAs of 512 x 16, CTA r the row's slice [8192 r, 8192 (r + 1)), each with a
// ring of its slice. launch(threads, elems, ranks). False outside 1,025..65,536.
template <typename T, typename F>
bool pick_ring_tile(int64_t cols, F launch) {
  if (cols <= 1024) return false;
  if (cols > kMaxRegisterCols)
    return pick_long_tile<T, true>(cols, [](auto) {}, [](auto, auto) {},
                                   [&](auto ranks) { launch(Int<kSliceThreads>{}, Int<kSliceElems>{}, ranks); });
  if (cols <= 2048) launch(Int<256>{}, Int<8>{}, Int<1>{});
  else if (cols <= 4096) launch(Int<256>{}, Int<16>{}, Int<1>{});
  else launch(Int<512>{}, Int<16>{}, Int<1>{});
  return true;
}

// A CTA whose ring holds at least this many bytes keeps what an SM needs in flight (~35 KB at
// ~3 TB/s and ~1.5 us of loaded latency) by itself, so it runs alone on its SM: a second CTA there
// adds no bytes that matter, only its own barrier waits and, backward, a second partial row to
// write and sum (4,096 columns of bf16 x and dy: 4 x 16 KB rings; 128 partial rows at 4096^2, not
// 256; layer_norm's backward there 2,427 -> 2,578 GB/s, run 3113cf739b37). Single CTAs only:
// capping clusters below what fits placed them unevenly (rms_norm's forward at 4096 x 32768, whose
// clusters of 4 fit two 58-register CTAs an SM, measured 204 -> 270 us).
constexpr int kRingAloneBytes = 64 * 1024;

// A persistent grid of `kernel` with `ring_bytes` of dynamic shared memory a CTA: as many groups
// (CTAs, or clusters of `ranks`) as fit at once (a CTA with a ring of kRingAloneBytes or more:
// one an SM), no more than rows; each a contiguous chunk. 0 blocks (status says why, if it can)
// when none fits.
template <typename Kernel>
Chunks plan_ring(Kernel kernel, int threads, int ranks, int ring_bytes, int64_t rows, cudaStream_t stream,
                 cudaError_t& status) {
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_bytes);
  if (status != cudaSuccess) return {rows, 0};
  const Chunks plan = plan_long_chunks(kernel, threads, ranks, rows, 1, stream, size_t(ring_bytes));
  if (ranks > 1 || ring_bytes < kRingAloneBytes || int64_t(plan.blocks) <= sm_count()) return plan;
  const int64_t chunk = ceil_div(rows, sm_count());
  return {chunk, unsigned(ceil_div(rows, chunk))};
}

// Rows of whole 16-byte vectors from 16-byte-aligned starts: copied as they are, read as vectors.
template <typename T>
bool whole_rows(const T* p, int64_t stride, int64_t cols) {
  return cols % kVec<T> == 0 && rows_aligned(p, stride);
}


}  // namespace rosetta::norm
