/*
Step 4 — rows streamed into a shared-memory ring by the copy engine, long rows across a cluster
Changed:  layer_norm step 4's idea (norm_ring.cuh): x's (and dy's) rows are no longer loaded by
          threads. Each persistent CTA owns a contiguous chunk of rows and a ring of row buffers
          in shared memory; thread 0 fills a buffer with one bulk copy per tensor
          (cp.async.bulk, completing on the buffer's mbarrier) up to 4 rows ahead, and refills it
          right after the row's one barrier. Threads read their vectors from shared memory and
          reduce, scale and store as step 3 does (same tiles and formulas; dweight's partial rows
          summed by the same dependent kernel). Unaligned rows are copied as their 16-byte-aligned
          window. The weight is read once per CTA into registers. A CTA with a ring of 64 KB or
          more runs alone on its SM (as layer_norm step 4: 128 partial rows at 4096^2 bf16, not
          256). Past 8,192 columns, step 3's clusters, each CTA ringing its 8,192-column slice
          (as layer_norm step 4).
Why:      step 3 has one row ahead in registers (bf16 backward 256 x 16 tile: 64 bytes a thread,
          32 KB an SM at two CTAs), short of the ~35 KB an SM needs in flight at ~3 TB/s, and
          only while no thread is between its barrier and its stores. layer_norm's step 4 measured
          +7-12% on the same tiles' backward (4096^2 2,153 -> 2,405 GB/s, 32768x4096 2,615 ->
          2,794), and slower forwards. Predicted (bf16, GB/s): backward 4096^2 2,629 -> ~2,800,
          16384x8192 and 32768x4096 2,868 -> ~2,950; forward 2,930-2,960 -> about the same or a
          few percent slower, as layer_norm's. Clusters: 4096 x 32768 backward 2,764 -> ~2,800.
Still:    measured, this gains nothing here (bf16 backward 4096^2 2,621 -> 2,617 GB/s, 16384x8192
          2,853 -> 2,828; forwards 3-8% slower): rms_norm's step 3 already reached the ~2,800-2,830
          that both ops' rings top out at, its loop being short enough that registers never
          capped its rows in flight. On clusters it loses (4096 x 32768 backward 2,764 -> 2,575,
          forward 2,863 -> 2,618): step 3 moved 23 GB/s an SM on the 120 SMs that clusters of 4
          fit, a ring ~21. Kept for that lesson. One CTA an SM: backward 4096^2 2,611 -> 2,630
          GB/s, fp32 2,750 -> 2,768 (runs 8d5086c82d25, 3113cf739b37): RMSNorm's one partial row
          a CTA was half layer_norm's to save. The clusters' backward ring keeps 6 rows since
          (layer_norm step 4): 4096 x 32768 2,557 -> 2,684, still below step 3's loop there
          (runs 3113cf739b37, aeb7dde80dae). As layer_norm step 4: a copy lands whole before
          the row starts, each chunk's first rows are the fill; rows of 1,024 or fewer are not
          this step's.
Limits:   1,025 <= cols <= 65,536, refused before launch otherwise (`Min:`, `Max:`). Workspace
          (backward): groups x cols fp32, a group a CTA or a cluster.
Layout:   rows
Min:      cols >= 1025
Max:      cols <= 65536
*/
#include "norm_ring.cuh"

