/*
Step 3 — rows pipelined through persistent blocks, long rows across a cluster
Changed:  (1) persistent groups: as many blocks as fit at once, each walking its rows (forward:
          every gridDim-th; backward: a contiguous chunk), and the next row's 16-byte vectors
          loaded (kept packed) before the current row is reduced and stored: two rows in flight
          per group. (2) one barrier per row: each warp's
          shuffled partial goes to a slot in shared memory, one barrier, and every warp adds the
          slots in the same order (lane j slot j, then a butterfly); two slot arrays alternate
          by row, so no second barrier guards their reuse. (3) rows past 8,192 columns: a
          cluster of 2, 4 or 8 CTAs of 512 x 16 values holds the row, CTA r the slice
          [8192 r, 8192 (r + 1)); each warp's lane r st.async's the warp's partial into CTA r's
          slots, completing bytes on CTA r's transaction barrier, and the one barrier is each
          CTA's wait on its own (barrier.cluster's release costs a MEMBAR.ALL.GPU that would wait
          for the next row's loads). The backward's dweight accumulators stay per thread across
          the chunk as in step 2, a cluster writing one partial row (each CTA its slice), with
          16-byte stores (norm::store_partial). (4) the partial rows are summed by a wider kernel
          launched as a programmatic dependent of the backward (its launch overlaps the tail).
          (5) forward on 12+ waves of rows: tiles of 16 values drop the row ahead, a block per
          row group, 40 registers (norm::launch_forward_rows); (6) at 16,385-32,768 16-bit
          columns: a 1,024-thread block a row (32 values a thread), not a cluster of 4.
Why:      step 2's block waits, alone, through its row's load latency and then through its
          barriers; only other resident blocks cover either. With the next row already in
          flight, each SM keeps 16-32 KB of loads outstanding through the barrier (Little's law
          at ~3 TB/s and ~1 us: ~23 KB an SM). Measured (H100, GB/s, bf16) before the partial
          rows' 16-byte stores: forward 4096^2 2,923, 16384x8192 2,954, 4096x32768 2,884, fp32
          4096^2 3,105; backward 4096^2 2,152, 16384x8192 2,871, 32768x4096 2,869, 4096x32768
          2,556, fp32 4096^2 2,863. A fit over rows (4096^2 and 32768x4096: the same tile and
          the same 256 partial rows) puts ~13 us a call in fixed costs; the partial rows, stored
          4 bytes a lane with lanes 32 bytes apart (8 partial writes per 32-byte sector, 4.3 MB:
          ~6 us of L2 requests), now take 2 writes a sector (fp32: 1), and the dot's divide is a
          multiply by 1/cols (a kernel argument); 256 x 8 backward tiles drop to 64 registers
          (4 CTAs an SM, was 3). Predicted backward: 4096^2 ~2,420, 16384x8192 ~2,920,
          32768x4096 ~2,900, 4096x32768 ~2,600, 2048x32768 ~2,470, 32768x2048 ~2,850, fp32
          4096^2 ~2,990; forward unchanged. (5): step 2's kernel, a block per row, beat this step on
          many rows (bench/ablations/norm_03_lean.py: 2,993 against 2,881 at 16384 x 8192);
          predicted ~2,990 there and at 32768 x 4096. (6): clusters of 4 one-SM CTAs fit 30
          (120 of 132 SMs); Triton's step 3, a block per row, took 2,980 at 4096 x 32768:
          predicted ~2,950 (from 2,863).
Still:    one CTA per SM where a backward tile needs more than 64 registers a thread (512 x 16
          tiles and the clusters): its barriers are covered by the next row alone. fp32 tiles
          of 16 values run x alone ahead (x and dy both spill). dweight still takes a second
          kernel and a round trip of partial rows through L2: at 4096^2 (16 rows a CTA) that,
          the pipeline's fill and its drain are ~8 us of ~41, short of 2,700. Why one block per
          row beats a persistent block walking rows with the same kernel and occupancy, on many
          waves of rows, is measured, not explained (a guess: rows in flight stay neighbours in
          DRAM). Clusters keep the row ahead: a cluster per row measured 2,742 GB/s at 4096 x
          32768 against 2,858 (results/.../ablation_norm_03_cluster_alone.txt). (6) stops at
          clusters of 4: a 1,024 x 16 block in place of a cluster of 2 lost in development
          (4096 x 16384: 2,868 -> 2,610).
Limits:   rows past 65,536 elements (8 CTAs x 8,192) are refused before launch (`Max: cols`):
          clusters of more than 8 CTAs need an opt-in and whole GPCs. Workspace (backward):
          groups x cols fp32, groups <= the CTAs (or clusters) resident at once.
Layout:   rows
Max:      cols <= 65536
*/
#include "norm_long.cuh"

