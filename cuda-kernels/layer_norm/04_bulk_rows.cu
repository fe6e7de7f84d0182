/*
Step 4 — rows streamed into a shared-memory ring by the copy engine
Changed:  no thread loads x or dy any more. Each persistent CTA owns a contiguous chunk of rows
          and a ring of kStages row buffers in shared memory; thread 0 fills a buffer with one
          bulk copy per tensor (cp.async.bulk global -> shared, completing a transaction on the
          buffer's mbarrier) kStages rows ahead of the row being reduced, and refills it right
          after that row's one barrier (the exchange of the row's sums, which every thread
          reaches only once it has read the buffer). Threads wait on the buffer's barrier, read
          their 16-byte vectors from shared memory, reduce and store as step 3 does (same tiles,
          same shifted sums, same dx formula, dweight and dbias partial rows summed by the same
          dependent kernel). Rows that do not start on 16 bytes are copied as the 16-byte-aligned
          window around them and read at their offset in it (element by element). The weight and
          bias are read once per CTA into registers.
Why:      step 3 keeps one row ahead in registers: a 256 x 16 bf16 backward tile holds x's and
          dy's next row, 64 bytes a thread, 32 KB an SM at its two CTAs. At ~3 TB/s and ~1.5 us of
          loaded DRAM latency an SM needs ~35 KB in flight, and it has that only while no thread
          is between its barrier and its stores. The measured cost: layer_norm's backward at
          4096^2 runs at 2,158 GB/s against the copy's ~3,000. The copy engine needs no
          registers: kStages = 4 rows of x and dy (64 KB a CTA at 4,096 bf16 columns, two CTAs an
          SM) stay in flight through every barrier. Predicted (bf16, GB/s): backward 4096^2
          2,158 -> ~2,700, 16384x8192 and 32768x4096 2,500-2,614 -> ~2,800; forward 4096^2
          2,897 -> ~2,950 (step 3's forward already had most of its bytes in flight).
Still:    the copy of a row lands whole before any thread starts on it; the first kStages rows of
          each chunk are the pipeline's fill. Rows past 8,192 columns (the clusters of step 3)
          and rows of 1,024 or fewer (a warp a row there) are not this step's.
Limits:   1,025 <= cols <= 8,192, refused before launch otherwise (`Min:`, `Max:`). Workspace
          (backward): 2 x CTAs x cols fp32.
Layout:   rows
Min:      cols >= 1025
Max:      cols <= 8192
*/
#include "hopper.cuh"
#include "norm_long.cuh"

namespace {

namespace nm = rosetta::norm;
namespace sm90 = rosetta::sm90;
using nm::Tile;
using rosetta::aligned16;
using rosetta::Vec16;

// A row's buffer holds the tile's kThreads x kElems values plus two 16-byte groups of slack: an
// unaligned row is copied as the aligned window around it (up to V - 1 elements before, the
// rest of its last group after).
template <typename T, int kThreads, int kElems> constexpr int kBufferElems = kThreads * kElems + 2 * nm::kVec<T>;
// Rows in flight: up to 4, within ~100 KB of buffers a 256-thread CTA (two an SM) or ~200 KB a
// 512-thread one (one an SM: 128 registers x 512 threads is the register file).
template <typename T, int kThreads, int kElems, int kTensors>
constexpr int kStages = [] {
  constexpr int bytes = kTensors * kBufferElems<T, kThreads, kElems> * int(sizeof(T));
  constexpr int budget = kThreads >= 512 ? 200 * 1024 : 100 * 1024;
  return budget / bytes < 2 ? 2 : budget / bytes > 4 ? 4 : budget / bytes;
}();
template <typename T, int kThreads, int kElems, int kTensors>
constexpr int kRingBytes = kStages<T, kThreads, kElems, kTensors> * kTensors * kBufferElems<T, kThreads, kElems> * int(sizeof(T));

// Where a row's copy starts (rounded down to 16 bytes), how many bytes it takes, and the row's
// first element's offset in the buffer.
template <typename T>
struct Window {
  const void* src;
  uint32_t bytes;
  int lead;
};
template <bool kWhole, typename T>
__device__ __forceinline__ Window<T> window_of(const T* row, int64_t cols) {
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
      for (int k = 0; k < Row::V; ++k) r.v[i][k] = c + k < cols ? rosetta::to_float(buffer[lead + c + k]) : 0.0f;
    }
  }
}

