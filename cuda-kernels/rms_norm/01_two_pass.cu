/*
Step 1 — two passes over the row, a block per row
Changed:  the baseline. Forward: a 256-thread block per row, one element per thread per access;
          pass 1 sums x^2 (shuffles and rosetta::block_reduce), rstd = 1/sqrt(mean(x^2) + eps)
          goes to the saved fp32 rstd, pass 2 reads x again and writes y = x * rstd * w.
          Backward, two kernels: a block per row for dx (pass 1: the dot of g = dy * w with x;
          pass 2: dx = rstd * (g - x * rstd^2 * dot / N)), then dweight by a column kernel:
          each block takes 32 columns and walks every row for them (norm::column_sums), reading
          x, dy and rstd again: dweight[j] = sum over rows of dy * x * rstd, added in row order
          (the same bits every run: no atomics).
Why:      the forward moves 2 reads + 1 write of x (3n; the second read hits L2 when a wave of
          rows fits it: 1,056 rows of 8 KB do) and the backward 2 x (2 reads of x and dy) + 1
          write, then x and dy once more for dweight: up to 6n + n. Scalar 2-byte accesses keep
          ~2 KB in flight per warp-row, well short of the ~20 KB per SM that ~3 TB/s needs:
          expect ~1,000-1,500 GB/s forward (2n counted) and a few hundred backward, where the
          column kernel, 128 blocks for 4,096 columns, each thread a dependent chain of rows / 8
          loads, is the slowest part.
Still:    x is read twice forward and three times backward; 2-byte loads; the dweight kernel
          walks x and dy a third time with little parallelism. Step 2 holds the row in
          registers as 16-byte vectors and sums dweight per block on the way.
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
rms_norm_two_pass(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w, T* __restrict__ y,
                  float* __restrict__ rstd, int64_t rows, int64_t cols, float eps) {
  __shared__ float scratch[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // block-uniform: the barriers are safe
    const T* xr = x + row * x_stride;
    T* yr = y + row * cols;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      const float v = to_float(xr[c]);
      ss += v * v;
    }
    // A NaN anywhere makes rstd NaN and the whole row NaN, as torch.
    const float r = rsqrtf(rosetta::block_reduce<kThreads, rosetta::Sum>(ss, scratch) / float(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) yr[c] = from_float<T>(to_float(xr[c]) * r * to_float(w[c]));
    if (threadIdx.x == 0) rstd[row] = r;
  }
}

// dx = rstd * (g - x * rstd^2 * mean(g * x)), g = dy * w: x, dy (and w) read twice.
template <typename T>
__global__ void __launch_bounds__(kThreads)
rms_norm_dx_two_pass(const T* __restrict__ x, int64_t x_stride, const T* __restrict__ w,
                     const float* __restrict__ rstd, const T* __restrict__ dy, int64_t dy_stride,
                     T* __restrict__ dx, int64_t rows, int64_t cols) {
  __shared__ float scratch[kThreads / 32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * x_stride;
    const T* gr = dy + row * dy_stride;
    T* o = dx + row * cols;
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) dot += to_float(gr[c]) * to_float(w[c]) * to_float(xr[c]);
    const float r = rstd[row];
    const float k = r * r * rosetta::block_reduce<kThreads, rosetta::Sum>(dot, scratch) / float(cols);
    for (int64_t c = threadIdx.x; c < cols; c += kThreads)
      o[c] = from_float<T>(r * (to_float(gr[c]) * to_float(w[c]) - to_float(xr[c]) * k));
  }
}

// dweight[j] = sum over rows of dy[r, j] * x[r, j] * rstd[r], in row order.
template <typename T>
__global__ void __launch_bounds__(nm::kColumns * nm::kSlices)
rms_norm_dweight_columns(const T* __restrict__ x, int64_t x_stride, const float* __restrict__ rstd,
                         const T* __restrict__ dy, int64_t dy_stride, T* __restrict__ dweight, int64_t rows,
                         int64_t cols) {
  nm::column_sums<1>(
      rows, cols,
      [&](int64_t r, int64_t c, float* acc) {
        acc[0] += to_float(dy[r * dy_stride + c]) * to_float(x[r * x_stride + c]) * rstd[r];
      },
      [&](int64_t c, const float* total) { dweight[c] = from_float<T>(total[0]); });
}

}  // namespace

cudaError_t rms_norm_01_two_pass(const rosetta::RmsNormArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  return rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_two_pass<T><<<rosetta::softmax::row_grid(rows), kThreads, 0, stream>>>(
        a.x.ptr<const T>(), a.x.stride[0], a.weight.ptr<const T>(), a.y.ptr<T>(), a.rstd.ptr<float>(), rows, cols,
        float(a.eps));
  });
}

cudaError_t rms_norm_01_two_pass_backward(const rosetta::RmsNormBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (cols == 0) return cudaSuccess;
  if (rows == 0) return nm::zero(a.dweight, stream);  // a sum over no rows
  return rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.x.ptr<const T>();
    const T* dy = a.dy.ptr<const T>();
    const float* rstd = a.rstd.ptr<const float>();
    rms_norm_dx_two_pass<T><<<rosetta::softmax::row_grid(rows), kThreads, 0, stream>>>(
        x, a.x.stride[0], a.weight.ptr<const T>(), rstd, dy, a.dy.stride[0], a.dx.ptr<T>(), rows, cols);
    rms_norm_dweight_columns<T><<<nm::column_grid(cols), nm::column_block(), 0, stream>>>(
        x, a.x.stride[0], rstd, dy, a.dy.stride[0], a.dweight.ptr<T>(), rows, cols);
  });
}
