/*
Step 3 — rows pipelined through persistent blocks, one barrier a row, long rows across a cluster
Changed:  rms_norm step 3's idea. (1) persistent groups (as many blocks as fit at once; forward:
          every gridDim-th row, backward: a contiguous chunk), the next row's 16-byte vectors
          loaded, still packed, before the current row is reduced and stored. (2) one barrier a
          row: the forward's statistics are one pass of d = x - x[row][0] and d^2 (two shuffle
          trees side by side, one slot pair a warp): mean = k0 + S1/n, var = S2/n - (S1/n)^2, no
          divide; the backward's two sums share a slot; two slot arrays alternate by row.
          (3) past 8,192 columns a cluster of 2, 4 or 8 CTAs holds the row, CTA r the slice
          [8192 r, 8192 (r + 1)); each warp's lane r st.async's the slot into CTA r's
          transaction barrier. The backward keeps dweight's and dbias's sums in registers across
          the chunk, writes its partial rows with 16-byte stores, masks padding one compare a
          vector and forms dx in two FFMAs an element. (4) the partial rows are summed by a
          wider kernel launched as a programmatic dependent.
          (5) forward, where the rows make 12 or more waves of blocks, a block tile of 16 values
          drops the row ahead and the persistent grid: one block per row group, each row loaded
          when its turn comes, 16-bit tiles held to 40 registers (3 CTAs of 512 or 6 of 256 an
          SM, one row each, where the row ahead fits 2 or 4); launch_forward_rows decides.
          (6) the same rule at 16,385-32,768 16-bit columns: a 1,024-thread block a row, 32
          values a thread, in place of a cluster of 4.
Why:      measured before this change (H100, GB/s; bf16): forward 4096^2 2,672, 16384x8192 2,859,
          32768x4096 2,843, 4096x32768 2,569, 32768x2048 2,523, fp32 4096^2 2,899; backward
          4096^2 1,555, 16384x8192 2,398, 32768x4096 2,501, 4096x32768 2,179, fp32 4096^2 2,533,
          where rms_norm's step 3 ran the same tiles at the same occupancy 2-30% faster. Backward:
          a fit over rows (4096^2 and 32768x4096, same tile, same 256 partial rows) gives ~28 us
          fixed a call against rms_norm's ~13: the partial rows were stored 4 bytes a lane with
          lanes 32 bytes apart (8 partial writes per 32-byte sector, 2 x 4.3 MB: ~10 us of L2
          requests), now 2 writes a sector (fp32 tiles: 1). The loop is ~15% shorter (no 64-bit
          compare pair a element). Forward: the Chan merge kept three dependent shuffle trees
          and 2-4 divides (a slow-path call each) between a row's loads and its stores; the
          shifted sums keep one pair of trees each side of the barrier (SASS: 808 -> 504
          instructions, 35 -> 30 SHFL, 0 divides), and the 256 x 8 tile is held to 40 registers
          (6 CTAs an SM, was 5 at 47). Predicted: forward 4096^2 ~2,850, 16384x8192 and
          32768x4096 ~2,930, 4096x32768 ~2,800, 32768x2048 ~2,800, fp32 4096^2 ~2,950; backward
          4096^2 ~1,900, 16384x8192 ~2,550, 32768x4096 ~2,650, 4096x32768 ~2,300, fp32 4096^2
          ~2,730. (5): rms_norm's step 2 kernel, a
          block per row, ran 5% faster on many rows (bench/ablations/norm_03_lean.py).
          Predicted ~2,970 at 16384 x 8192 and 32768 x 4096.
Still:    one CTA per SM where a backward tile needs more than 64 registers a thread (512 x 16
          tiles and the clusters, 256 x 16 at two): its barriers are covered by the next row
          alone. fp32 tiles of 16 values run x alone ahead (x and dy both spill); the fp32
          forward tiles take 94-101 registers (2 CTAs of 256 an SM where rms_norm fits 4: they
          spill at 64). dweight and dbias still take a second kernel and a round trip of 2 x
          groups partial rows through L2: at 4096^2 that and the pipeline's fill are most of
          what is left. The shifted sums' rounding is ~eps (var + (mean - k0)^2): a first element
          far out in the row's tail costs precision (x[0] = 1e3 over randn, 4,096 columns: rstd
          off by ~1e-4 relative, where Welford or two passes stay at ~1e-7). Why one block per
          row beats a persistent block walking rows with the same kernel and occupancy is
          measured, not explained (a guess: rows in flight stay neighbours in DRAM). The
          forward's clusters keep the row ahead: under the rule a cluster per row measured 2,577
          at 4096 x 32768 (2,759 ahead), 2,532 at 2048 x 32768 (2,730) and fp32 1024 x 16384
          2,174 (2,851), not yet explained (results/.../ablation_norm_03_cluster_alone.txt); (6)
          is why clusters of 4 lose: 30 fit, 120 of 132 SMs. A 1,024 x 16 block in place of a
          cluster of 2 lost in development (4096 x 16384: 2,848 -> 2,479), so (6) stops at 4.
Limits:   rows past 65,536 elements (8 CTAs x 8,192) are refused before launch (`Max: cols`):
          clusters of more than 8 CTAs need an opt-in and whole GPCs. Workspace (backward):
          2 x groups x cols fp32, groups <= the CTAs (or clusters) resident at once.
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
using rosetta::warp_sum;

// A group of kGroup threads per row: a warp (kGroup 32, kWarpRows rows a block) or the block;
// a row of a cluster is kRanks such blocks.
template <int kGroup> constexpr int kBlockThreads = kGroup == 32 ? 32 * kWarpRows : kGroup;
// The forward's 16-bit block tiles on the whole-vector path are held to 64 registers with a row
// ahead (2 CTAs of 512 or 4 of 256 an SM, two rows in flight each) and to 40 without (3 or 6, one
// row each), the 256 x 8 tile to 40 (6 CTAs; at 32 it spills, unbound it took 48: 5). fp32 tiles
// and the element-wise path spill under 64 and stay unbound.
template <typename T, int kGroup, int kElems, bool kWhole, bool kAhead>
constexpr int kForwardMinBlocks = kGroup == 32 || !kWhole || sizeof(T) == 4 ? 1
                                  : kElems == 8                              ? 6
                                                                             : (kAhead ? 1024 : 1536) / kGroup;

// A row's two sums (forward: of d and d^2, d = x - x[row][0]; backward: of g and of g * xhat):
// the two shuffle trees side by side for a warp group, else the warp pairs through the exchange
// (its one barrier) and the two slot sums side by side. Every thread gets the same bits.
template <int kGroup, int kRanks>
__device__ __forceinline__ float2 row_sums(float2 v, const nm::Exchange<kGroup / 32, kRanks, float2>& xchg,
                                           unsigned it) {
  v = make_float2(warp_sum(v.x), warp_sum(v.y));
  if constexpr (kGroup == 32) return v;
  else {
    constexpr int kSlots = kGroup / 32 * kRanks;
    const float2* slots = xchg(v, it);
    return make_float2(nm::slot_total<kSlots>(slots, [](float2 p, int) { return p.x; }),
                       nm::slot_total<kSlots>(slots, [](float2 p, int) { return p.y; }));
  }
}

// Group g of block b takes rows b * kGroups + g, then every (groups x kGroups)-th; a cluster's
// CTAs share rows and a CTA's columns start at rank x slice. kAhead: the next row's loads are in
// flight while this one is reduced (the persistent grid); otherwise each row is loaded when its
// turn comes (a grid of one block per row group: the loop runs once).
template <typename T, int kGroup, int kElems, int kRanks, bool kWhole, bool kAhead>
__global__ void __launch_bounds__(kBlockThreads<kGroup>, kForwardMinBlocks<T, kGroup, kElems, kWhole, kAhead>)
layer_norm_rows(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w, const T* __restrict__ b,
                T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int64_t cols,
                float eps, float inv_cols) {
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
  const T* bs = b + start;
  T* ys = y + start;
  const bool wvec = aligned16(w), bvec = aligned16(b);
  const int64_t step = int64_t(gridDim.x / kRanks) * kGroups;
  int64_t row = int64_t(blockIdx.x / kRanks) * kGroups + threadIdx.x / kGroup;
  xchg.open();
  // The row's shift: its first element (every CTA of a cluster loads the same one), loaded with the
  // row and kept as loaded (converting it here would wait for the load).
  Next next;
  T next_k{};
  if (kAhead && row < rows) {
    next.template load<kWhole>(xs + row * x_stride, n, t);
    next_k = x[row * x_stride];
  }
  if constexpr (kRanks > 1) nm::cluster_wait();  // every peer has started: its slots exist
  // kGroups == 1: the row is uniform over the block (and the cluster), so the barriers are safe.
  for (unsigned it = 0; row < rows; row += step, ++it) {
    Row r;
    float k0;
    if constexpr (kAhead) {
      next.unpack(r);
      k0 = rosetta::to_float(next_k);
      if (row + step < rows) {  // in flight from here
        next.template load<kWhole>(xs + (row + step) * x_stride, n, t);
        next_k = x[(row + step) * x_stride];
      }
    } else {
      r.template load<kWhole>(xs + row * x_stride, n, t);
      k0 = rosetta::to_float(x[row * x_stride]);
    }
    // One pass, two sums about k0: of d = x - k0 and of d^2 (padding left out: it is 0, not k0).
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        const float d = nm::inside<kWhole, Row>(i, k, t, n) ? r.v[i][k] - k0 : 0.0f;
        s1 += d;
        s2 = fmaf(d, d, s2);
      }
    const float2 sums = row_sums<kGroup, kRanks>(make_float2(s1, s2), xchg, it);
    const float dm = sums.x * inv_cols;  // mean - k0
    const float m = k0 + dm;
    // var = E[d^2] - E[d]^2, exact algebra for any shift; the rounding is ~eps (var + (mean - k0)^2),
    // small because k0 is one of the row's own values. Rounding below 0 is clamped; NaN stays NaN.
    const float v = fmaf(-dm, dm, sums.y * inv_cols);
    const float rs = rsqrtf((v < 0.0f ? 0.0f : v) + eps);  // NaN in, NaN row out
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i) {
      const Vec16<T> wv = nm::fetch<kWhole>(ws, Row::col(i, t), n, wvec);
      const Vec16<T> bv = nm::fetch<kWhole>(bs, Row::col(i, t), n, bvec);
#pragma unroll
      for (int k = 0; k < Row::V; ++k) r.v[i][k] = (r.v[i][k] - m) * rs * wv.get(k) + bv.get(k);
    }
    r.template store<kWhole>(ys + row * cols, n, t);
    if (t == 0 && rank == 0) mean[row] = m, rstd[row] = rs;
  }
}

// Group (a CTA, or a cluster) c: rows [c * chunk, min(rows, (c + 1) * chunk)), row-group g of
// the block every kGroups-th of them. dx per row from registers; dweight's and dbias's sums for
// the thread's columns stay in registers over the chunk and become the group's partial rows:
// dweight's at partial[c * cols], dbias's at partial[(groups + c) * cols].
template <typename T, int kGroup, int kElems, int kRanks, bool kWhole>
__global__ void __launch_bounds__(kBlockThreads<kGroup>, 1)
layer_norm_backward_rows(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w,
                         const float* __restrict__ mean, const float* __restrict__ rstd, const T* __restrict__ dy,
                         int64_t dy_stride, T* __restrict__ dx, float* __restrict__ partial, int64_t rows,
                         int64_t cols, int64_t chunk) {
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
  const int64_t groups = gridDim.x / kRanks, group = blockIdx.x / kRanks;
  const int64_t last = std::min(rows, (group + 1) * chunk);
  int64_t row = group * chunk + g;
  float dw[Row::kVecs][Row::V] = {}, db[Row::kVecs][Row::V] = {};
  xchg.open();
  Next nx, ng;
  float next_m = 0.0f, next_rs = 0.0f;
  if (row < last) {
    nx.template load<kWhole>(xs + row * x_stride, n, t);
    if constexpr (kAheadDy) ng.template load<kWhole>(dys + row * dy_stride, n, t);
    next_m = mean[row];
    next_rs = rstd[row];
  }
  if constexpr (kRanks > 1) nm::cluster_wait();
  for (unsigned it = 0; row < last; row += kGroups, ++it) {  // kGroups == 1: block-uniform
    if constexpr (!kAheadDy) ng.template load<kWhole>(dys + row * dy_stride, n, t);
    Row xr, gr;
    nx.unpack(xr);
    ng.unpack(gr);
    const float m = next_m, rs = next_rs;
    if (row + kGroups < last) {  // the next row's loads, in flight through this row's barrier
      nx.template load<kWhole>(xs + (row + kGroups) * x_stride, n, t);
      if constexpr (kAheadDy) ng.template load<kWhole>(dys + (row + kGroups) * dy_stride, n, t);
      next_m = mean[row + kGroups];
      next_rs = rstd[row + kGroups];
    }
    float2 sums = make_float2(0.0f, 0.0f);  // sum of g, sum of g * xhat
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i) {
      const Vec16<T> wv = nm::fetch<kWhole>(ws, Row::col(i, t), n, wvec);
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        // xhat in place of x; padding: 0 (x - mean is not), so dy = 0 there adds 0 below
        xr.v[i][k] = nm::inside<kWhole, Row>(i, k, t, n) ? (xr.v[i][k] - m) * rs : 0.0f;
        dw[i][k] += gr.v[i][k] * xr.v[i][k];
        db[i][k] += gr.v[i][k];
        gr.v[i][k] *= wv.get(k);  // g = dy * w
        sums.x += gr.v[i][k];
        sums.y += gr.v[i][k] * xr.v[i][k];
      }
    }
    sums = row_sums<kGroup, kRanks>(sums, xchg, it);
    // dx = rs (g - mean(g) - xhat mean(g xhat)), as rs g + (xhat a + b0): two FFMAs an element. The
    // two divides stay (2 a row, side by side): with a reciprocal instead, ptxas spilled the
    // element-wise 512 x 16 tiles at the 128-register cap.
    const float a = -rs * (sums.y / float(cols)), b0 = -rs * (sums.x / float(cols));
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) gr.v[i][k] = fmaf(gr.v[i][k], rs, fmaf(xr.v[i][k], a, b0));
    gr.template store<kWhole>(dxs + row * cols, n, t);
  }
  float* out_w = partial + group * cols + start;
  float* out_b = partial + (groups + group) * cols + start;
  if constexpr (kGroups == 1) {  // 16-byte stores on the whole-vector path
    nm::store_partial<kWhole, Row>(out_w, dw, t, n);
    nm::store_partial<kWhole, Row>(out_b, db, t, n);
  } else {
    // The warps' rows add up in warp order (the same bits every run).
    __shared__ float rows_w[kGroups][kGroup * kElems], rows_b[kGroups][kGroup * kElems];
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) rows_w[g][Row::col(i, t) + k] = dw[i][k], rows_b[g][Row::col(i, t) + k] = db[i][k];
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += kThreads) {  // cols <= kGroup * kElems here
      float tw = rows_w[0][c], tb = rows_b[0][c];
#pragma unroll
      for (int j = 1; j < kGroups; ++j) tw += rows_w[j][c], tb += rows_b[j][c];
      out_w[c] = tw;
      out_b[c] = tb;
    }
  }
}

}  // namespace

cudaError_t layer_norm_03_pipelined_rows(const rosetta::LayerNormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  cudaError_t status = cudaSuccess;
  bool fits = true;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* w = a.weight.ptr<const T>();
    const T* b = a.bias.ptr<const T>();
    T* y = a.y.ptr<T>();
    const bool whole = cols % nm::kVec<T> == 0 && nm::rows_aligned(x, a.x.stride[0]) && aligned16(y) &&
                       aligned16(w) && aligned16(b);
    const auto launch = [&](auto group, auto elems, auto ranks) {
      constexpr int kGroup = decltype(group)::value, kRanks = decltype(ranks)::value;
      constexpr int kThreads = kBlockThreads<kGroup>;
      nm::by_path(whole, [&](auto w_) {
        constexpr int kElems = decltype(elems)::value;
        constexpr bool kW = decltype(w_)::value;
        auto* ahead = layer_norm_rows<T, kGroup, kElems, kRanks, kW, true>;
        decltype(ahead) alone = nullptr;
        int alone_threads = kThreads;
        if constexpr (nm::kMayRunAlone<kGroup, kElems, kRanks>) alone = layer_norm_rows<T, kGroup, kElems, kRanks, kW, false>;
        if constexpr (nm::kMayRunWide<T, kRanks, kW>) {  // a 1,024-thread block a row, not a cluster
          alone = layer_norm_rows<T, nm::kWideThreads, nm::kWideElems, 1, kW, false>;
          alone_threads = nm::kWideThreads;
        }
        status = nm::launch_forward_rows(ahead, alone, kThreads, alone_threads, kRanks, kThreads / kGroup, rows,
                                         stream, x, a.x.stride[0], w, b, y, a.mean.ptr<float>(), a.rstd.ptr<float>(), rows,
                                         cols, float(a.eps), 1.0f / float(cols));
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

cudaError_t layer_norm_03_pipelined_rows_backward(const rosetta::LayerNormBackwardArgs& a, cudaStream_t stream) {
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
    const bool whole = cols % nm::kVec<T> == 0 && nm::rows_aligned(x, a.x.stride[0]) &&
                       nm::rows_aligned(dy, a.dy.stride[0]) && aligned16(dx) && aligned16(w);
    const auto launch = [&](auto group, auto elems, auto ranks) {
      constexpr int kGroup = decltype(group)::value, kRanks = decltype(ranks)::value;
      constexpr int kThreads = kBlockThreads<kGroup>;
      nm::by_path(whole, [&](auto w_) {
        const auto kernel =
            layer_norm_backward_rows<T, kGroup, decltype(elems)::value, kRanks, decltype(w_)::value>;
        const nm::Chunks plan = nm::plan_long_chunks(kernel, kThreads, kRanks, rows, kThreads / kGroup, stream);
        if (plan.blocks == 0) {
          status = cudaErrorInvalidConfiguration;
          return;
        }
        float* partial = a.workspace.get<float>(2 * int64_t(plan.blocks) * cols);  // dweight's rows, then dbias's
        status = nm::launch_rows(kernel, plan.blocks, kRanks, kThreads, stream, x, a.x.stride[0], w,
                                 a.mean.ptr<const float>(), a.rstd.ptr<const float>(), dy, a.dy.stride[0], dx,
                                 partial, rows, cols, plan.chunk);
        if (status == cudaSuccess)
          status = nm::launch_sum_partials<T, 2>(partial, plan.blocks, cols, a.dweight.ptr<T>(), a.dbias.ptr<T>(),
                                                 stream);
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