namespace {

namespace nm = rosetta::norm;
using nm::kWarpRows;
using nm::Tile;
using rosetta::aligned16;
using rosetta::Vec16;

// A group of kGroup threads per row: a warp (kGroup 32, kWarpRows rows a block) or the block;
// a row of a cluster is kRanks such blocks.
template <int kGroup> constexpr int kBlockThreads = kGroup == 32 ? 32 * kWarpRows : kGroup;
// The forward's block tiles are held to 64 registers with a row ahead (2 CTAs of 512 or 4 of 256
// an SM, two rows in flight each; no spills, checked by ptxas): unbound, fp32 tiles took 66-80.
// Without, 16-bit tiles are held to 40 (3 or 6 CTAs, one row each).
template <typename T, int kGroup, bool kAhead>
constexpr int kForwardMinBlocks = kGroup == 32 ? 1 : (kAhead || sizeof(T) == 4 ? 1024 : 1536) / kGroup;

// The row's sum of one value a thread: shuffles for a warp group, else the warp partials through
// the exchange (its one barrier). Every thread gets the same bits.
template <int kGroup, int kRanks>
__device__ __forceinline__ float row_sum(float v, const nm::Exchange<kGroup / 32, kRanks, float2>& xchg, unsigned it) {
  v = rosetta::warp_sum(v);
  if constexpr (kGroup == 32) return v;
  else {
    const float2* slots = xchg(make_float2(v, 0.0f), it);
    return nm::slot_total<kGroup / 32 * kRanks>(slots, [](float2 p, int) { return p.x; });
  }
}

// Group g of block b takes rows b * kGroups + g, then every (groups x kGroups)-th; a cluster's
// CTAs share rows and a CTA's columns start at rank x slice. kAhead: the next row's loads are in
// flight while this one is reduced (the persistent grid); otherwise each row is loaded when its
// turn comes (a grid of one block per row group: the loop runs once).
template <typename T, int kGroup, int kElems, int kRanks, bool kWhole, bool kAhead>
__global__ void __launch_bounds__(kBlockThreads<kGroup>, kForwardMinBlocks<T, kGroup, kAhead>)
rms_norm_rows(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w, T* __restrict__ y,
              float* __restrict__ rstd, int64_t rows, int64_t cols, float eps) {
  constexpr int kGroups = kBlockThreads<kGroup> / kGroup, kWarps = kGroup / 32;
  using Row = Tile<T, kGroup, kElems>;
  using Next = nm::Packed<T, kGroup, kElems>;
  __shared__ float2 inbox[2 * kWarps * kRanks];
  __shared__ uint64_t bars[2];
  const int rank = kRanks > 1 ? nm::cluster_rank() : 0;
  const nm::Exchange<kWarps, kRanks, float2> xchg{inbox, bars, rank};
  const int t = threadIdx.x % kGroup;
  const int64_t start = int64_t(rank) * kGroup * kElems, n = cols - start;  // this CTA's slice
  const T* xs = x + start;
  const T* ws = w + start;
  T* ys = y + start;
  const bool wvec = aligned16(w);
  const int64_t step = int64_t(gridDim.x / kRanks) * kGroups;
  int64_t row = int64_t(blockIdx.x / kRanks) * kGroups + threadIdx.x / kGroup;
  xchg.open();
  Next next;
  if (kAhead && row < rows) next.template load<kWhole>(xs + row * x_stride, n, t);
  if constexpr (kRanks > 1) nm::cluster_wait();  // every peer has started: its slots exist
  // kGroups == 1: the row is uniform over the block (and the cluster), so the barriers are safe.
  for (unsigned it = 0; row < rows; row += step, ++it) {
    Row r;
    if constexpr (kAhead) {
      next.unpack(r);
      if (row + step < rows) next.template load<kWhole>(xs + (row + step) * x_stride, n, t);  // in flight from here
    } else {
      r.template load<kWhole>(xs + row * x_stride, n, t);
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) ss += r.v[i][k] * r.v[i][k];  // padding: 0
    const float s = rsqrtf(row_sum<kGroup, kRanks>(ss, xchg, it) / float(cols) + eps);  // NaN in, NaN row out
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i) {
      const Vec16<T> wv = nm::fetch<kWhole>(ws, Row::col(i, t), n, wvec);
#pragma unroll
      for (int k = 0; k < Row::V; ++k) r.v[i][k] = r.v[i][k] * s * wv.get(k);
    }
    r.template store<kWhole>(ys + row * cols, n, t);
    if (t == 0 && rank == 0) rstd[row] = s;
  }
}