// The ring: kStages buffers of kTensors rows each, a transaction barrier per buffer. Row j of the
// chunk uses buffer j % kStages, phase (j / kStages) % 2.
template <typename T, int kThreads, int kElems, int kTensors>
struct Ring {
  static constexpr int kDepth = kStages<T, kThreads, kElems, kTensors>, kElemsPerBuffer = kBufferElems<T, kThreads, kElems>;
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
    for (int k = 0; k < kTensors; ++k) sm90::bulk_load(buffer(j, k), w[k].src, w[k].bytes, bar);
  }
  __device__ __forceinline__ void wait(int64_t j) const { sm90::mbarrier_wait(&full[j % kDepth], uint32_t(j / kDepth) & 1u); }
};

template <int kThreads, int kElems, typename T, int kTensors>
__device__ __forceinline__ void open_ring(const Ring<T, kThreads, kElems, kTensors>& ring) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < Ring<T, kThreads, kElems, kTensors>::kDepth; ++s) sm90::mbarrier_init(&ring.full[s], 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
}

// The row's two sums over the block: the shuffle trees side by side, then step 3's exchange
// (one barrier). Every thread gets the same bits.
template <int kThreads>
__device__ __forceinline__ float2 block_sums(float2 v, const nm::Exchange<kThreads / 32, 1, float2>& xchg, int64_t j) {
  v = make_float2(rosetta::warp_sum(v.x), rosetta::warp_sum(v.y));
  const float2* slots = xchg(v, unsigned(j));
  return make_float2(nm::slot_total<kThreads / 32>(slots, [](float2 p, int) { return p.x; }),
                     nm::slot_total<kThreads / 32>(slots, [](float2 p, int) { return p.y; }));
}

// CTA c: rows [c * chunk, min(rows, (c + 1) * chunk)), one at a time, a block per row.
template <typename T, int kThreads, int kElems, bool kWhole>
__global__ void __launch_bounds__(kThreads, kThreads >= 512 ? 1 : 2)
layer_norm_ring(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w, const T* __restrict__ b,
                T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int64_t cols,
                int64_t chunk, float eps, float inv_cols) {
  using Row = Tile<T, kThreads, kElems>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[Ring<T, kThreads, kElems, 1>::kDepth];
  __shared__ float2 inbox[2 * kThreads / 32];
  const Ring<T, kThreads, kElems, 1> ring{reinterpret_cast<T*>(smem), full};
  const nm::Exchange<kThreads / 32, 1, float2> xchg{inbox, nullptr, 0};
  const int t = threadIdx.x;
  const int64_t first = int64_t(blockIdx.x) * chunk, n = std::min(rows, first + chunk) - first;
  open_ring(ring);
  if (t == 0)
    for (int64_t j = 0; j < std::min<int64_t>(n, ring.kDepth); ++j) {
      const T* const src[1] = {x + (first + j) * x_stride};
      ring.template fill<kWhole>(j, src, cols);
    }
  const bool wvec = aligned16(w), bvec = aligned16(b);
  Vec16<T> wv[Row::kVecs], bv[Row::kVecs];  // the same every row: loaded once, kept packed
#pragma unroll
  for (int i = 0; i < Row::kVecs; ++i)
    wv[i] = nm::fetch<kWhole>(w, Row::col(i, t), cols, wvec), bv[i] = nm::fetch<kWhole>(b, Row::col(i, t), cols, bvec);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = first + j;
    const T* xrow = x + row * x_stride;
    const int lead = window_of<kWhole>(xrow, cols).lead;
    ring.wait(j);
    const T* buf = ring.buffer(j, 0);
    Row r;
    read_row<kWhole>(r, buf, lead, cols, t);
    // Step 3's one pass of two sums about k0 = the row's first element (padding left out).
    const float k0 = rosetta::to_float(buf[lead]);
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        const float d = nm::inside<kWhole, Row>(i, k, t, cols) ? r.v[i][k] - k0 : 0.0f;
        s1 += d;
        s2 = fmaf(d, d, s2);
      }
    const float2 sums = block_sums<kThreads>(make_float2(s1, s2), xchg, j);
    if (t == 0 && j + ring.kDepth < n) {  // every thread has read buffer j: refill it
      const T* const src[1] = {x + (row + ring.kDepth) * x_stride};
      ring.template fill<kWhole>(j + ring.kDepth, src, cols);
    }
    const float dm = sums.x * inv_cols, m = k0 + dm;
    const float v = fmaf(-dm, dm, sums.y * inv_cols);
    const float rs = rsqrtf((v < 0.0f ? 0.0f : v) + eps);  // NaN in, NaN row out
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) r.v[i][k] = (r.v[i][k] - m) * rs * wv[i].get(k) + bv[i].get(k);
    r.template store<kWhole>(y + row * cols, cols, t);
    if (t == 0) mean[row] = m, rstd[row] = rs;
  }
}

