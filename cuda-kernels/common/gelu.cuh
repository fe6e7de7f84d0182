// linear_gelu's pieces besides the GEMM (gemm_sm90.cuh), each taught by the step that first uses it:
//   gelu, gelu_grad               the tanh GELU and its derivative in fp32                   step 1
//   bias_gelu_rows                out = gelu(out + bias) in place, a pass over M x N          step 1
//   gelu_backward_rows            dz = dy * gelu'(z + bias) in place + dbias's partial rows   step 1
//   launch_bias_gelu, launch_gelu_backward, matrix, transposed, padded_cols   their host side
// dbias's partial rows are summed by norm.cuh's reduce_partials (a fixed order, no atomics).
#pragma once

#include "gemm_sm90.cuh"
#include "norm.cuh"

namespace rosetta::gelu {

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;

// 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^(-2u)), u = sqrt(2/pi) (z + 0.044715 z^3): one
// ex2 and one reciprocal (MUFU) plus ~6 FMA-pipe ops, where tanhf is ~20 instructions with a
// branch. Relative error a few fp32 ulps (e^(-2u) overflows to inf for z < ~-9: s = 0, exact
// to fp32). No cancellation: 1 + tanh never appears as a difference.
__device__ __forceinline__ float sigmoid_2u(float z) {
  const float u = kSqrt2OverPi * z * fmaf(kCubic, z * z, 1.0f);
  return __fdividef(1.0f, 1.0f + __expf(-2.0f * u));
}

// gelu(z) = 0.5 z (1 + tanh(u)) = z s
__device__ __forceinline__ float gelu(float z) { return z * sigmoid_2u(z); }

// gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) u'(z), with 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s):
// s + 2 z s (1 - s) u', u' = sqrt(2/pi) (1 + 3 * 0.044715 z^2).
__device__ __forceinline__ float gelu_grad(float z) {
  const float s = sigmoid_2u(z);
  const float du = kSqrt2OverPi * fmaf(3.0f * kCubic, z * z, 1.0f);
  return fmaf(2.0f * z * s * (1.0f - s), du, s);
}

// ------------------------------------------------------------------------------------------------
// Host helpers

// A 2-D view of `data` (rows x cols, strides s0, s1 in elements): the GEMM operands the backward
// builds (dz) and the transposed views of a and weight.
inline Tensor matrix(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  Tensor t{};
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.dim = 2;
  t.numel = rows * cols;
  t.size[0] = rows, t.size[1] = cols;
  t.stride[0] = s0, t.stride[1] = s1;
  return t;
}
// x^T: the other major-ness of the same memory (a TMA map reads it in place).
inline Tensor transposed(const Tensor& x) {
  return matrix(x.data, x.dtype, x.size[1], x.size[0], x.stride[1], x.stride[0]);
}
// The backward's dz buffer has rows of N rounded up to 8 elements (16 bytes): it is a TMA operand
// of the da and dweight GEMMs, and TMA needs 16-byte row pitches even where N is odd.
inline int64_t padded_cols(int64_t n) { return (n + 7) / 8 * 8; }

// ------------------------------------------------------------------------------------------------
// The elementwise passes of step 1: a block of 128 threads takes 1,024 columns (8 a thread, one
// 16-byte vector of 16-bit values), blockIdx.y a contiguous chunk of rows; the thread keeps its
// columns' bias (and dbias sums) in registers over the chunk, kBatch rows' loads in flight at once.

constexpr int kThreads = 128, kCols = 8, kBatch = 4;

struct RowChunks {
  dim3 grid;
  int64_t rows;  // per chunk; chunks = grid.y
};
// About 16 blocks an SM in all (2,048 threads: 4 x 16 bytes in flight each, 128 KB an SM).
inline RowChunks plan_rows(int64_t M, int64_t N) {
  const int64_t xs = ceil_div(N, int64_t(kThreads) * kCols);
  const int64_t want = std::min<int64_t>({M, 65535, std::max<int64_t>(1, 16 * sm_count() / xs)});
  const int64_t rows = ceil_div(M, want);
  return {dim3(unsigned(xs), unsigned(ceil_div(M, rows))), rows};
}

template <typename T>
struct Vec8 {
  T v[kCols];
};

// 8 values of T at p (columns n .. n + 7 of a row, p aligned to 16 bytes when kVec) as floats;
// the columns at or past `valid` read as 0; `stride` apart on the scalar path.
template <typename T, bool kVec>
__device__ __forceinline__ void load8(const T* p, int64_t stride, int64_t valid, float (&x)[kCols]) {
  if (kVec) {
    const Vec8<T> v = *reinterpret_cast<const Vec8<T>*>(p);
#pragma unroll
    for (int e = 0; e < kCols; ++e) x[e] = to_float(v.v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < kCols; ++e) x[e] = e < valid ? to_float(p[e * stride]) : 0.0f;
  }
}
template <typename T, bool kVec>
__device__ __forceinline__ void store8(T* p, int64_t valid, const float (&x)[kCols]) {
  if (kVec) {
    Vec8<T> v;
#pragma unroll
    for (int e = 0; e < kCols; ++e) v.v[e] = from_float<T>(x[e]);
    *reinterpret_cast<Vec8<T>*>(p) = v;
  } else {
#pragma unroll
    for (int e = 0; e < kCols; ++e)
      if (e < valid) p[e] = from_float<T>(x[e]);
  }
}

// out (M x N, row stride N) = gelu(out + bias), in place. kVec: N % 8 == 0 and out 16-byte aligned.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) bias_gelu_rows(T* __restrict__ out, const T* __restrict__ bias,
                                                           int64_t M, int64_t N, int64_t chunk) {
  const int64_t n = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kCols;
  if (n >= N) return;
  const int64_t valid = N - n;
  float b[kCols];
  load8<T, false>(bias + n, 1, valid, b);
  const int64_t m_end = M < (int64_t(blockIdx.y) + 1) * chunk ? M : (int64_t(blockIdx.y) + 1) * chunk;
  for (int64_t m = int64_t(blockIdx.y) * chunk; m < m_end; m += kBatch) {
    float x[kBatch][kCols];
#pragma unroll
    for (int r = 0; r < kBatch; ++r)
      if (m + r < m_end) load8<T, kVec>(out + (m + r) * N + n, 1, valid, x[r]);
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      if (m + r >= m_end) continue;
#pragma unroll
      for (int e = 0; e < kCols; ++e) x[r][e] = gelu(x[r][e] + b[e]);
      store8<T, kVec>(out + (m + r) * N + n, valid, x[r]);
    }
  }
}