// Group (a CTA, or a cluster) c: rows [c * chunk, min(rows, (c + 1) * chunk)), row-group g of
// the block every kGroups-th of them. dx per row from registers; dweight's sums for the thread's
// columns stay in registers over the chunk and become the group's partial row partial[c * cols ...].
template <typename T, int kGroup, int kElems, int kRanks, bool kWhole>
__global__ void __launch_bounds__(kBlockThreads<kGroup>, 1)
rms_norm_backward_rows(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w,
                       const float* __restrict__ rstd, const T* __restrict__ dy, int64_t dy_stride,
                       T* __restrict__ dx, float* __restrict__ partial, int64_t rows, int64_t cols, int64_t chunk,
                       float inv_cols) {
  constexpr int kThreads = kBlockThreads<kGroup>, kGroups = kThreads / kGroup, kWarps = kGroup / 32;
  using Row = Tile<T, kGroup, kElems>;
  using Next = nm::Packed<T, kGroup, kElems>;
  // The next row's dy too, unless the tile is 16 fp32 values a tensor: then x alone runs ahead
  // (both spilled at the 128 registers of a 512-thread CTA; at 256 threads, 162 took one CTA an SM).
  constexpr bool kAheadDy = sizeof(T) * kElems <= 32;
  nm::allow_dependents();  // the partial-row kernel may be placed now; it waits for this grid
  __shared__ float2 inbox[2 * kWarps * kRanks];
  __shared__ uint64_t bars[2];
  const int rank = kRanks > 1 ? nm::cluster_rank() : 0;
  const nm::Exchange<kWarps, kRanks, float2> xchg{inbox, bars, rank};
  const int t = threadIdx.x % kGroup, g = threadIdx.x / kGroup;
  const int64_t start = int64_t(rank) * kGroup * kElems, n = cols - start;
  const T* xs = x + start;
  const T* dys = dy + start;
  const T* ws = w + start;
  T* dxs = dx + start;
  const bool wvec = aligned16(w);
  const int64_t group = blockIdx.x / kRanks;
  const int64_t last = std::min(rows, (group + 1) * chunk);
  int64_t row = group * chunk + g;
  float dw[Row::kVecs][Row::V] = {};
  xchg.open();
  Next nx, ng;
  float next_s = 0.0f;
  if (row < last) {
    nx.template load<kWhole>(xs + row * x_stride, n, t);
    if constexpr (kAheadDy) ng.template load<kWhole>(dys + row * dy_stride, n, t);
    next_s = rstd[row];
  }
  if constexpr (kRanks > 1) nm::cluster_wait();
  for (unsigned it = 0; row < last; row += kGroups, ++it) {  // kGroups == 1: block-uniform
    if constexpr (!kAheadDy) ng.template load<kWhole>(dys + row * dy_stride, n, t);
    Row xr, gr;
    nx.unpack(xr);
    ng.unpack(gr);
    const float s = next_s;
    if (row + kGroups < last) {  // the next row's loads, in flight through this row's barrier
      nx.template load<kWhole>(xs + (row + kGroups) * x_stride, n, t);
      if constexpr (kAheadDy) ng.template load<kWhole>(dys + (row + kGroups) * dy_stride, n, t);
      next_s = rstd[row + kGroups];
    }
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i) {
      const Vec16<T> wv = nm::fetch<kWhole>(ws, Row::col(i, t), n, wvec);
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        dw[i][k] += gr.v[i][k] * xr.v[i][k] * s;  // padding: 0 * 0
        gr.v[i][k] *= wv.get(k);                  // g = dy * w
        dot += gr.v[i][k] * xr.v[i][k];
      }
    }
    const float c = s * s * inv_cols * row_sum<kGroup, kRanks>(dot, xchg, it);
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) gr.v[i][k] = s * (gr.v[i][k] - xr.v[i][k] * c);
    gr.template store<kWhole>(dxs + row * cols, n, t);
  }
  float* out = partial + group * cols + start;
  if constexpr (kGroups == 1) {
    nm::store_partial<kWhole, Row>(out, dw, t, n);  // 16-byte stores on the whole-vector path
  } else {
    // The warps' rows add up in warp order (the same bits every run).
    __shared__ float rows_of[kGroups][kGroup * kElems];
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) rows_of[g][Row::col(i, t) + k] = dw[i][k];
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += kThreads) {  // cols <= kGroup * kElems here
      float total = rows_of[0][c];
#pragma unroll
      for (int j = 1; j < kGroups; ++j) total += rows_of[j][c];
      out[c] = total;
    }
  }
}

}  // namespace

