/*
Step 2 — the row in registers, dweight and dbias summed per block
Changed:  rms_norm step 2's idea. (1) the row is loaded once, as 16-byte vectors, into registers
          (norm::Tile): a warp per row up to 32 vectors a row (4 rows a 128-thread block:
          shuffles, no barrier), a block per row past that (256 or 512 threads, <= 16 values a
          thread; norm::pick_forward_tile). Forward: the mean, then the variance about it (two
          reductions, both from registers: the two-pass variance at one read), y written from
          registers: one read and one write. (2) Backward, one kernel for dx, dweight and dbias:
          a block takes a contiguous chunk of rows (as many blocks as fit on the machine at
          once), each thread owning the same columns in every row of it, and keeps
          sum(dy * xhat) and sum(dy) for its columns in registers across the chunk; the row's
          two sums (of g and of g * xhat) share one round of shuffles and barriers. At the end
          each block writes its two fp32 partial rows to the workspace (a warp-tile block first
          adds its 4 warps' rows in shared memory, in warp order), and norm::reduce_partials adds
          the partial rows in row order and rounds once to the weight's type. Where every row
          starts on 16 bytes and cols is a multiple of the vector width (the host checks), one
          predicated 16-byte load per vector, no element-wise branch; weight and bias come a
          vector at a time (L1 after the first row).
Why:      forward 4n -> 2n; backward 6n + n -> 2n + n + partials (2 x blocks x cols x 4 B
          written and read back, ~8 MB at 4,096 columns, mostly L2).
Still:    one row's loads, then its reductions, then its stores: within a block nothing
          overlaps the barriers of the block-per-row reductions (two forward, one backward),
          and only other resident blocks hide them. A long row (> 8,192) does not fit.
Limits:   rows past 8,192 elements are refused before launch (`Max: cols`); step 1 takes any
          row. Workspace (backward): 2 x blocks x cols fp32, blocks <= SMs x resident blocks
          per SM.
Layout:   rows
Max:      cols <= 8192
*/
#include "norm.cuh"

namespace {

namespace nm = rosetta::norm;
using nm::GroupSum;
using nm::kWarpRows;
using nm::Tile;
using rosetta::aligned16;
using rosetta::Vec16;

// A group of kGroup threads per row: a warp (kGroup 32, kWarpRows rows a block) or the block.
template <int kGroup> constexpr int kBlockThreads = kGroup == 32 ? 32 * kWarpRows : kGroup;
// Kernels declare __launch_bounds__(threads, 1): no register cap below 255 / thread count. With
// the plain bound ptxas spilled 4 bytes in two fp32 layer_norm tiles at 48 and 64 registers.

template <typename T, int kGroup, int kElems, bool kWhole>
__global__ void __launch_bounds__(kBlockThreads<kGroup>, 1)
layer_norm_rows(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w, const T* __restrict__ b,
                T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int64_t cols,
                float eps) {
  constexpr int kGroups = kBlockThreads<kGroup> / kGroup;
  __shared__ float2 scratch[kGroup / 32];
  const GroupSum<kGroup> sum{scratch};
  const int t = threadIdx.x % kGroup;
  const bool wvec = aligned16(w), bvec = aligned16(b);
  using Row = Tile<T, kGroup, kElems>;
  // kGroups == 1: the row is block-uniform, so the block reductions' barriers are safe.
  for (int64_t row = int64_t(blockIdx.x) * kGroups + threadIdx.x / kGroup; row < rows;
       row += int64_t(gridDim.x) * kGroups) {
    Row r;
    r.template load<kWhole>(x + row * x_stride, cols, t);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) s += r.v[i][k];  // padding: 0
    const float m = sum(s) / float(cols);
    float q = 0.0f;
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        const float d = r.v[i][k] - m;
        q += Row::valid(i, k, t, cols) ? d * d : 0.0f;  // padding is 0, not the mean: masked
      }
    const float rs = rsqrtf(sum(q) / float(cols) + eps);  // NaN in, NaN row out
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i) {
      const Vec16<T> wv = nm::fetch<kWhole>(w, Row::col(i, t), cols, wvec);
      const Vec16<T> bv = nm::fetch<kWhole>(b, Row::col(i, t), cols, bvec);
#pragma unroll
      for (int k = 0; k < Row::V; ++k) r.v[i][k] = (r.v[i][k] - m) * rs * wv.get(k) + bv.get(k);
    }
    r.template store<kWhole>(y + row * cols, cols, t);
    if (t == 0) mean[row] = m, rstd[row] = rs;
  }
}

