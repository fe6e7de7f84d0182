/*
Step 5 — the row stays on chip: registers for short rows, shared memory for long ones
Changed:  the row is read once, kept on the SM while its max and sum are reduced, and written
          from there; the path is chosen by row length (OneFlow's softmax does the same):
            cols <= 1,024      a warp per row (4 rows per 128-thread block), each lane holding
                               4-32 fp32 values in registers: shuffles only, no barrier
                               (fp32 rows of 513-1,024: a small block per row measured faster).
            cols <= 16,384     a block per row (256 or 512 threads), <= 32 values per thread
                               in registers (compile-time tiles: 2K, 4K, 8K, 16K elements).
            row <= ~226 KB     a 512-thread block per row, the row in dynamic shared memory
                               (opt-in up to 227 KB per block): each thread stores 8 16-byte
                               vectors at a time (128 B in flight per thread), folding them
                               into step 4's online (max, sum) pair on the way in.
            longer             step 4's online kernel: 2 reads + 1 write.
          All tiles load every vector before using any; where every row starts on 16 bytes and
          cols is a multiple of the vector width (the host checks), the register tiles run an
          instantiation with one predicated 16-byte load per vector and no branch, and the
          backward issues all of y's and dy's loads before converting any. Backward: y and dy
          both stay on chip (registers, or shared memory up to ~226 KB for the two): 2 reads +
          1 write.
Why:      2 reads + 1 write (3n) -> 1 read + 1 write (2n), the minimum: up to 3/2 faster where
          the second read came from DRAM, and for short rows it removes the L2 re-read that
          held step 4 below the DRAM ceiling. Bytes in flight: fp32 4096 x 4096 runs 256-thread
          blocks with 16 values a thread (~40 registers: 6 blocks x 16 KB = 96 KB per SM, far
          past the ~20 KB needed); 4096 x 1024 fits the whole problem in one wave of warps.
Still:    rows longer than one SM's shared memory (bf16 4096 x 131072: 256 KB; fp32 4096 x
          262144: 1 MB) drop to the two-read online kernel, ~2,000 GB/s at best; and a
          226 KB row leaves one block per SM whose load and write phases do not overlap.
          Step 6 spreads such a row over a thread-block cluster.
Limits:   none: rows past ~226 KB (fp32 > ~57K elements, 16-bit > ~115K; backward half that)
          take step 4's kernels (2 reads + 1 write; backward 4 reads + 1 write).
Layout:   rows
*/
#include "softmax.cuh"