// CTA c: rows of its chunk as above, x's and dy's rows in the ring; dweight's and dbias's sums
// stay in registers and become CTA c's partial rows (partial[c * cols], partial[(ctas + c) * cols]).
template <typename T, int kThreads, int kElems, bool kWhole>
__global__ void __launch_bounds__(kThreads, kThreads >= 512 ? 1 : 2)
layer_norm_backward_ring(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w,
                         const float* __restrict__ mean, const float* __restrict__ rstd, const T* __restrict__ dy,
                         int64_t dy_stride, T* __restrict__ dx, float* __restrict__ partial, int64_t rows,
                         int64_t cols, int64_t chunk) {
  using Row = Tile<T, kThreads, kElems>;
  nm::allow_dependents();  // the partial-row kernel may be placed now; it waits for this grid
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[Ring<T, kThreads, kElems, 2>::kDepth];
  __shared__ float2 inbox[2 * kThreads / 32];
  const Ring<T, kThreads, kElems, 2> ring{reinterpret_cast<T*>(smem), full};
  const nm::Exchange<kThreads / 32, 1, float2> xchg{inbox, nullptr, 0};
  const int t = threadIdx.x;
  const int64_t first = int64_t(blockIdx.x) * chunk, n = std::min(rows, first + chunk) - first;
  open_ring(ring);
  if (t == 0)
    for (int64_t j = 0; j < std::min<int64_t>(n, ring.kDepth); ++j) {
      const T* const src[2] = {x + (first + j) * x_stride, dy + (first + j) * dy_stride};
      ring.template fill<kWhole>(j, src, cols);
    }
  const bool wvec = aligned16(w);
  Vec16<T> wv[Row::kVecs];
#pragma unroll
  for (int i = 0; i < Row::kVecs; ++i) wv[i] = nm::fetch<kWhole>(w, Row::col(i, t), cols, wvec);
  float dw[Row::kVecs][Row::V] = {}, db[Row::kVecs][Row::V] = {};
  float next_m = n > 0 ? mean[first] : 0.0f, next_rs = n > 0 ? rstd[first] : 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = first + j;
    const float m = next_m, rs = next_rs;
    if (j + 1 < n) next_m = mean[row + 1], next_rs = rstd[row + 1];  // in flight through this row
    const int lead_x = window_of<kWhole>(x + row * x_stride, cols).lead;
    const int lead_g = window_of<kWhole>(dy + row * dy_stride, cols).lead;
    ring.wait(j);
    Row xr, gr;
    read_row<kWhole>(xr, ring.buffer(j, 0), lead_x, cols, t);
    read_row<kWhole>(gr, ring.buffer(j, 1), lead_g, cols, t);
    float2 sums = make_float2(0.0f, 0.0f);  // sum of g, sum of g * xhat (step 3's formulas)
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        xr.v[i][k] = nm::inside<kWhole, Row>(i, k, t, cols) ? (xr.v[i][k] - m) * rs : 0.0f;
        dw[i][k] += gr.v[i][k] * xr.v[i][k];
        db[i][k] += gr.v[i][k];
        gr.v[i][k] *= wv[i].get(k);
        sums.x += gr.v[i][k];
        sums.y += gr.v[i][k] * xr.v[i][k];
      }
    sums = block_sums<kThreads>(sums, xchg, j);
    if (t == 0 && j + ring.kDepth < n) {  // every thread has read buffer j: refill it
      const T* const src[2] = {x + (row + ring.kDepth) * x_stride, dy + (row + ring.kDepth) * dy_stride};
      ring.template fill<kWhole>(j + ring.kDepth, src, cols);
    }
    const float a = -rs * (sums.y / float(cols)), b0 = -rs * (sums.x / float(cols));
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) gr.v[i][k] = fmaf(gr.v[i][k], rs, fmaf(xr.v[i][k], a, b0));
    gr.template store<kWhole>(dx + row * cols, cols, t);
  }
  nm::store_partial<kWhole, Row>(partial + int64_t(blockIdx.x) * cols, dw, t, cols);
  nm::store_partial<kWhole, Row>(partial + (int64_t(gridDim.x) + blockIdx.x) * cols, db, t, cols);
}

// Step 3's block tiles by row length (the backward's table: x, dy and two sums a thread).
template <typename T, typename F>
bool pick_ring_tile(int64_t cols, F launch) {
  if (cols <= 1024 || cols > nm::kMaxRegisterCols) return false;
  if (cols <= 2048) launch(nm::Int<256>{}, nm::Int<8>{});
  else if (cols <= 4096) launch(nm::Int<256>{}, nm::Int<16>{});
  else launch(nm::Int<512>{}, nm::Int<16>{});
  return true;
}