template <typename T>
cudaError_t launch_bias_gelu(T* out, const T* bias, int64_t M, int64_t N, cudaStream_t stream) {
  if (M == 0 || N == 0) return cudaSuccess;
  const RowChunks plan = plan_rows(M, N);
  const bool vec = N % kCols == 0 && aligned16(out);
  (vec ? bias_gelu_rows<T, true> : bias_gelu_rows<T, false>)<<<plan.grid, kThreads, 0, stream>>>(
      out, bias, M, N, plan.rows);
  return cudaGetLastError();
}

// dz (M x N, row stride ldz: a multiple of 8, 16-byte aligned base) holds z without the bias; in
// place dz = dy * gelu'(z + bias), 0 in the padding columns, and partial[chunk][n] = the chunk's
// fp32 sum of dz over its rows (blockIdx.y = chunk). dy: strides dy_s0, dy_s1 (row- or
// column-major); kVec: dy row-major with 16-byte aligned rows and N % 8 == 0.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    gelu_backward_rows(T* __restrict__ dz, int64_t ldz, const T* __restrict__ dy, int64_t dy_s0, int64_t dy_s1,
                       const T* __restrict__ bias, float* __restrict__ partial, int64_t M, int64_t N,
                       int64_t chunk) {
  const int64_t n = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kCols;
  if (n >= N) return;
  const int64_t valid = N - n;
  float b[kCols], sum[kCols] = {};
  load8<T, false>(bias + n, 1, valid, b);
  const int64_t m_end = M < (int64_t(blockIdx.y) + 1) * chunk ? M : (int64_t(blockIdx.y) + 1) * chunk;
  for (int64_t m = int64_t(blockIdx.y) * chunk; m < m_end; m += kBatch) {
    float z[kBatch][kCols], g[kBatch][kCols];
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      if (m + r >= m_end) continue;
      load8<T, true>(dz + (m + r) * ldz + n, 1, valid, z[r]);  // within the padded row: whole vectors
      load8<T, kVec>(dy + (m + r) * dy_s0 + n * dy_s1, dy_s1, valid, g[r]);
    }
#pragma unroll
    for (int r = 0; r < kBatch; ++r) {
      if (m + r >= m_end) continue;
#pragma unroll
      for (int e = 0; e < kCols; ++e) {
        // padding columns hold whatever the allocation held (NaN, say): zero them, not 0 * NaN
        z[r][e] = e < valid ? g[r][e] * gelu_grad(z[r][e] + b[e]) : 0.0f;
        sum[e] += z[r][e];
      }
      store8<T, true>(dz + (m + r) * ldz + n, kCols, z[r]);
    }
  }
  float* p = partial + int64_t(blockIdx.y) * N + n;
#pragma unroll
  for (int e = 0; e < kCols; ++e)
    if (e < valid) p[e] = sum[e];
}

// `plan` = plan_rows(M, N): partial holds plan.grid.y rows of N.
template <typename T>
cudaError_t launch_gelu_backward(const RowChunks& plan, T* dz, int64_t ldz, const Tensor& dy, const T* bias,
                                 float* partial, int64_t M, int64_t N, cudaStream_t stream) {
  const bool vec = N % kCols == 0 && dy.stride[1] == 1 && dy.stride[0] % kCols == 0 && aligned16(dy.data);
  (vec ? gelu_backward_rows<T, true> : gelu_backward_rows<T, false>)<<<plan.grid, kThreads, 0, stream>>>(
      dz, ldz, dy.ptr<const T>(), dy.stride[0], dy.stride[1], bias, partial, M, N, plan.rows);
  return cudaGetLastError();
}

}  // namespace rosetta::gelu