namespace {

namespace sm = rosetta::softmax;
using rosetta::Vec16;

constexpr int kSmemThreads = 512;
constexpr int kBatch = 8;          // 16-byte vectors in flight per thread (forward)
constexpr int kBatchBackward = 3;  // per tensor: y and dy (4 spills at 64 registers)

// The row in shared memory as 16-byte vectors of T (the last one padded with -inf). Thread t
// stores vectors t, t + 512, ... and later reads back exactly those: no barrier is needed
// between the load loop and the write loop, nor before the next row overwrites them.
template <typename T>
__global__ void __launch_bounds__(kSmemThreads, 2)
softmax_row_in_smem(const T* __restrict__ x, int64_t x_stride, T* __restrict__ out, int64_t rows, int cols) {
  constexpr int V = sm::kVec<T>;
  extern __shared__ uint4 row_smem[];  // ceil(cols / V) vectors
  __shared__ sm::Online scratch[kSmemThreads / 32];
  const int vecs = (cols + V - 1) / V;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // block-uniform: barriers inside
    const T* in = x + row * x_stride;
    T* o = out + row * cols;
    const bool vin = rosetta::aligned16(in), vout = rosetta::aligned16(o);
    sm::Online t = sm::Online::empty();
    for (int i0 = threadIdx.x; i0 < vecs; i0 += kBatch * kSmemThreads) {
      Vec16<T> v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {  // all loads issue before the first store
        const int i = i0 + b * kSmemThreads;
        if (i < vecs) v[b] = sm::load_vec(in, int64_t(i) * V, cols, vin, -INFINITY);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (i0 + b * kSmemThreads < vecs) {
          row_smem[i0 + b * kSmemThreads] = v[b].raw;
          t.add(v[b]);
        }
    }
    const sm::Online r = sm::block_merge<kSmemThreads>(t, scratch);
    const float inv = 1.0f / r.d;
    for (int i = threadIdx.x; i < vecs; i += kSmemThreads) {
      Vec16<T> v{row_smem[i]};
#pragma unroll
      for (int k = 0; k < V; ++k) v.set(k, __expf(v.get(k) - r.m) * inv);  // r.m = -inf: NaN, as torch
      sm::store_vec(o, int64_t(i) * V, cols, vout, v);
    }
  }
}

// y in vectors [0, vecs), dy in [vecs, 2 vecs) of shared memory; the same ownership as above.
template <typename T>
__global__ void __launch_bounds__(kSmemThreads, 2)
backward_row_in_smem(const T* __restrict__ y, int64_t y_stride, const T* __restrict__ dy, int64_t dy_stride,
                     T* __restrict__ dx, int64_t rows, int cols) {
  constexpr int V = sm::kVec<T>;
  extern __shared__ uint4 row_smem[];  // 2 x ceil(cols / V) vectors
  __shared__ float scratch[kSmemThreads / 32];
  const int vecs = (cols + V - 1) / V;
  uint4* const y_smem = row_smem;
  uint4* const dy_smem = row_smem + vecs;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* yr = y + row * y_stride;
    const T* gr = dy + row * dy_stride;
    T* o = dx + row * cols;
    const bool vy = rosetta::aligned16(yr), vg = rosetta::aligned16(gr), vo = rosetta::aligned16(o);
    float dot = 0.0f;
    for (int i0 = threadIdx.x; i0 < vecs; i0 += kBatchBackward * kSmemThreads) {
      Vec16<T> a[kBatchBackward], b[kBatchBackward];
#pragma unroll
      for (int u = 0; u < kBatchBackward; ++u) {
        const int i = i0 + u * kSmemThreads;
        if (i < vecs) {
          a[u] = sm::load_vec(yr, int64_t(i) * V, cols, vy, 0.0f);  // 0 past the end: 0 * 0 adds nothing
          b[u] = sm::load_vec(gr, int64_t(i) * V, cols, vg, 0.0f);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatchBackward; ++u) {
        const int i = i0 + u * kSmemThreads;
        if (i < vecs) {
          y_smem[i] = a[u].raw;
          dy_smem[i] = b[u].raw;
#pragma unroll
          for (int k = 0; k < V; ++k) dot += a[u].get(k) * b[u].get(k);
        }
      }
    }
    dot = rosetta::block_reduce<kSmemThreads, rosetta::Sum>(dot, scratch);
    for (int i = threadIdx.x; i < vecs; i += kSmemThreads) {
      const Vec16<T> a{y_smem[i]}, b{dy_smem[i]};
      Vec16<T> r;
#pragma unroll
      for (int k = 0; k < V; ++k) r.set(k, a.get(k) * (b.get(k) - dot));
      sm::store_vec(o, int64_t(i) * V, cols, vo, r);
    }
  }
}

// Bytes of shared memory for `tensors` rows of cols elements held as whole 16-byte vectors.
template <typename T>
int64_t smem_bytes(int64_t cols, int tensors) {
  return tensors * rosetta::ceil_div(cols, sm::kVec<T>) * 16;
}

}  // namespace

cudaError_t softmax_05_row_on_chip(const rosetta::SoftmaxArgs& a, cudaStream_t stream) {
  const int64_t rows = a.x.size[0], cols = a.x.size[1];
  return sm::launch_forward(a, stream, [&](auto tag, auto x, int64_t xs, auto out) {
    using T = decltype(tag);
    const int64_t bytes = smem_bytes<T>(cols, 1);
    if (bytes > sm::max_dynamic_smem()) {
      sm::launch_online(x, xs, out, rows, cols, stream);  // too long for one SM: 2 reads + 1 write
      return cudaSuccess;
    }
    const cudaError_t status =
        cudaFuncSetAttribute(softmax_row_in_smem<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (status == cudaSuccess)
      softmax_row_in_smem<T><<<sm::row_grid(rows), kSmemThreads, bytes, stream>>>(x, xs, out, rows, int(cols));
    return status;
  });
}

cudaError_t softmax_05_row_on_chip_backward(const rosetta::SoftmaxBackwardArgs& a, cudaStream_t stream) {
  const int64_t rows = a.y.size[0], cols = a.y.size[1];
  return sm::launch_backward(a, stream, [&](auto tag, auto y, int64_t ys, auto dy, int64_t gs, auto dx) {
    using T = decltype(tag);
    const int64_t bytes = smem_bytes<T>(cols, 2);
    if (bytes > sm::max_dynamic_smem()) {
      sm::launch_dot_backward(y, ys, dy, gs, dx, rows, cols, stream);  // too long: 4 reads + 1 write
      return cudaSuccess;
    }
    const cudaError_t status =
        cudaFuncSetAttribute(backward_row_in_smem<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
    if (status == cudaSuccess)
      backward_row_in_smem<T><<<sm::row_grid(rows), kSmemThreads, bytes, stream>>>(y, ys, dy, gs, dx, rows,
                                                                                   int(cols));
    return status;
  });
}