// Block b: rows [b * chunk, min(rows, (b + 1) * chunk)), group g of the block every kGroups-th
// of them. dx per row from registers; dweight's and dbias's sums for the thread's columns stay in
// registers over the chunk and become the block's partial rows: dweight's at partial[b * cols],
// dbias's at partial[(gridDim.x + b) * cols].
template <typename T, int kGroup, int kElems, bool kWhole>
__global__ void __launch_bounds__(kBlockThreads<kGroup>, 1)
layer_norm_backward_rows(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w,
                         const float* __restrict__ mean, const float* __restrict__ rstd, const T* __restrict__ dy,
                         int64_t dy_stride, T* __restrict__ dx, float* __restrict__ partial, int64_t rows,
                         int64_t cols, int64_t chunk) {
  constexpr int kThreads = kBlockThreads<kGroup>, kGroups = kThreads / kGroup;
  using Row = Tile<T, kGroup, kElems>;
  __shared__ float2 scratch[kGroup / 32];
  const GroupSum<kGroup> sum{scratch};
  const int t = threadIdx.x % kGroup, g = threadIdx.x / kGroup;
  const bool wvec = aligned16(w);
  float dw[Row::kVecs][Row::V] = {}, db[Row::kVecs][Row::V] = {};
  const int64_t first = int64_t(blockIdx.x) * chunk, last = std::min(rows, first + chunk);
  for (int64_t row = first + g; row < last; row += kGroups) {  // kGroups == 1: block-uniform
    Row xr, gr;
    nm::load_pair<kWhole>(xr, x + row * x_stride, gr, dy + row * dy_stride, cols, t);
    const float m = mean[row], rs = rstd[row];
    float2 sums = make_float2(0.0f, 0.0f);  // sum of g, sum of g * xhat
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i) {
      const Vec16<T> wv = nm::fetch<kWhole>(w, Row::col(i, t), cols, wvec);
#pragma unroll
      for (int k = 0; k < Row::V; ++k) {
        // xhat in place of x; padding: 0 (x - mean is not), so dy = 0 there adds 0 below
        xr.v[i][k] = Row::valid(i, k, t, cols) ? (xr.v[i][k] - m) * rs : 0.0f;
        dw[i][k] += gr.v[i][k] * xr.v[i][k];
        db[i][k] += gr.v[i][k];
        gr.v[i][k] *= wv.get(k);  // g = dy * w
        sums.x += gr.v[i][k];
        sums.y += gr.v[i][k] * xr.v[i][k];
      }
    }
    sums = sum(sums);
    const float mg = sums.x / float(cols), mgx = sums.y / float(cols);
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k) gr.v[i][k] = rs * (gr.v[i][k] - mg - xr.v[i][k] * mgx);
    gr.template store<kWhole>(dx + row * cols, cols, t);
  }
  float* out_w = partial + int64_t(blockIdx.x) * cols;
  float* out_b = partial + (int64_t(gridDim.x) + blockIdx.x) * cols;
  if constexpr (kGroups == 1) {
#pragma unroll
    for (int i = 0; i < Row::kVecs; ++i)
#pragma unroll
      for (int k = 0; k < Row::V; ++k)
        if (Row::valid(i, k, t, cols)) out_w[Row::col(i, t) + k] = dw[i][k], out_b[Row::col(i, t) + k] = db[i][k];
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

// The grid of the forward: a group per row, 2^31 - 1 blocks at most (the row loop covers more).
unsigned row_blocks(int64_t rows, int groups) {
  return unsigned(std::min<int64_t>(rosetta::ceil_div(rows, groups), INT32_MAX));
}

}  // namespace

