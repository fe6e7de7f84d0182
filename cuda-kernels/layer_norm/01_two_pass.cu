/*
Step 1 — passes over the row, a block per row
Changed:  the baseline, rms_norm step 1's shape. Forward: a 256-thread block per row, one
          element per thread per access; pass 1 sums x (mean), pass 2 sums (x - mean)^2 (the
          biased variance, taken about the mean so no cancellation), rstd = 1/sqrt(var + eps);
          mean and rstd go to the saved fp32 statistics; pass 3 writes
          y = (x - mean) * rstd * w + b. Backward, two kernels: a block per row for dx (pass 1:
          sums of g = dy * w and of g * xhat, xhat = (x - mean) * rstd; pass 2:
          dx = rstd * (g - mean(g) - xhat * mean(g * xhat))), then dweight and dbias by a column
          kernel: each block takes 32 columns and walks every row for them
          (norm::column_sums), reading x, dy, mean and rstd again: dweight[j] = sum of
          dy * xhat, dbias[j] = sum of dy, added in row order (no atomics).
Why:      the forward moves 3 reads + 1 write of x (4n; reads 2 and 3 hit L2 when a wave of
          rows fits it) and the backward 2 x (2 reads of x and dy) + 1 write, then x and dy
          once more: up to 6n + n. Scalar 2-byte accesses keep ~2 KB in flight per warp-row,
          short of the ~20 KB per SM ~3 TB/s needs: expect ~1,000-1,500 GB/s forward (2n
          counted) and a few hundred backward, the column kernel the slowest part.
Still:    x is read three times forward and three times backward; 2-byte loads; the column
          kernel walks x and dy again with little parallelism. Step 2 holds the row in
          registers as 16-byte vectors and sums dweight and dbias per block on the way.
Limits:   none (any row length; 64-bit offsets).
Layout:   rows
*/
#include "norm.cuh"

namespace {

namespace nm = rosetta::norm;
using rosetta::from_float;
using rosetta::to_float;
constexpr int kThreads = 256;  // one row per block

template <typename T>
__global__ void __launch_bounds__(kThreads)
layer_norm_passes(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w, const T* __restrict__ b,
                  T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int64_t cols,
                  float eps) {
  __shared__ float scratch[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // block-uniform: the barriers are safe
    const T* xr = x + row * x_stride;
    T* yr = y + row * cols;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) s += to_float(xr[c]);
    const float m = rosetta::block_reduce<kThreads, rosetta::Sum>(s, scratch) / float(cols);
    float q = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      const float d = to_float(xr[c]) - m;
      q += d * d;
    }
    // A NaN anywhere makes mean and rstd NaN and the whole row NaN, as torch.
    const float r = rsqrtf(rosetta::block_reduce<kThreads, rosetta::Sum>(q, scratch) / float(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += kThreads)
      yr[c] = from_float<T>((to_float(xr[c]) - m) * r * to_float(w[c]) + to_float(b[c]));
    if (threadIdx.x == 0) mean[row] = m, rstd[row] = r;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w: x, dy (and w) read twice.
template <typename T>
__global__ void __launch_bounds__(kThreads)
layer_norm_dx_two_pass(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w,
                       const float* __restrict__ mean, const float* __restrict__ rstd, const T* __restrict__ dy,
                       int64_t dy_stride, T* __restrict__ dx, int64_t rows, int64_t cols) {
  __shared__ float scratch[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_stride;
    const T* gr = dy + row * dy_stride;
    T* o = dx + row * cols;
    const float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      const float g = to_float(gr[c]) * to_float(w[c]);
      sg += g;
      sgx += g * (to_float(xr[c]) - m) * r;
    }
    const float mg = rosetta::block_reduce<kThreads, rosetta::Sum>(sg, scratch) / float(cols);
    const float mgx = rosetta::block_reduce<kThreads, rosetta::Sum>(sgx, scratch) / float(cols);
    for (int64_t c = threadIdx.x; c < cols; c += kThreads)
      o[c] = from_float<T>(r * (to_float(gr[c]) * to_float(w[c]) - mg - (to_float(xr[c]) - m) * r * mgx));
  }
}

// dweight[j] = sum over rows of dy * (x - mean) * rstd, dbias[j] = sum of dy, in row order.
template <typename T>
__global__ void __launch_bounds__(nm::kColumns * nm::kSlices)
layer_norm_dweight_columns(const T* __restrict__ x, int64_t x_stride, const float* __restrict__ mean,
                           const float* __restrict__ rstd, const T* __restrict__ dy, int64_t dy_stride,
                           T* __restrict__ dweight, T* __restrict__ dbias, int64_t rows, int64_t cols) {
  nm::column_sums<2>(
      rows, cols,
      [&](int64_t r, int64_t c, float* acc) {
        const float g = to_float(dy[r * dy_stride + c]);
        acc[0] += g * (to_float(x[r * x_stride + c]) - mean[r]) * rstd[r];
        acc[1] += g;
      },
      [&](int64_t c, const float* total) {
        dweight[c] = from_float<T>(total[0]);
        dbias[c] = from_float<T>(total[1]);
      });
}

}  // namespace

cudaError_t layer_norm_01_two_pass(const rosetta::LayerNormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  return rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    layer_norm_passes<T><<<rosetta::softmax::row_grid(rows), kThreads, 0, stream>>>(
        a.x.ptr<const T>(), a.x.stride[0], a.weight.ptr<const T>(), a.bias.ptr<const T>(), a.y.ptr<T>(),
        a.mean.ptr<float>(), a.rstd.ptr<float>(), rows, cols, float(a.eps));
  });
}

cudaError_t layer_norm_01_two_pass_backward(const rosetta::LayerNormBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (cols == 0) return cudaSuccess;
  if (rows == 0) {  // sums over no rows
    const cudaError_t e = nm::zero(a.dweight, stream);
    return e != cudaSuccess ? e : nm::zero(a.dbias, stream);
  }
  return rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* dy = a.dy.ptr<const T>();
    const float* mean = a.mean.ptr<const float>();
    const float* rstd = a.rstd.ptr<const float>();
    layer_norm_dx_two_pass<T><<<rosetta::softmax::row_grid(rows), kThreads, 0, stream>>>(
        x, a.x.stride[0], a.weight.ptr<const T>(), mean, rstd, dy, a.dy.stride[0], a.dx.ptr<T>(), rows, cols);
    layer_norm_dweight_columns<T><<<nm::column_grid(cols), nm::column_block(), 0, stream>>>(
        x, a.x.stride[0], mean, rstd, dy, a.dy.stride[0], a.dweight.ptr<T>(), a.dbias.ptr<T>(), rows, cols);
  });
}