namespace {

namespace nm = rosetta::norm;
using nm::Tile;
using rosetta::aligned16;
using rosetta::Vec16;

// Group c (a CTA, or a cluster of kRanks whose CTA r holds the row's slice [8192 r, 8192 (r + 1))):
// rows [c * chunk, min(rows, (c + 1) * chunk)), one at a time.
template <typename T, int kThreads, int kElems, int kRanks, bool kWhole>
__global__ void __launch_bounds__(kThreads, kThreads >= 512 ? 1 : 2)
rms_norm_ring(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w, T* __restrict__ y,
              float* __restrict__ rstd, int64_t rows, int64_t cols, int64_t chunk, float eps) {
  using Row = Tile<T, kThreads, kElems>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[nm::Ring<T, kThreads, kElems, 1>::kDepth];
  __shared__ float2 inbox[2 * kThreads / 32 * kRanks];
  __shared__ __align__(8) uint64_t bars[2];
  const int rank = kRanks > 1 ? nm::cluster_rank() : 0;
  const nm::Ring<T, kThreads, kElems, 1> ring{reinterpret_cast<T*>(smem), full};
  const nm::Exchange<kThreads / 32, kRanks, float2> xchg{inbox, bars, rank};
  const int t = threadIdx.x;
  // this CTA's slice: what is left of the row from its start (n), and what its copies take (len)
  const int64_t start = int64_t(rank) * kThreads * kElems, n = cols - start;
  const int64_t len = std::min<int64_t>(n, kThreads * kElems);
  const int64_t first = int64_t(blockIdx.x / kRanks) * chunk, count = std::min(rows, first + chunk) - first;
  xchg.open();
  nm::open_ring(ring);
  const auto rows_of = [&](int64_t j) {  // chunk row j's slice of x
    return typename decltype(ring)::Sources{{x + (first + j) * x_stride + start}};
  };
  ring.template prime<kWhole>(count, rows_of, len);
  const bool wvec = aligned16(w);
  Vec16<T> wv[Row::kVecs];  // the same every row: loaded once, kept packed
#pragma unroll
  for (int i = 0; i < Row::kVecs; ++i) wv[i] = nm::fetch<kWhole>(w + start, Row::col(i, t), n, wvec);
  if constexpr (kRanks > 1) nm::cluster_wait();  // every peer has started: its barriers exist
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = first + j;
    const int lead = nm::window_of<kWhole>(x + row * x_stride + start, len).lead;
    ring.wait(j);
    Row r;
    nm::read_row<kWhole>(r, ring.buffer(j, 0), lead, n, t);
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) ss += r.v[i][k] * r.v[i][k];  // padding: 0
    const float total = nm::block_sums<kThreads, kRanks>(make_float2(ss, 0.0f), xchg, j).x;
    ring.template refill<kWhole>(j, count, rows_of, len);  // every thread has read buffer j
    const float s = rsqrtf(total / float(cols) + eps);  // NaN in, NaN row out
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) r.v[i][k] = r.v[i][k] * s * wv[i].get(k);
    r.template store<kWhole>(y + row * cols + start, n, t);
    if (t == 0 && rank == 0) rstd[row] = s;
  }
}

// Group c (a CTA or a cluster, as above): rows of its chunk, x's and dy's slices in the ring;
// dweight's sums stay in registers and become group c's partial row partial[c * cols] (each CTA
// its slice).
template <typename T, int kThreads, int kElems, int kRanks, bool kWhole>
__global__ void __launch_bounds__(kThreads, kThreads >= 512 ? 1 : 2)
rms_norm_backward_ring(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w,
                       const float* __restrict__ rstd, const T* __restrict__ dy, int64_t dy_stride,
                       T* __restrict__ dx, float* __restrict__ partial, int64_t rows, int64_t cols, int64_t chunk,
                       float inv_cols) {
  using Row = Tile<T, kThreads, kElems>;
  nm::allow_dependents();  // the partial-row kernel may be placed now; it waits for this grid
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[nm::Ring<T, kThreads, kElems, 2, kRanks>::kDepth];
  __shared__ float2 inbox[2 * kThreads / 32 * kRanks];
  __shared__ __align__(8) uint64_t bars[2];
  const int rank = kRanks > 1 ? nm::cluster_rank() : 0;
  const nm::Ring<T, kThreads, kElems, 2, kRanks> ring{reinterpret_cast<T*>(smem), full};
  const nm::Exchange<kThreads / 32, kRanks, float2> xchg{inbox, bars, rank};
  const int t = threadIdx.x;
  const int64_t start = int64_t(rank) * kThreads * kElems, n = cols - start;
  const int64_t len = std::min<int64_t>(n, kThreads * kElems);
  const int64_t group = blockIdx.x / kRanks;
  const int64_t first = group * chunk, count = std::min(rows, first + chunk) - first;
  xchg.open();
  nm::open_ring(ring);
  const auto rows_of = [&](int64_t j) {  // chunk row j's slices of x and dy
    return typename decltype(ring)::Sources{{x + (first + j) * x_stride + start, dy + (first + j) * dy_stride + start}};
  };
  ring.template prime<kWhole>(count, rows_of, len);
  const bool wvec = aligned16(w);
  Vec16<T> wv[Row::kVecs];
#pragma unroll
  for (int i = 0; i < Row::kVecs; ++i) wv[i] = nm::fetch<kWhole>(w + start, Row::col(i, t), n, wvec);
  float dw[Row::kVecs][Row::V] = {};
  float next_s = count > 0 ? rstd[first] : 0.0f;
  if constexpr (kRanks > 1) nm::cluster_wait();  // every peer has started: its barriers exist
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = first + j;
    const float s = next_s;
    if (j + 1 < count) next_s = rstd[row + 1];  // in flight through this row
    const int lead_x = nm::window_of<kWhole>(x + row * x_stride + start, len).lead;
    const int lead_g = nm::window_of<kWhole>(dy + row * dy_stride + start, len).lead;
    ring.wait(j);
    Row xr, gr;
    nm::read_row<kWhole>(xr, ring.buffer(j, 0), lead_x, n, t);
    nm::read_row<kWhole>(gr, ring.buffer(j, 1), lead_g, n, t);
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        dw[i][k] += gr.v[i][k] * xr.v[i][k] * s;  // padding: 0 * 0
        gr.v[i][k] *= wv[i].get(k);               // g = dy * w
        dot += gr.v[i][k] * xr.v[i][k];
      }
    const float c = s * s * inv_cols * nm::block_sums<kThreads, kRanks>(make_float2(dot, 0.0f), xchg, j).x;
    ring.template refill<kWhole>(j, count, rows_of, len);  // every thread has read buffer j
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) gr.v[i][k] = s * (gr.v[i][k] - xr.v[i][k] * c);
    gr.template store<kWhole>(dx + row * cols + start, n, t);
  }
  nm::store_partial<kWhole, Row>(partial + group * cols + start, dw, t, n);
}

}  // namespace