cudaError_t rms_norm_03_pipelined_rows(const rosetta::RmsNormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  cudaError_t status = cudaSuccess;
  bool fits = true;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* w = a.weight.ptr<const T>();
    T* y = a.y.ptr<T>();
    const bool whole = cols % nm::kVec<T> == 0 && nm::rows_aligned(x, a.x.stride[0]) && aligned16(y) && aligned16(w);
    const auto launch = [&](auto group, auto elems, auto ranks) {
      constexpr int kGroup = decltype(group)::value, kRanks = decltype(ranks)::value;
      constexpr int kThreads = kBlockThreads<kGroup>;
      nm::by_path(whole, [&](auto w_) {
        constexpr int kElems = decltype(elems)::value;
        constexpr bool kW = decltype(w_)::value;
        auto* ahead = rms_norm_rows<T, kGroup, kElems, kRanks, kW, true>;
        decltype(ahead) alone = nullptr;
        int alone_threads = kThreads;
        if constexpr (nm::kMayRunAlone<kGroup, kElems, kRanks>) alone = rms_norm_rows<T, kGroup, kElems, kRanks, kW, false>;
        if constexpr (nm::kMayRunWide<T, kRanks, kW>) {  // a 1,024-thread block a row, not a cluster
          alone = rms_norm_rows<T, nm::kWideThreads, nm::kWideElems, 1, kW, false>;
          alone_threads = nm::kWideThreads;
        }
        status = nm::launch_forward_rows(ahead, alone, kThreads, alone_threads, kRanks, kThreads / kGroup, rows,
                                         stream, x, a.x.stride[0], w, y, a.rstd.ptr<float>(), rows, cols, float(a.eps));
      });
    };
    fits = nm::pick_long_tile<T, false>(
        cols, [&](auto elems) { launch(nm::Int<32>{}, elems, nm::Int<1>{}); },
        [&](auto threads, auto elems) { launch(threads, elems, nm::Int<1>{}); },
        [&](auto ranks) { launch(nm::Int<nm::kSliceThreads>{}, nm::Int<nm::kSliceElems>{}, ranks); });
  });
  if (!fits) return cudaErrorInvalidValue;  // too long: declared (Max: cols), refused before launch
  return status != cudaSuccess ? status : launched;
}

cudaError_t rms_norm_03_pipelined_rows_backward(const rosetta::RmsNormBackwardArgs& a, cudaStream_t stream) {
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
    const bool whole = cols % nm::kVec<T> == 0 && nm::rows_aligned(x, a.x.stride[0]) &&
                       nm::rows_aligned(dy, a.dy.stride[0]) && aligned16(dx) && aligned16(w);
    const auto launch = [&](auto group, auto elems, auto ranks) {
      constexpr int kGroup = decltype(group)::value, kRanks = decltype(ranks)::value;
      constexpr int kThreads = kBlockThreads<kGroup>;
      nm::by_path(whole, [&](auto w_) {
        const auto kernel = rms_norm_backward_rows<T, kGroup, decltype(elems)::value, kRanks, decltype(w_)::value>;
        const nm::Chunks plan = nm::plan_long_chunks(kernel, kThreads, kRanks, rows, kThreads / kGroup, stream);
        if (plan.blocks == 0) {
          status = cudaErrorInvalidConfiguration;
          return;
        }
        float* partial = a.workspace.get<float>(int64_t(plan.blocks) * cols);
        status = nm::launch_rows(kernel, plan.blocks, kRanks, kThreads, stream, x, a.x.stride[0], w,
                                 a.rstd.ptr<const float>(), dy, a.dy.stride[0], dx, partial, rows, cols, plan.chunk,
                                 1.0f / float(cols));
        if (status == cudaSuccess)
          status = nm::launch_sum_partials<T, 1>(partial, plan.blocks, cols, a.dweight.ptr<T>(), nullptr, stream);
      });
    };
    fits = nm::pick_long_tile<T, true>(
        cols, [&](auto elems) { launch(nm::Int<32>{}, elems, nm::Int<1>{}); },
        [&](auto threads, auto elems) { launch(threads, elems, nm::Int<1>{}); },
        [&](auto ranks) { launch(nm::Int<nm::kSliceThreads>{}, nm::Int<nm::kSliceElems>{}, ranks); });
  });
  if (!fits) return cudaErrorInvalidValue;  // too long: declared (Max: cols), refused before launch
  return status != cudaSuccess ? status : launched;
}