cudaError_t layer_norm_02_row_in_registers(const rosetta::LayerNormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  bool fits = true;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* w = a.weight.ptr<const T>();
    const T* b = a.bias.ptr<const T>();
    T* y = a.y.ptr<T>();
    const bool whole = cols % nm::kVec<T> == 0 && nm::rows_aligned(x, a.x.stride[0]) && aligned16(y) &&
                       aligned16(w) && aligned16(b);
    const auto launch = [&](auto group, auto elems) {
      constexpr int kGroup = decltype(group)::value;
      nm::by_path(whole, [&](auto w_) {
        layer_norm_rows<T, kGroup, decltype(elems)::value, decltype(w_)::value>
            <<<row_blocks(rows, kBlockThreads<kGroup> / kGroup), kBlockThreads<kGroup>, 0, stream>>>(
                x, a.x.stride[0], w, b, y, a.mean.ptr<float>(), a.rstd.ptr<float>(), rows, cols, float(a.eps));
      });
    };
    fits = nm::pick_forward_tile<T>(
        cols, [&](auto elems) { launch(nm::Int<32>{}, elems); },
        [&](auto threads, auto elems) { launch(threads, elems); });
  });
  return fits ? launched : cudaErrorInvalidValue;  // too long: declared (Max: cols), refused before launch
}

cudaError_t layer_norm_02_row_in_registers_backward(const rosetta::LayerNormBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (cols == 0) return cudaSuccess;
  if (rows == 0) {  // sums over no rows
    const cudaError_t e = nm::zero(a.dweight, stream);
    return e != cudaSuccess ? e : nm::zero(a.dbias, stream);
  }
  bool fits = true;
  const cudaError_t launched = rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* dy = a.dy.ptr<const T>();
    const T* w = a.weight.ptr<const T>();
    T* dx = a.dx.ptr<T>();
    const bool whole = cols % nm::kVec<T> == 0 && nm::rows_aligned(x, a.x.stride[0]) &&
                       nm::rows_aligned(dy, a.dy.stride[0]) && aligned16(dx) && aligned16(w);
    const auto launch = [&](auto group, auto elems) {
      constexpr int kGroup = decltype(group)::value, kThreads = kBlockThreads<kGroup>;
      nm::by_path(whole, [&](auto w_) {
        const auto kernel = layer_norm_backward_rows<T, kGroup, decltype(elems)::value, decltype(w_)::value>;
        const nm::Chunks plan = nm::plan_chunks(kernel, kThreads, rows, kThreads / kGroup);
        float* partial = a.workspace.get<float>(2 * int64_t(plan.blocks) * cols);  // dweight's rows, then dbias's
        kernel<<<plan.blocks, kThreads, 0, stream>>>(x, a.x.stride[0], w, a.mean.ptr<const float>(),
                                                    a.rstd.ptr<const float>(), dy, a.dy.stride[0], dx, partial, rows,
                                                    cols, plan.chunk);
        nm::reduce_partials<T, 2><<<nm::column_grid(cols), nm::column_block(), 0, stream>>>(
            partial, plan.blocks, cols, a.dweight.ptr<T>(), a.dbias.ptr<T>());
      });
    };
    fits = nm::pick_backward_tile<T>(
        cols, [&](auto elems) { launch(nm::Int<32>{}, elems); },
        [&](auto threads, auto elems) { launch(threads, elems); });
  });
  return fits ? launched : cudaErrorInvalidValue;  // too long: declared (Max: cols), refused before launch
}
