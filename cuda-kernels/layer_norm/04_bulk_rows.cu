/*
Step 4 — rows streamed into a shared-memory ring by the copy engine, long rows across a cluster
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
          bias are read once per CTA into registers. A CTA whose ring holds 64 KB or more (the
          backward at 4,096 16-bit columns, 4,096 fp32 columns) runs alone on its SM: 132 chunks
          and partial rows at most, not 264 (norm_ring.cuh, plan_ring). Past 8,192 columns, step 3's
          clusters: CTA r of 2, 4 or 8 rings its slice [8192 r, 8192 (r + 1)) of each row, and the
          row's sums cross the cluster by step 3's exchange, whose wait also tells thread 0 the
          buffer is read.
Why:      step 3 keeps one row ahead in registers: a 256 x 16 bf16 backward tile holds x's and
          dy's next row, 64 bytes a thread, 32 KB an SM at its two CTAs. At ~3 TB/s and ~1.5 us of
          loaded DRAM latency an SM needs ~35 KB in flight, and it has that only while no thread
          is between its barrier and its stores. The measured cost: layer_norm's backward at
          4096^2 runs at 2,158 GB/s against the copy's ~3,000. The copy engine needs no
          registers: kStages = 4 rows of x and dy (64 KB a CTA at 4,096 bf16 columns, two CTAs an
          SM) stay in flight through every barrier. Predicted (bf16, GB/s): backward 4096^2
          2,158 -> ~2,700, 16384x8192 and 32768x4096 2,500-2,614 -> ~2,800; forward 4096^2
          2,897 -> ~2,950 (step 3's forward already had most of its bytes in flight). The
          clusters: step 3's backward there (one 512 x 16 CTA an SM, 116-124 registers) measured
          2,202 at 4096 x 32768 where rms_norm's step 3 took 2,764; predicted ~2,750.
Still:    the copy of a row lands whole before any thread starts on it, and the first kStages rows
          of each chunk are the pipeline's fill: at 4,096 rows that is 4 of a CTA's 32 (measured
          in development, bf16 backward: 4096^2 2,153 -> 2,405 GB/s, 16384x8192 2,498 -> 2,791,
          32768x4096 2,615 -> 2,794, at two CTAs an SM). One CTA an SM, predicted from a
          development run in turns (4096^2 backward 40.7 -> 39.7 us, 256 -> 128 partial rows and
          half the sum kernel's reads): +2.5%; measured 2,427 -> 2,578 GB/s (+6%), fp32 2,656 ->
          2,740, 32768x4096 2,792 -> 2,801 (runs 8d5086c82d25, 3113cf739b37). 2,700 would be
          37.3 us against 39.0: the bytes alone take ~33.5 at ~3,000 GB/s, and 3.0-3.6 of the
          other ~5.5 are the partial rows' write, sum and read (ablation_norm_04_ring.txt). The
          forward gains nothing: step 3's registers already had its one tensor in flight, and
          here it measured 3-8% slower (4096^2 2,925 -> 2,678), on clusters 15% (4096 x 32768:
          2,752 -> 2,332). Clusters of 4 one-SM CTAs fit 30 on the GPCs (120 of the 132 SMs),
          and each CTA waits on its slowest peer once a row: a backward ring of 6 rows, not 4,
          took 4096 x 32768 from 2,561 to 2,674 GB/s (runs 3113cf739b37, aeb7dde80dae). Rows of
          1,024 or fewer (a warp a row) are not this step's. The ring, the windows and the tiles
          are shared with rms_norm step 4 (norm_ring.cuh).
Limits:   1,025 <= cols <= 65,536, refused before launch otherwise (`Min:`, `Max:`). Workspace
          (backward): 2 x groups x cols fp32, a group a CTA or a cluster.
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
layer_norm_ring(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w, const T* __restrict__ b,
                T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int64_t cols,
                int64_t chunk, float eps, float inv_cols) {
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
  const bool wvec = aligned16(w), bvec = aligned16(b);
  Vec16<T> wv[Row::kVecs], bv[Row::kVecs];  // the same every row: loaded once, kept packed
#pragma unroll
  for (int i = 0; i < Row::kVecs; ++i)
    wv[i] = nm::fetch<kWhole>(w + start, Row::col(i, t), n, wvec),
    bv[i] = nm::fetch<kWhole>(b + start, Row::col(i, t), n, bvec);
  if constexpr (kRanks > 1) nm::cluster_wait();  // every peer has started: its barriers exist
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = first + j;
    const T* xrow = x + row * x_stride;
    // Step 3's shift k0, the row's first element: a cluster's CTAs all read it from global memory
    const float k0_far = kRanks > 1 ? rosetta::to_float(xrow[0]) : 0.0f;
    const int lead = nm::window_of<kWhole>(xrow + start, len).lead;
    ring.wait(j);
    const T* buf = ring.buffer(j, 0);
    Row r;
    nm::read_row<kWhole>(r, buf, lead, n, t);
    // Step 3's one pass of two sums about k0 = the row's first element (padding left out).
    const float k0 = kRanks > 1 ? k0_far : rosetta::to_float(buf[lead]);
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        const float d = nm::inside<kWhole, Row>(i, k, t, n) ? r.v[i][k] - k0 : 0.0f;
        s1 += d;
        s2 = fmaf(d, d, s2);
      }
    const float2 sums = nm::block_sums<kThreads, kRanks>(make_float2(s1, s2), xchg, j);
    ring.template refill<kWhole>(j, count, rows_of, len);  // every thread has read buffer j
    const float dm = sums.x * inv_cols, m = k0 + dm;
    const float v = fmaf(-dm, dm, sums.y * inv_cols);
    const float rs = rsqrtf((v < 0.0f ? 0.0f : v) + eps);  // NaN in, NaN row out
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) r.v[i][k] = (r.v[i][k] - m) * rs * wv[i].get(k) + bv[i].get(k);
    r.template store<kWhole>(y + row * cols + start, n, t);
    if (t == 0 && rank == 0) mean[row] = m, rstd[row] = rs;
  }
}

// Group c (a CTA or a cluster, as above): rows of its chunk, x's and dy's slices in the ring;
// dweight's and dbias's sums stay in registers and become group c's partial rows
// (partial[c * cols], partial[(groups + c) * cols], each CTA its slice).
template <typename T, int kThreads, int kElems, int kRanks, bool kWhole>
__global__ void __launch_bounds__(kThreads, kThreads >= 512 ? 1 : 2)
layer_norm_backward_ring(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w,
                         const float* __restrict__ mean, const float* __restrict__ rstd, const T* __restrict__ dy,
                         int64_t dy_stride, T* __restrict__ dx, float* __restrict__ partial, int64_t rows,
                         int64_t cols, int64_t chunk) {
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
  const int64_t group = blockIdx.x / kRanks, groups = gridDim.x / kRanks;
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
  float dw[Row::kVecs][Row::V] = {}, db[Row::kVecs][Row::V] = {};
  float next_m = count > 0 ? mean[first] : 0.0f, next_rs = count > 0 ? rstd[first] : 0.0f;
  if constexpr (kRanks > 1) nm::cluster_wait();  // every peer has started: its barriers exist
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = first + j;
    const float m = next_m, rs = next_rs;
    if (j + 1 < count) next_m = mean[row + 1], next_rs = rstd[row + 1];  // in flight through this row
    const int lead_x = nm::window_of<kWhole>(x + row * x_stride + start, len).lead;
    const int lead_g = nm::window_of<kWhole>(dy + row * dy_stride + start, len).lead;
    ring.wait(j);
    Row xr, gr;
    nm::read_row<kWhole>(xr, ring.buffer(j, 0), lead_x, n, t);
    nm::read_row<kWhole>(gr, ring.buffer(j, 1), lead_g, n, t);
    float2 sums = make_float2(0.0f, 0.0f);  // sum of g, sum of g * xhat (step 3's formulas)
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        xr.v[i][k] = nm::inside<kWhole, Row>(i, k, t, n) ? (xr.v[i][k] - m) * rs : 0.0f;
        dw[i][k] += gr.v[i][k] * xr.v[i][k];
        db[i][k] += gr.v[i][k];
        gr.v[i][k] *= wv[i].get(k);
        sums.x += gr.v[i][k];
        sums.y += gr.v[i][k] * xr.v[i][k];
      }
    sums = nm::block_sums<kThreads, kRanks>(sums, xchg, j);
    ring.template refill<kWhole>(j, count, rows_of, len);  // every thread has read buffer j
    const float a = -rs * (sums.y / float(cols)), b0 = -rs * (sums.x / float(cols));
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) gr.v[i][k] = fmaf(gr.v[i][k], rs, fmaf(xr.v[i][k], a, b0));
    gr.template store<kWhole>(dx + row * cols + start, n, t);
  }
  nm::store_partial<kWhole, Row>(partial + group * cols + start, dw, t, n);
  nm::store_partial<kWhole, Row>(partial + (groups + group) * cols + start, db, t, n);
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
    const bool whole = nm::whole_rows(x, a.x.stride[0], cols) && aligned16(y) && aligned16(w) && aligned16(b);
    fits = nm::pick_ring_tile<T>(cols, [&](auto threads, auto elems, auto ranks) {
      constexpr int kThreads = decltype(threads)::value, kElems = decltype(elems)::value;
      constexpr int kRanks = decltype(ranks)::value;
      constexpr int kBytes = nm::kRingBytes<T, kThreads, kElems, 1>;
      nm::by_path(whole, [&](auto w_) {
        const auto kernel = layer_norm_ring<T, kThreads, kElems, kRanks, decltype(w_)::value>;
        const nm::Chunks plan = nm::plan_ring(kernel, kThreads, kRanks, kBytes, rows, stream, status);
        if (plan.blocks == 0) {
          if (status == cudaSuccess) status = cudaErrorInvalidConfiguration;
          return;
        }
        status = nm::launch_groups(kernel, plan.blocks, kRanks, kThreads, kBytes, stream, x, a.x.stride[0], w, b, y,
                                   a.mean.ptr<float>(), a.rstd.ptr<float>(), rows, cols, plan.chunk, float(a.eps),
                                   1.0f / float(cols));
      });
    });
  });
  if (!fits) return cudaErrorInvalidValue;  // outside 1,025..65,536 columns: declared, refused before launch
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
    const bool whole = nm::whole_rows(x, a.x.stride[0], cols) && nm::whole_rows(dy, a.dy.stride[0], cols) &&
                       aligned16(dx) && aligned16(w);
    fits = nm::pick_ring_tile<T>(cols, [&](auto threads, auto elems, auto ranks) {
      constexpr int kThreads = decltype(threads)::value, kElems = decltype(elems)::value;
      constexpr int kRanks = decltype(ranks)::value;
      constexpr int kBytes = nm::kRingBytes<T, kThreads, kElems, 2, kRanks>;
      nm::by_path(whole, [&](auto w_) {
        const auto kernel = layer_norm_backward_ring<T, kThreads, kElems, kRanks, decltype(w_)::value>;
        const nm::Chunks plan = nm::plan_ring(kernel, kThreads, kRanks, kBytes, rows, stream, status);
        if (plan.blocks == 0) {
          if (status == cudaSuccess) status = cudaErrorInvalidConfiguration;
          return;
        }
        float* partial = a.workspace.get<float>(2 * int64_t(plan.blocks) * cols);  // dweight's rows, then dbias's
        status = nm::launch_groups(kernel, plan.blocks, kRanks, kThreads, kBytes, stream, x, a.x.stride[0], w,
                                   a.mean.ptr<const float>(), a.rstd.ptr<const float>(), dy, a.dy.stride[0], dx,
                                   partial, rows, cols, plan.chunk);
        if (status == cudaSuccess)
          status = nm::launch_sum_partials<T, 2>(partial, plan.blocks, cols, a.dweight.ptr<T>(), a.dbias.ptr<T>(),
                                                 stream);
      });
    });
  });
  if (!fits) return cudaErrorInvalidValue;  // outside 1,025..65,536 columns: declared, refused before launch
  return status != cudaSuccess ? status : launched;
}