// A persistent grid of `kernel` with `ring_bytes` of dynamic shared memory: as many CTAs as fit
// at once, no more than rows; each a contiguous chunk. {0, rows} when none fits.
template <typename Kernel>
nm::Chunks plan_ring(Kernel kernel, int threads, int ring_bytes, int64_t rows, cudaError_t& status) {
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_bytes);
  if (status != cudaSuccess) return {rows, 0};
  int per_sm = 0;
  status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, ring_bytes);
  if (status != cudaSuccess || per_sm <= 0) return {rows, 0};
  const int64_t want = std::min<int64_t>(rows, int64_t(per_sm) * rosetta::sm_count());
  const int64_t chunk = rosetta::ceil_div(rows, want);
  return {chunk, unsigned(rosetta::ceil_div(rows, chunk))};
}

template <typename T>
bool whole_rows(const T* p, int64_t stride, int64_t cols) {
  return cols % nm::kVec<T> == 0 && nm::rows_aligned(p, stride);
}

}  // namespace

cudaError_t layer_norm_04_bulk_rows(const rosetta::LayerNormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  bool fits = true;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* w = a.weight.ptr<const T>();
    const T* b = a.bias.ptr<const T>();
    T* y = a.y.ptr<T>();
    const bool whole = whole_rows(x, a.x.stride[0], cols) && aligned16(y) && aligned16(w) && aligned16(b);
    fits = pick_ring_tile<T>(cols, [&](auto threads, auto elems) {
      constexpr int kThreads = decltype(threads)::value, kElems = decltype(elems)::value;
      constexpr int kBytes = kRingBytes<T, kThreads, kElems, 1>;
      nm::by_path(whole, [&](auto w_) {
        const auto kernel = layer_norm_ring<T, kThreads, kElems, decltype(w_)::value>;
        const nm::Chunks plan = plan_ring(kernel, kThreads, kBytes, rows, status);
        if (plan.blocks == 0) {
          if (status == cudaSuccess) status = cudaErrorInvalidConfiguration;
          return;
        }
        kernel<<<plan.blocks, kThreads, kBytes, stream>>>(x, a.x.stride[0], w, b, y, a.mean.ptr<float>(),
                                                          a.rstd.ptr<float>(), rows, cols, plan.chunk, float(a.eps),
                                                          1.0f / float(cols));
      });
    });
  });
  if (!fits) return cudaErrorInvalidValue;  // outside 1,025..8,192 columns: declared, refused before launch
  return status != cudaSuccess ? status : launched;
}

cudaError_t layer_norm_04_bulk_rows_backward(const rosetta::LayerNormBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (cols == 0) return cudaSuccess;
  if (rows == 0) {  // sums over no rows
    const cudaError_t e = nm::zero(a.dweight, stream);
    return e != cudaSuccess ? e : nm::zero(a.dbias, stream);
  }
  cudaError_t status = cudaSuccess;
  bool fits = true;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* dy = a.dy.ptr<const T>();
    const T* w = a.weight.ptr<const T>();
    T* dx = a.dx.ptr<T>();
    const bool whole = whole_rows(x, a.x.stride[0], cols) && whole_rows(dy, a.dy.stride[0], cols) &&
                       aligned16(dx) && aligned16(w);
    fits = pick_ring_tile<T>(cols, [&](auto threads, auto elems) {
      constexpr int kThreads = decltype(threads)::value, kElems = decltype(elems)::value;
      constexpr int kBytes = kRingBytes<T, kThreads, kElems, 2>;
      nm::by_path(whole, [&](auto w_) {
        const auto kernel = layer_norm_backward_ring<T, kThreads, kElems, decltype(w_)::value>;
        const nm::Chunks plan = plan_ring(kernel, kThreads, kBytes, rows, status);
        if (plan.blocks == 0) {
          if (status == cudaSuccess) status = cudaErrorInvalidConfiguration;
          return;
        }
        float* partial = a.workspace.get<float>(2 * int64_t(plan.blocks) * cols);  // dweight's rows, then dbias's
        kernel<<<plan.blocks, kThreads, kBytes, stream>>>(x, a.x.stride[0], w, a.mean.ptr<const float>(),
                                                          a.rstd.ptr<const float>(), dy, a.dy.stride[0], dx, partial,
                                                          rows, cols, plan.chunk);
        status = cudaGetLastError();
        if (status == cudaSuccess)
          status = nm::launch_sum_partials<T, 2>(partial, plan.blocks, cols, a.dweight.ptr<T>(), a.dbias.ptr<T>(),
                                                 stream);
      });
    });
  });
  if (!fits) return cudaErrorInvalidValue;  // outside 1,025..8,192 columns: declared, refused before launch
  return status != cudaSuccess ? status : launched;
}
