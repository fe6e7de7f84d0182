/*
Step 1 — the formula as written: one thread per row, three walks over it
Changed:  the starting point. Thread r owns row r and walks it three times: the max, the sum of
          exp(x - max), then out = exp(x - max) / sum. The backward walks twice: the dot
          sum(y * dy), then dx = y * (dy - dot). fp32 math, one element per load.
Why:      it shows the two things every later step buys back. Parallelism: 4,096 rows are 4,096
          threads, 32 blocks of 128, so 32 of 132 SMs hold one block each (4 warps): ~3% of the
          machine's warp slots. Coalescing: at every load the 32 lanes of a warp read 32
          addresses a row apart (cols * 4 bytes for fp32), so one load instruction touches 32
          different 128-byte lines; L1 keeps each line for the next 31 fp32 columns of its
          lane only while the warps' 32 lines x 4 warps (16 KB) fit, and every new line costs a
          full DRAM latency with nothing else in flight on the SM. Traffic: 3 reads + 1 write
          (4n bytes, twice the minimal 2n), most of it from DRAM since 4,096 rows of 16 KB
          (64 MB) evict each other from the 50 MB L2 between passes.
Still:    one thread does a whole row's work serially. Step 2 gives each row a block of 256
          threads, whose neighbouring threads read neighbouring elements.
Limits:   none (any row length; 64-bit offsets).
Layout:   rows
*/
#include "rosetta.cuh"

namespace {

constexpr int kThreads = 128;  // rows per block

template <typename T>
__global__ void __launch_bounds__(kThreads)
softmax_thread_per_row(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t rows, int64_t cols) {
  const int64_t row = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (row >= rows) return;
  const T* in = x + row * x_stride;  // neighbouring threads: x_stride elements apart
  T* o = out + row * cols;
  float m = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, rosetta::to_float(in[c]));  // fmaxf skips NaN: the sum catches it
  // Subtracting the max keeps exp <= 1 (rows of 1e30 stay finite). A +inf, NaN or all -inf row
  // makes some x - m NaN, so the sum and every output are NaN, as in torch.
  float sum = 0.0f, lost = 0.0f;  // Kahan: one fp32 chain over 262,144 terms drifted 1.2e-4
  for (int64_t c = 0; c < cols; ++c) {
    const float term = __expf(rosetta::to_float(in[c]) - m) - lost;
    const float next = sum + term;
    lost = (next - sum) - term;  // what this add rounded away, subtracted from the next term
    sum = next;
  }
  const float inv = 1.0f / sum;
  for (int64_t c = 0; c < cols; ++c) o[c] = rosetta::from_float<T>(__expf(rosetta::to_float(in[c]) - m) * inv);
}

// dx = y * (dy - sum(y * dy))
template <typename T>
__global__ void __launch_bounds__(kThreads)
backward_thread_per_row(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                        T* __restrict__ dx, int64_t rows, int64_t cols) {
  const int64_t row = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (row >= rows) return;
  const T* yr = y + row * y_stride;
  const T* gr = dy + row * dy_stride;
  T* o = dx + row * cols;
  float dot = 0.0f, lost = 0.0f;  // Kahan, as in the forward sum
  for (int64_t c = 0; c < cols; ++c) {
    const float term = rosetta::to_float(yr[c]) * rosetta::to_float(gr[c]) - lost;
    const float next = dot + term;
    lost = isfinite(next) ? (next - dot) - term : 0.0f;  // an infinite dy: inf - inf would be NaN
    dot = next;
  }
  for (int64_t c = 0; c < cols; ++c)
    o[c] = rosetta::from_float<T>(rosetta::to_float(yr[c]) * (rosetta::to_float(gr[c]) - dot));
}

}  // namespace

cudaError_t softmax_01_thread_per_row(const rosetta::SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to write
  return rosetta::dispatch_dtype(a.x.dtype, [&](auto tag) {
    using T = decltype(tag);
    softmax_thread_per_row<T><<<unsigned(rosetta::ceil_div(rows, kThreads)), kThreads, 0, stream>>>(
        a.x.ptr<const T>(), a.x.stride[0], a.out.ptr<T>(), rows, cols);
  });
}

cudaError_t softmax_01_thread_per_row_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.y.size[0], cols = a.y.size[1];
  if (rows == 0 || cols == 0) return cudaSuccess;
  return rosetta::dispatch_dtype(a.y.dtype, [&](auto tag) {
    using T = decltype(tag);
    backward_thread_per_row<T><<<unsigned(rosetta::ceil_div(rows, kThreads)), kThreads, 0, stream>>>(
        a.y.ptr<const T>(), a.y.stride[0], a.dy.ptr<const T>(), a.dy.stride[0], a.dx.ptr<T>(), rows, cols);
  });
}