cudaError_t rms_norm_04_bulk_rows(const rosetta::RmsNormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  bool fits = true;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* w = a.weight.ptr<const T>();
    T* y = a.y.ptr<T>();
    const bool whole = nm::whole_rows(x, a.x.stride[0], cols) && aligned16(y) && aligned16(w);
    fits = nm::pick_ring_tile<T>(cols, [&](auto threads, auto elems, auto ranks) {
      constexpr int kThreads = decltype(threads)::value, kElems = decltype(elems)::value;
      constexpr int kRanks = decltype(ranks)::value;
      constexpr int kBytes = nm::kRingBytes<T, kThreads, kElems, 1>;
      nm::by_path(whole, [&](auto w_) {
        const auto kernel = rms_norm_ring<T, kThreads, kElems, kRanks, decltype(w_)::value>;
        const nm::Chunks plan = nm::plan_ring(kernel, kThreads, kRanks, kBytes, rows, stream, status);
        if (plan.blocks == 0) {
          if (status == cudaSuccess) status = cudaErrorInvalidConfiguration;
          return;
        }
        status = nm::launch_groups(kernel, plan.blocks, kRanks, kThreads, kBytes, stream, x, a.x.stride[0], w, y,
                                   a.rstd.ptr<float>(), rows, cols, plan.chunk, float(a.eps));
      });
    });
  });
  if (!fits) return cudaErrorInvalidValue;  // outside 1,025..65,536 columns: declared, refused before launch
  return status != cudaSuccess ? status : launched;
}

cudaError_t rms_norm_04_bulk_rows_backward(const rosetta::RmsNormBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (cols == 0) return cudaSuccess;
  if (rows == 0) return nm::zero(a.dweight, stream);  // a sum over no rows
  cudaError_t status = cudaSuccess;
  bool fits = true;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* dy = a.dy.ptr<const T>();
    const T* w = a.weight.ptr<const T>();
    T* dx = a.dx.ptr<T>();
    const bool whole = nm::whole_rows(x, a.x.stride[0], cols) && nm::whole_rows(dy, a.dy.stride[0], cols) &&
                       aligned16(dx) && aligned16(w);
    fits = nm::pick_ring_tile<T>(cols, [&](auto threads, auto elems, auto ranks) {
      constexpr int kThreads = decltype(threads)::value, kElems = decltype(elems)::value;
      constexpr int kRanks = decltype(ranks)::value;
      constexpr int kBytes = nm::kRingBytes<T, kThreads, kElems, 2, kRanks>;
      nm::by_path(whole, [&](auto w_) {
        const auto kernel = rms_norm_backward_ring<T, kThreads, kElems, kRanks, decltype(w_)::value>;
        const nm::Chunks plan = nm::plan_ring(kernel, kThreads, kRanks, kBytes, rows, stream, status);
        if (plan.blocks == 0) {
          if (status == cudaSuccess) status = cudaErrorInvalidConfiguration;
          return;
        }
        float* partial = a.workspace.get<float>(int64_t(plan.blocks) * cols);
        status = nm::launch_groups(kernel, plan.blocks, kRanks, kThreads, kBytes, stream, x, a.x.stride[0], w,
                                   a.rstd.ptr<const float>(), dy, a.dy.stride[0], dx, partial, rows, cols,
                                   plan.chunk, 1.0f / float(cols));
        if (status == cudaSuccess)
          status = nm::launch_sum_partials<T, 1>(partial, plan.blocks, cols, a.dweight.ptr<T>(), nullptr, stream);
      });
    });
  });
  if (!fits) return cudaErrorInvalidValue;  // outside 1,025..65,536 columns: declared, refused before launch
  return status != cudaSuccess ? status : launched;
}
